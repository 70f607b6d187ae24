#pragma once
// Completions bodies and stream chunks, in OpenAI's shapes (docs/serving.md §5.2–§5.3).
//
// A stream is completion_chunk per piece of text of any choice, each choice's last one carrying
// its finish_reason; then completion_usage_chunk only with stream_options.include_usage; then
// sse_done(). Choice indices run prompt_index * n + choice.

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

struct CompletionChoice {
  uint32_t index = 0;
  std::string text = {};  // with the prompt text in front when echo was asked
  // The generated tokens when logprobs was asked; nullopt gives "logprobs": null.
  std::optional<std::vector<runtime::SampleResult>> logprobs = {};
  // Code points of `text` before the first generated token (the echoed prompt), where
  // text_offset starts.
  int64_t text_offset = 0;
  std::string finish_reason = {};  // "stop" | "length"
};

// {"id","object":"text_completion","created","model","choices":[{"index","text","logprobs",
// "finish_reason"}],"usage"}
nlohmann::json completion_json(const ResponseContext& context,
                               std::span<const CompletionChoice> choices, const Usage& usage);

// {"tokens":[...],"token_logprobs":[...],"top_logprobs":[{token: logprob, ...}],"text_offset":
// [...]}. The sampled token is always in its top_logprobs map (as vLLM), which may then hold k+1
// entries; tokens whose text coincides share one key. text_offset counts code points from
// first_text_offset.
nlohmann::json completion_logprobs_json(std::span<const runtime::SampleResult> samples,
                                        const runtime::TokenBytesFn& token_bytes,
                                        int64_t first_text_offset);

// One chunk of choice `index`: `text` (may be empty), its tokens' logprobs when `logprobs` is
// set (text_offset starting at first_text_offset), and finish_reason ("" gives null).
// so_far: the running usage, used only with stream_options.continuous_usage_stats.
nlohmann::json completion_chunk(const ResponseContext& context, uint32_t index,
                                std::string_view text,
                                std::optional<std::span<const runtime::SampleResult>> logprobs,
                                int64_t first_text_offset, std::string_view finish_reason,
                                const Usage& so_far = {});
// After every choice finished, with include_usage: "choices": [] and the totals.
nlohmann::json completion_usage_chunk(const ResponseContext& context, const Usage& usage);

}  // namespace dz::serve::openai
