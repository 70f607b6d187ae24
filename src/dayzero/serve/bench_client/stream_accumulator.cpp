#include "dayzero/serve/bench_client/stream_accumulator.h"

#include <utility>

#include <nlohmann/json.hpp>

namespace dz::serve {
namespace {

// The generated text of choices[0] (empty if none), for either endpoint. Chat models that think
// stream `reasoning_content` (vLLM) or `reasoning` before `content`; both are generated tokens.
std::string choice_text(const nlohmann::json& choice, ApiKind kind) {
  std::string text;
  auto append = [&](const nlohmann::json& object, const char* key) {
    auto it = object.find(key);
    if (it != object.end() && it->is_string()) text += it->get_ref<const std::string&>();
  };
  if (kind == ApiKind::kCompletions) {
    append(choice, "text");
  } else {
    auto delta = choice.find("delta");
    if (delta != choice.end() && delta->is_object()) {
      append(*delta, "reasoning_content");
      append(*delta, "reasoning");
      append(*delta, "content");
    }
  }
  return text;
}

int64_t int_field(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

}  // namespace

void StreamAccumulator::on_event(const SseEvent& event, Clock::time_point now) {
  if (failed()) return;
  if (event.data == "[DONE]") {
    done_ = true;
    return;
  }
  if (event.event == "error") {
    error_ = "error event: " + event.data;
    return;
  }
  nlohmann::json chunk = nlohmann::json::parse(event.data, nullptr, /*allow_exceptions=*/false);
  if (chunk.is_discarded() || !chunk.is_object()) {
    error_ = "malformed stream chunk: " + event.data.substr(0, 200);
    return;
  }
  if (auto it = chunk.find("error"); it != chunk.end() && !it->is_null()) {
    const nlohmann::json& e = *it;
    error_ = "error chunk: " + (e.is_object() && e.contains("message") && e["message"].is_string()
                                    ? e["message"].get<std::string>()
                                    : e.dump());
    return;
  }
  auto choices = chunk.find("choices");
  if (choices != chunk.end() && choices->is_array() && !choices->empty()) {
    std::string text = choice_text((*choices)[0], kind_);
    if (!text.empty()) {
      if (!has_content_) {
        partial_.ttft_s = seconds_since_sent(now);
      } else {
        partial_.itl_s.push_back(std::chrono::duration<double>(now - last_content_).count());
      }
      has_content_ = true;
      last_content_ = now;
      ++partial_.num_content_chunks;
      partial_.generated_text += text;
    }
    has_choice_ = true;
    last_choice_ = now;
  }
  auto usage = chunk.find("usage");
  if (usage != chunk.end() && usage->is_object()) {
    if (int64_t n = int_field(*usage, "completion_tokens"); n >= 0)
      partial_.usage_output_tokens = n;
    if (int64_t n = int_field(*usage, "prompt_tokens"); n >= 0) partial_.prompt_len = n;
    auto details = usage->find("prompt_tokens_details");
    if (details != usage->end() && details->is_object())
      partial_.cached_tokens = int_field(*details, "cached_tokens");
  }
}

void StreamAccumulator::fail(std::string error) {
  if (error_.empty()) error_ = std::move(error);
}

void StreamAccumulator::finish(RequestResult& out) {
  if (error_.empty() && !has_content_) error_ = "the stream carried no generated text";
  if (error_.empty() && !done_) error_ = "the stream ended without data: [DONE]";
  out.success = error_.empty();
  out.error = error_;
  out.ttft_s = partial_.ttft_s;
  out.itl_s = std::move(partial_.itl_s);
  out.latency_s = has_choice_ ? seconds_since_sent(last_choice_) : 0.0;
  out.generated_text = std::move(partial_.generated_text);
  out.num_content_chunks = partial_.num_content_chunks;
  if (partial_.prompt_len > 0) out.prompt_len = partial_.prompt_len;
  out.cached_tokens = partial_.cached_tokens;
  out.usage_output_tokens = partial_.usage_output_tokens;
}

}  // namespace dz::serve
