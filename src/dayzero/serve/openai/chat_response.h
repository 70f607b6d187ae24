#pragma once
// Chat completion bodies and stream chunks, in OpenAI's shapes (docs/serving.md §5.2–§5.3).
//
// A stream for n choices is, per choice: chat_role_chunk, chat_delta_chunk for each piece of
// text, chat_finish_chunk; then chat_usage_chunk only with stream_options.include_usage; then
// sse_done(). Each chunk goes out as sse_event(chunk).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/runtime/sampler.h"
#include "dayzero/serve/openai/response_common.h"

namespace dz::serve::openai {

struct ChatChoice {
  uint32_t index = 0;
  std::optional<std::string> content = {};  // null when the turn is only tool calls
  std::optional<std::string> reasoning_content = {};
  nlohmann::json tool_calls =
      {};  // [{"id","type":"function","function":{"name","arguments"}}]; null
  // The generated tokens with their log-probs when the request asked for logprobs; nullopt
  // gives "logprobs": null.
  std::optional<std::vector<runtime::SampleResult>> logprobs = {};
  std::string finish_reason = {};  // "stop" | "length" | "tool_calls"
};

// {"id","object":"chat.completion","created","model","choices":[{"index","message":{"role":
// "assistant","content",...},"logprobs","finish_reason"}],"usage"}
nlohmann::json chat_completion_json(const ResponseContext& context,
                                    std::span<const ChatChoice> choices, const Usage& usage);

// {"content":[{"token","logprob","bytes":[...],"top_logprobs":[{"token","logprob","bytes"}]}]}
nlohmann::json chat_logprobs_json(std::span<const runtime::SampleResult> samples,
                                  const runtime::TokenBytesFn& token_bytes);

// What one chunk adds to a choice. Absent parts are left out of the delta.
struct ChatDelta {
  std::optional<std::string> content = {};
  std::optional<std::string> reasoning_content = {};
  nlohmann::json tool_calls = {};  // tool-call deltas; null when none
  // The tokens behind this delta; "logprobs" is null unless with_logprobs.
  bool with_logprobs = false;
  std::span<const runtime::SampleResult> samples = {};
};

// so_far: the running usage, used only with stream_options.continuous_usage_stats.
// First chunk of a choice: delta {"role":"assistant","content":""}.
nlohmann::json chat_role_chunk(const ResponseContext& context, uint32_t index,
                               const Usage& so_far = {});
nlohmann::json chat_delta_chunk(const ResponseContext& context, uint32_t index,
                                const ChatDelta& delta, const Usage& so_far = {});
// Last chunk of a choice: an empty delta and the finish_reason.
nlohmann::json chat_finish_chunk(const ResponseContext& context, uint32_t index,
                                 std::string_view finish_reason, const Usage& so_far = {});
// After every choice finished, with include_usage: "choices": [] and the totals.
nlohmann::json chat_usage_chunk(const ResponseContext& context, const Usage& usage);

}  // namespace dz::serve::openai
