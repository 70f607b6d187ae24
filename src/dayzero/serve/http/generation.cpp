#include "dayzero/serve/http/generation.h"

#include <fmt/format.h>

#include "dayzero/runtime/stop_strings.h"

namespace dz::serve::http {

using openai::ApiError;

std::string finish_reason_of(const runtime::RequestOutput& output) {
  if (!output.error.ok()) return "error";
  if (output.aborted) return "abort";
  return std::string(runtime::finish_reason_name(output.finish_reason));
}

GenerationRun::~GenerationRun() {
  for (ChoiceState& choice : choices_) {
    if (choice.finished || !choice.stream) continue;
    model_.engine->cancel(choice.stream->id());
    metrics_.on_cancelled();
  }
  metrics_.on_run_closed();
}

std::optional<ApiError> GenerationRun::submit(const std::vector<PromptInput>& prompts,
                                              const openai::SamplingFields& fields) {
  const Clock::time_point arrival = Clock::now();
  for (size_t p = 0; p < prompts.size(); ++p) {
    runtime::GenerationRequest request;
    request.prompt_token_ids = prompts[p].token_ids;
    request.images = prompts[p].images;
    request.sampling = fields.sampling;
    request.max_tokens = prompts[p].max_tokens;
    request.priority = fields.priority;
    request.cache_salt = fields.cache_salt;
    Result<std::vector<std::shared_ptr<runtime::RequestStream>>> streams =
        model_.engine->submit_choices(std::move(request), fields.n);
    if (!streams.ok()) {
      // Whatever was submitted is cancelled by the destructor, not counted as a departed client:
      // forget it here.
      for (ChoiceState& choice : choices_) {
        model_.engine->cancel(choice.stream->id());
        choice.finished = true;
      }
      if (streams.status().code() == StatusCode::kResourceExhausted) {
        metrics_.on_rejected("queue_full");
        return overloaded(streams.status());
      }
      metrics_.on_rejected("invalid_request");
      return ApiError::from_status(streams.status());
    }
    for (size_t c = 0; c < streams->size(); ++c) {
      ChoiceState choice;
      choice.index = static_cast<uint32_t>(p * streams->size() + c);
      choice.prompt_index = p;
      choice.stream = std::move((*streams)[c]);
      choice.timer = RequestTimer(arrival);
      choices_.push_back(std::move(choice));
    }
  }
  return std::nullopt;
}

ApiError GenerationRun::overloaded(const Status& status) {
  retry_after_s_ = metrics_.retry_after_seconds(model_.engine->metrics().num_waiting);
  return ApiError::overloaded(fmt::format("The server is overloaded: {}. Retry after {} s.",
                                          status.message(), retry_after_s_));
}

void GenerationRun::fold(ChoiceState& choice, const runtime::RequestOutput& output) {
  const Clock::time_point now = Clock::now();
  choice.text += output.new_text;
  choice.samples.insert(choice.samples.end(), output.new_samples.begin(), output.new_samples.end());
  metrics_.on_output(choice.timer, output, now);
  choice.last.request_id = output.request_id;
  choice.last.num_prompt_tokens = output.num_prompt_tokens;
  choice.last.num_cached_tokens = output.num_cached_tokens;
  choice.last.num_output_tokens = output.num_output_tokens;
  choice.last.num_preemptions = output.num_preemptions;
  if (output.finished) {
    choice.finished = true;
    choice.last.finished = true;
    choice.last.finish_reason = output.finish_reason;
    choice.last.aborted = output.aborted;
    choice.last.error = output.error;
    const std::string reason = finish_reason_of(output);
    if (reason != "error") metrics_.on_finished(choice.timer, choice.last, reason, now);
    // A full pool or queue found after submit is still an overload, not an engine failure.
    if (!failure_ && !output.error.ok())
      failure_ = output.error.code() == StatusCode::kResourceExhausted
                     ? overloaded(output.error)
                     : ApiError::internal(fmt::format("The engine failed this request: {}",
                                                      output.error.to_string()));
  }
}

std::vector<ChoiceEvent> GenerationRun::poll(std::chrono::milliseconds timeout) {
  std::vector<ChoiceEvent> events;
  auto drain = [&](size_t i, std::chrono::milliseconds wait) {
    ChoiceState& choice = choices_[i];
    while (!choice.finished) {
      std::optional<runtime::RequestOutput> output = choice.stream->next(wait);
      if (!output) return;
      wait = std::chrono::milliseconds(0);
      fold(choice, *output);
      events.push_back({i, std::move(*output)});
    }
  };
  for (size_t i = 0; i < choices_.size(); ++i) drain(i, std::chrono::milliseconds(0));
  if (!events.empty() || finished()) return events;
  // Nothing yet: block on one unfinished choice. With several choices, wait in short slices so
  // none waits long behind another.
  const auto slice =
      choices_.size() == 1 ? timeout : std::min(timeout, std::chrono::milliseconds(20));
  const Clock::time_point deadline = Clock::now() + timeout;
  while (events.empty() && !finished()) {
    for (size_t i = 0; i < choices_.size() && events.empty(); ++i) {
      if (choices_[i].finished) continue;
      drain(i, slice);
    }
    if (Clock::now() >= deadline) break;
  }
  for (size_t i = 0; i < choices_.size(); ++i) drain(i, std::chrono::milliseconds(0));
  return events;
}

bool GenerationRun::finished() const {
  for (const ChoiceState& choice : choices_)
    if (!choice.finished) return false;
  return true;
}

std::optional<ApiError> GenerationRun::error() const {
  if (failure_) return failure_;
  for (const ChoiceState& choice : choices_)
    if (choice.last.aborted)
      return ApiError::service_unavailable("The request was aborted (the server is stopping).");
  return std::nullopt;
}

openai::Usage GenerationRun::usage() const {
  openai::Usage usage;
  size_t previous_prompt = SIZE_MAX;
  for (const ChoiceState& choice : choices_) {
    if (choice.prompt_index != previous_prompt) {
      usage.prompt_tokens += choice.last.num_prompt_tokens;
      usage.cached_tokens += choice.last.num_cached_tokens;
      previous_prompt = choice.prompt_index;
    }
    usage.completion_tokens += choice.last.num_output_tokens;
  }
  return usage;
}

}  // namespace dz::serve::http
