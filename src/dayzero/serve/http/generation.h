#pragma once
// One HTTP request's generation: each prompt submitted to the engine with its n choices (one
// stream each, choice_index 0..n-1 on one seed, the prompt computed once), their outputs gathered
// as they arrive, metrics
// recorded, and everything still running cancelled when the run is dropped early (the client
// left, the server stops, a sibling failed).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dayzero/runtime/engine.h"
#include "dayzero/serve/http/server_metrics.h"
#include "dayzero/serve/http/serving_model.h"
#include "dayzero/serve/openai/api_error.h"
#include "dayzero/serve/openai/response_common.h"
#include "dayzero/serve/openai/sampling_fields.h"

namespace dz::serve::http {

struct PromptInput {
  std::vector<int32_t> token_ids;
  std::vector<runtime::PromptImage> images;  // chat: over placeholder tokens of token_ids
  int64_t max_tokens = 16;
  std::string text;  // the prompt as text (completions' echo)
};

struct ChoiceState {
  uint32_t index = 0;  // OpenAI's choice index: prompt_index * n + choice
  size_t prompt_index = 0;
  std::shared_ptr<runtime::RequestStream> stream;
  RequestTimer timer{Clock::now()};
  std::string text;                            // generated so far
  std::vector<runtime::SampleResult> samples;  // with logprobs, when asked
  runtime::RequestOutput last;                 // counters of the latest output
  bool finished = false;
};

// An output of choice `choice` (a position in choices()), already folded into its state.
struct ChoiceEvent {
  size_t choice = 0;
  runtime::RequestOutput output;
};

class GenerationRun {
 public:
  GenerationRun(ServingModel& model, ServerMetrics& metrics) : model_(model), metrics_(metrics) {
    metrics_.on_run_opened();
  }
  // Cancels every unfinished choice (counted in requests_cancelled_total).
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  // Submits prompts × fields.n requests. A refusal (queue full: 503 with retry_after_s set; an
  // invalid request: 400) cancels whatever was already submitted.
  std::optional<openai::ApiError> submit(const std::vector<PromptInput>& prompts,
                                         const openai::SamplingFields& fields);
  // Seconds for Retry-After once submit() or error() answered 503 server_overloaded; else 0.
  int retry_after_s() const { return retry_after_s_; }

  // Outputs that arrived, waiting up to `timeout` when none has.
  std::vector<ChoiceEvent> poll(std::chrono::milliseconds timeout);
  bool finished() const;
  // The first failure among the choices, in the order they arrived: 503 server_overloaded
  // (retry_after_s set) for kResourceExhausted, else 500; then 503 for an aborted choice.
  std::optional<openai::ApiError> error() const;

  std::vector<ChoiceState>& choices() { return choices_; }
  // prompt_tokens and cached_tokens count each prompt once (its first choice); completion_tokens
  // every choice.
  openai::Usage usage() const;

 private:
  void fold(ChoiceState& choice, const runtime::RequestOutput& output);
  // 503 server_overloaded for `status`, with retry_after_s_ computed now.
  openai::ApiError overloaded(const Status& status);

  ServingModel& model_;
  ServerMetrics& metrics_;
  std::vector<ChoiceState> choices_;
  std::optional<openai::ApiError> failure_;  // the first choice that failed
  int retry_after_s_ = 0;
};

// "stop" / "length" of a finished output; "abort" for a cancelled one; "error" for a failure.
std::string finish_reason_of(const runtime::RequestOutput& output);

}  // namespace dz::serve::http
