#include "dayzero/serve/openai/completion_response.h"

#include <utility>

#include "dayzero/runtime/utf8_stream.h"

namespace dz::serve::openai {
namespace {

nlohmann::json frame(const ResponseContext& context, nlohmann::json choices) {
  return {{"id", context.id},
          {"object", "text_completion"},
          {"created", context.created},
          {"model", context.model},
          {"choices", std::move(choices)}};
}

}  // namespace

nlohmann::json completion_logprobs_json(std::span<const runtime::SampleResult> samples,
                                        const runtime::TokenBytesFn& token_bytes,
                                        int64_t first_text_offset) {
  nlohmann::json tokens = nlohmann::json::array();
  nlohmann::json token_logprobs = nlohmann::json::array();
  nlohmann::json top_logprobs = nlohmann::json::array();
  nlohmann::json text_offset = nlohmann::json::array();
  int64_t offset = first_text_offset;
  for (const runtime::SampleResult& sample : samples) {
    TokenText text = token_text(token_bytes, sample.token);
    nlohmann::json top = nlohmann::json::object();
    for (const runtime::TokenLogprob& candidate : sample.top_logprobs) {
      std::string key = token_text(token_bytes, candidate.token).text;
      if (!top.contains(key)) top[key] = json_logprob(candidate.logprob);
    }
    if (!top.contains(text.text)) top[text.text] = json_logprob(sample.logprob);
    text_offset.push_back(offset);
    // Offsets advance by the token's bytes as text: the completion is their concatenation.
    offset += num_code_points(text.bytes);
    tokens.push_back(std::move(text.text));
    token_logprobs.push_back(json_logprob(sample.logprob));
    top_logprobs.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(token_logprobs)},
          {"top_logprobs", std::move(top_logprobs)},
          {"text_offset", std::move(text_offset)}};
}

nlohmann::json completion_json(const ResponseContext& context,
                               std::span<const CompletionChoice> choices, const Usage& usage) {
  nlohmann::json out_choices = nlohmann::json::array();
  for (const CompletionChoice& choice : choices) {
    out_choices.push_back({{"index", choice.index},
                           {"text", runtime::replace_invalid_utf8(choice.text)},
                           {"logprobs", choice.logprobs ? completion_logprobs_json(
                                                              *choice.logprobs, context.token_bytes,
                                                              choice.text_offset)
                                                        : nlohmann::json(nullptr)},
                           {"finish_reason", choice.finish_reason}});
  }
  nlohmann::json body = frame(context, std::move(out_choices));
  body["usage"] = usage_json(usage);
  return body;
}

nlohmann::json completion_chunk(const ResponseContext& context, uint32_t index,
                                std::string_view text,
                                std::optional<std::span<const runtime::SampleResult>> logprobs,
                                int64_t first_text_offset, std::string_view finish_reason,
                                const Usage& so_far) {
  nlohmann::json choice = {
      {"index", index},
      {"text", runtime::replace_invalid_utf8(text)},
      {"logprobs", logprobs
                       ? completion_logprobs_json(*logprobs, context.token_bytes, first_text_offset)
                       : nlohmann::json(nullptr)},
      {"finish_reason",
       finish_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(finish_reason)}};
  nlohmann::json chunk = frame(context, nlohmann::json::array({std::move(choice)}));
  add_chunk_usage(chunk, context.stream_options, so_far);
  return chunk;
}

nlohmann::json completion_usage_chunk(const ResponseContext& context, const Usage& usage) {
  nlohmann::json chunk = frame(context, nlohmann::json::array());
  chunk["usage"] = usage_json(usage);
  return chunk;
}

}  // namespace dz::serve::openai
