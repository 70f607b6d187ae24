#pragma once
// The request fields chat and completions share (docs/serving.md §3 and §5.2): model, streaming,
// the sampling table, stop conditions, n, priority and cache salt. Each endpoint's parser reads
// these with read_sampling_fields, adds its own fields (logprobs differ), then calls
// validate_sampling_fields, which also runs runtime::validate_sampling_params.

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "dayzero/runtime/sampler.h"
#include "dayzero/serve/openai/api_error.h"

namespace dz::serve::openai {

// Bounds on one request, beyond the body size (which the server checks before parsing).
struct ParseLimits {
  int64_t max_messages = 1024;          // chat messages
  int64_t max_tools = 128;              // chat tool definitions
  int64_t max_prompts = 1024;           // completions: entries of a prompt list
  int32_t max_n = 16;                   // choices per request
  int64_t max_stop_strings = 16;        // entries of `stop`
  int64_t max_stop_string_bytes = 256;  // each stop string
  int64_t max_stop_token_ids = 1024;
  int64_t max_logit_bias = 1024;        // entries of `logit_bias`
  int32_t max_completion_logprobs = 5;  // completions `logprobs` (OpenAI's cap; ≤ 20)
  int max_json_depth = 64;              // nesting of the body (tool schemas, kwargs)
  int64_t vocab_size = 0;  // > 0: token ids (logit_bias, stop_token_ids, prompts) are checked
};

// Read whatever `stream` says; only a streaming response uses them.
struct StreamOptions {
  bool include_usage = false;           // "usage": null on each chunk, then one usage chunk
  bool continuous_usage_stats = false;  // vLLM: the running usage on every chunk (with the above)
};

struct SamplingFields {
  std::string model = {};  // required
  bool stream = false;
  StreamOptions stream_options = {};
  // temperature … include_stop_str_in_output. Unset fields keep OpenAI's defaults (temperature
  // 1, top_p 1, the rest off); the *_set flags tell the server which ones it may replace with the
  // checkpoint's generation_config.json defaults.
  runtime::SamplingParams sampling = {.temperature = 1.0f};
  bool temperature_set = false;  // the server applies generation_config.json defaults otherwise
  bool top_p_set = false;
  bool top_k_set = false;
  bool min_p_set = false;
  bool repetition_penalty_set = false;
  std::optional<uint64_t> seed =
      {};  // absent: drawn by the server at arrival (also in sampling.seed)
  // max_completion_tokens wins over max_tokens (OpenAI's newer name); absent: the endpoint's
  // default (the rest of the context for chat, 16 for completions).
  std::optional<int64_t> max_tokens = {};
  int32_t n = 1;
  bool skip_special_tokens = true;
  int32_t priority = 0;
  std::string cache_salt = {};
};

// Reads the shared fields of the request object `body` into `out`. nullopt when all are well.
std::optional<ApiError> read_sampling_fields(const nlohmann::json& body, const ParseLimits& limits,
                                             SamplingFields& out);

// Cross-field checks (min_tokens ≤ max_tokens) and runtime::validate_sampling_params with
// limits.vocab_size; the error names the field its message starts with.
std::optional<ApiError> validate_sampling_fields(const SamplingFields& fields,
                                                 const ParseLimits& limits);

}  // namespace dz::serve::openai
