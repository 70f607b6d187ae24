#include "dayzero/serve/openai/completion_response.h"

#include <gtest/gtest.h>

namespace dz::serve::openai {
namespace completion_response_test {

using nlohmann::json;

std::optional<std::string> test_token_bytes(int32_t token) {
  switch (token) {
    case 1:
      return "Hello";
    case 2:
      return " w\xc3\xb6rld";  // 7 bytes, 6 code points
    case 3:
      return "!";
    case 5:
      return "Hello";  // same text as token 1
    default:
      return std::nullopt;
  }
}

ResponseContext test_context(StreamOptions options = {}) {
  return {.id = "cmpl-abc",
          .created = 1700000001,
          .model = "tiny",
          .stream_options = options,
          .token_bytes = test_token_bytes};
}

TEST(CompletionResponse, NonStreamingBody) {
  const CompletionChoice choices[] = {
      {.index = 0, .text = "Hello w\xc3\xb6rld", .finish_reason = "length"},
      {.index = 1, .text = "!", .finish_reason = "stop"},
  };
  EXPECT_EQ(completion_json(test_context(), choices,
                            {.prompt_tokens = 3, .completion_tokens = 3, .cached_tokens = 0}),
            json::parse(R"({
      "id": "cmpl-abc", "object": "text_completion", "created": 1700000001, "model": "tiny",
      "choices": [
        {"index": 0, "text": "Hello w\u00f6rld", "logprobs": null, "finish_reason": "length"},
        {"index": 1, "text": "!", "logprobs": null, "finish_reason": "stop"}],
      "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6,
                "prompt_tokens_details": {"cached_tokens": 0}}})"));
}

TEST(CompletionResponse, LogprobsInOpenAiShape) {
  const std::vector<runtime::SampleResult> samples = {
      // Token 1 sampled, among the top: k entries.
      {.token = 1, .logprob = -0.5f, .top_logprobs = {{1, -0.5f}, {2, -1.5f}}},
      // Token 2 sampled outside the top 1: k + 1 entries.
      {.token = 2, .logprob = -3.0f, .top_logprobs = {{3, -0.25f}}},
      // Tokens 1 and 5 share a text: one key, the first (most likely) wins.
      {.token = 3, .logprob = -1.0f, .top_logprobs = {{5, -0.75f}, {1, -0.875f}}},
  };
  // echo: 5 code points of prompt text come first.
  EXPECT_EQ(completion_logprobs_json(samples, test_token_bytes, 5), json::parse(R"({
      "tokens": ["Hello", " w\u00f6rld", "!"],
      "token_logprobs": [-0.5, -3.0, -1.0],
      "top_logprobs": [{"Hello": -0.5, " w\u00f6rld": -1.5},
                       {"!": -0.25, " w\u00f6rld": -3.0},
                       {"Hello": -0.75, "!": -1.0}],
      "text_offset": [5, 10, 16]})"));

  const CompletionChoice choice = {.index = 0,
                                   .text = "abcdeHello w\xc3\xb6rld!",
                                   .logprobs = samples,
                                   .text_offset = 5,
                                   .finish_reason = "stop"};
  EXPECT_EQ(completion_json(test_context(), {&choice, 1}, {})["choices"][0]["logprobs"],
            completion_logprobs_json(samples, test_token_bytes, 5));
}

TEST(CompletionResponse, StreamChunks) {
  const ResponseContext context = test_context();
  EXPECT_EQ(completion_chunk(context, 1, "Hello", std::nullopt, 0, ""), json::parse(R"({
      "id": "cmpl-abc", "object": "text_completion", "created": 1700000001, "model": "tiny",
      "choices": [{"index": 1, "text": "Hello", "logprobs": null, "finish_reason": null}]})"));
  EXPECT_EQ(completion_chunk(context, 1, "", std::nullopt, 0, "stop")["choices"][0],
            json::parse(R"({"index": 1, "text": "", "logprobs": null, "finish_reason": "stop"})"));
  const std::vector<runtime::SampleResult> samples = {
      {.token = 3, .logprob = -0.125f, .top_logprobs = {}}};
  EXPECT_EQ(completion_chunk(context, 0, "!", std::span(samples), 11, "")["choices"][0]["logprobs"],
            json::parse(R"({"tokens": ["!"], "token_logprobs": [-0.125],
                "top_logprobs": [{"!": -0.125}], "text_offset": [11]})"));
}

TEST(CompletionResponse, StreamUsage) {
  const ResponseContext plain = test_context();
  EXPECT_FALSE(completion_chunk(plain, 0, "x", std::nullopt, 0, "").contains("usage"));
  const ResponseContext usage = test_context({.include_usage = true});
  EXPECT_EQ(completion_chunk(usage, 0, "x", std::nullopt, 0, "")["usage"], nullptr);
  EXPECT_EQ(completion_usage_chunk(
                usage, {.prompt_tokens = 2, .completion_tokens = 1, .cached_tokens = 1}),
            json::parse(R"({"id": "cmpl-abc", "object": "text_completion",
                "created": 1700000001, "model": "tiny", "choices": [],
                "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3,
                          "prompt_tokens_details": {"cached_tokens": 1}}})"));
  const ResponseContext continuous =
      test_context({.include_usage = true, .continuous_usage_stats = true});
  const Usage so_far = {.prompt_tokens = 2, .completion_tokens = 1};
  EXPECT_EQ(completion_chunk(continuous, 0, "x", std::nullopt, 0, "", so_far)["usage"],
            usage_json(so_far));
}

}  // namespace completion_response_test
}  // namespace dz::serve::openai
