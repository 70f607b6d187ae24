#include "dayzero/serve/openai/chat_response.h"

#include <utility>

#include "dayzero/runtime/utf8_stream.h"

namespace dz::serve::openai {
namespace {

nlohmann::json byte_list(std::string_view bytes) {
  nlohmann::json list = nlohmann::json::array();
  for (char c : bytes) list.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return list;
}

nlohmann::json token_entry(const runtime::TokenBytesFn& token_bytes, int32_t token, float logprob) {
  TokenText text = token_text(token_bytes, token);
  return {{"token", std::move(text.text)},
          {"logprob", json_logprob(logprob)},
          {"bytes", byte_list(text.bytes)}};
}

nlohmann::json chunk_frame(const ResponseContext& context, nlohmann::json choices) {
  return {{"id", context.id},
          {"object", "chat.completion.chunk"},
          {"created", context.created},
          {"model", context.model},
          {"choices", std::move(choices)}};
}

nlohmann::json chunk_choice(uint32_t index, nlohmann::json delta, nlohmann::json logprobs,
                            nlohmann::json finish_reason) {
  return {{"index", index},
          {"delta", std::move(delta)},
          {"logprobs", std::move(logprobs)},
          {"finish_reason", std::move(finish_reason)}};
}

// Generated text should already be valid UTF-8 (runtime::Utf8Stream); this keeps a stray byte
// from making the body unserialisable.
std::string clean(const std::string& text) {
  return runtime::replace_invalid_utf8(text);
}

}  // namespace

nlohmann::json chat_logprobs_json(std::span<const runtime::SampleResult> samples,
                                  const runtime::TokenBytesFn& token_bytes) {
  nlohmann::json content = nlohmann::json::array();
  for (const runtime::SampleResult& sample : samples) {
    nlohmann::json entry = token_entry(token_bytes, sample.token, sample.logprob);
    nlohmann::json top = nlohmann::json::array();
    for (const runtime::TokenLogprob& candidate : sample.top_logprobs)
      top.push_back(token_entry(token_bytes, candidate.token, candidate.logprob));
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return {{"content", std::move(content)}};
}

nlohmann::json chat_completion_json(const ResponseContext& context,
                                    std::span<const ChatChoice> choices, const Usage& usage) {
  nlohmann::json out_choices = nlohmann::json::array();
  for (const ChatChoice& choice : choices) {
    nlohmann::json message = {{"role", "assistant"}, {"content", nullptr}};
    if (choice.content) message["content"] = clean(*choice.content);
    if (choice.reasoning_content) message["reasoning_content"] = clean(*choice.reasoning_content);
    if (!choice.tool_calls.is_null()) message["tool_calls"] = choice.tool_calls;
    out_choices.push_back(
        {{"index", choice.index},
         {"message", std::move(message)},
         {"logprobs", choice.logprobs ? chat_logprobs_json(*choice.logprobs, context.token_bytes)
                                      : nlohmann::json(nullptr)},
         {"finish_reason", choice.finish_reason}});
  }
  return {
      {"id", context.id},       {"object", "chat.completion"},       {"created", context.created},
      {"model", context.model}, {"choices", std::move(out_choices)}, {"usage", usage_json(usage)}};
}

nlohmann::json chat_role_chunk(const ResponseContext& context, uint32_t index,
                               const Usage& so_far) {
  nlohmann::json chunk = chunk_frame(
      context, nlohmann::json::array({chunk_choice(index, {{"role", "assistant"}, {"content", ""}},
                                                   nullptr, nullptr)}));
  add_chunk_usage(chunk, context.stream_options, so_far);
  return chunk;
}

nlohmann::json chat_delta_chunk(const ResponseContext& context, uint32_t index,
                                const ChatDelta& delta, const Usage& so_far) {
  nlohmann::json fields = nlohmann::json::object();
  if (delta.content) fields["content"] = clean(*delta.content);
  if (delta.reasoning_content) fields["reasoning_content"] = clean(*delta.reasoning_content);
  if (!delta.tool_calls.is_null()) fields["tool_calls"] = delta.tool_calls;
  nlohmann::json logprobs = delta.with_logprobs
                                ? chat_logprobs_json(delta.samples, context.token_bytes)
                                : nlohmann::json(nullptr);
  nlohmann::json chunk = chunk_frame(
      context, nlohmann::json::array(
                   {chunk_choice(index, std::move(fields), std::move(logprobs), nullptr)}));
  add_chunk_usage(chunk, context.stream_options, so_far);
  return chunk;
}

nlohmann::json chat_finish_chunk(const ResponseContext& context, uint32_t index,
                                 std::string_view finish_reason, const Usage& so_far) {
  nlohmann::json chunk = chunk_frame(
      context, nlohmann::json::array({chunk_choice(index, nlohmann::json::object(), nullptr,
                                                   std::string(finish_reason))}));
  add_chunk_usage(chunk, context.stream_options, so_far);
  return chunk;
}

nlohmann::json chat_usage_chunk(const ResponseContext& context, const Usage& usage) {
  nlohmann::json chunk = chunk_frame(context, nlohmann::json::array());
  chunk["usage"] = usage_json(usage);
  return chunk;
}

}  // namespace dz::serve::openai
