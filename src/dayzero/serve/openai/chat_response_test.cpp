#include "dayzero/serve/openai/chat_response.h"

#include <gtest/gtest.h>

#include <limits>

namespace dz::serve::openai {
namespace chat_response_test {

using nlohmann::json;

// "€" is E2 82 AC: token 3 holds its first two bytes, token 4 the last.
std::optional<std::string> test_token_bytes(int32_t token) {
  switch (token) {
    case 1:
      return "Hello";
    case 2:
      return " world";
    case 3:
      return std::string("\xe2\x82");
    case 4:
      return std::string("\xac");
    default:
      return std::nullopt;
  }
}

ResponseContext test_context(StreamOptions options = {}) {
  return {.id = "chatcmpl-abc",
          .created = 1700000000,
          .model = "tiny",
          .stream_options = options,
          .token_bytes = test_token_bytes};
}

TEST(ChatResponse, NonStreamingBody) {
  const ChatChoice choices[] = {
      {.index = 0, .content = "Hello world", .finish_reason = "stop"},
      {.index = 1, .content = "Hello", .reasoning_content = "think", .finish_reason = "length"},
  };
  const json body = chat_completion_json(
      test_context(), choices, {.prompt_tokens = 9, .completion_tokens = 3, .cached_tokens = 4});
  EXPECT_EQ(body, json::parse(R"({
      "id": "chatcmpl-abc", "object": "chat.completion", "created": 1700000000, "model": "tiny",
      "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello world"},
         "logprobs": null, "finish_reason": "stop"},
        {"index": 1, "message": {"role": "assistant", "content": "Hello",
                                 "reasoning_content": "think"},
         "logprobs": null, "finish_reason": "length"}],
      "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
                "prompt_tokens_details": {"cached_tokens": 4}}})"));
}

TEST(ChatResponse, ToolCallsWithNullContent) {
  const json calls = json::parse(R"([{"id": "call_1", "type": "function",
      "function": {"name": "f", "arguments": "{}"}}])");
  const ChatChoice choice = {.index = 0, .tool_calls = calls, .finish_reason = "tool_calls"};
  const json body = chat_completion_json(test_context(), {&choice, 1}, {});
  EXPECT_EQ(body["choices"][0]["message"],
            json({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", calls}}));
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
}

TEST(ChatResponse, LogprobsInOpenAiShape) {
  const std::vector<runtime::SampleResult> samples = {
      {.token = 1, .logprob = -0.5f, .top_logprobs = {{1, -0.5f}, {2, -1.25f}}},
      {.token = 3, .logprob = -std::numeric_limits<float>::infinity(), .top_logprobs = {}},
      {.token = 99, .logprob = -2.0f, .top_logprobs = {}},
  };
  EXPECT_EQ(chat_logprobs_json(samples, test_token_bytes), json::parse(R"({"content": [
      {"token": "Hello", "logprob": -0.5, "bytes": [72, 101, 108, 108, 111],
       "top_logprobs": [
         {"token": "Hello", "logprob": -0.5, "bytes": [72, 101, 108, 108, 111]},
         {"token": " world", "logprob": -1.25, "bytes": [32, 119, 111, 114, 108, 100]}]},
      {"token": "\ufffd", "logprob": -9999.0, "bytes": [226, 130], "top_logprobs": []},
      {"token": "", "logprob": -2.0, "bytes": [], "top_logprobs": []}]})"));

  const ChatChoice choice = {
      .index = 0, .content = "Hello", .logprobs = samples, .finish_reason = "stop"};
  const json body = chat_completion_json(test_context(), {&choice, 1}, {});
  EXPECT_EQ(body["choices"][0]["logprobs"], chat_logprobs_json(samples, test_token_bytes));
}

TEST(ChatResponse, StreamWithoutUsageHasNoUsageKey) {
  const ResponseContext context = test_context();
  const std::vector<json> chunks = {
      chat_role_chunk(context, 0),
      chat_delta_chunk(context, 0, {.content = "Hello"}),
      chat_delta_chunk(context, 0, {.content = " world"}),
      chat_finish_chunk(context, 0, "stop"),
  };
  const json frame = {{"id", "chatcmpl-abc"},
                      {"object", "chat.completion.chunk"},
                      {"created", 1700000000},
                      {"model", "tiny"}};
  auto with_choice = [&](json choice) {
    json chunk = frame;
    chunk["choices"] = json::array({std::move(choice)});
    return chunk;
  };
  EXPECT_EQ(chunks[0], with_choice(json::parse(R"({"index": 0, "delta": {"role": "assistant",
      "content": ""}, "logprobs": null, "finish_reason": null})")));
  EXPECT_EQ(chunks[1], with_choice(json::parse(R"({"index": 0, "delta": {"content": "Hello"},
      "logprobs": null, "finish_reason": null})")));
  EXPECT_EQ(chunks[2]["choices"][0]["delta"], json({{"content", " world"}}));
  EXPECT_EQ(chunks[3], with_choice(json::parse(R"({"index": 0, "delta": {},
      "logprobs": null, "finish_reason": "stop"})")));
  for (const json& chunk : chunks) EXPECT_FALSE(chunk.contains("usage"));

  std::string stream;
  for (const json& chunk : chunks) stream += sse_event(chunk);
  stream += sse_done();
  EXPECT_EQ(stream.substr(0, 6), "data: ");
  EXPECT_EQ(stream.substr(stream.size() - 14), "data: [DONE]\n\n");
  EXPECT_EQ(sse_event(chunks[1]), "data: " + chunks[1].dump() + "\n\n");
}

TEST(ChatResponse, StreamWithIncludeUsage) {
  const ResponseContext context = test_context({.include_usage = true});
  EXPECT_EQ(chat_role_chunk(context, 0)["usage"], nullptr);
  EXPECT_TRUE(chat_role_chunk(context, 0).contains("usage"));
  EXPECT_EQ(chat_delta_chunk(context, 0, {.content = "x"})["usage"], nullptr);
  EXPECT_EQ(chat_finish_chunk(context, 0, "length")["usage"], nullptr);
  EXPECT_EQ(chat_usage_chunk(context, {.prompt_tokens = 5, .completion_tokens = 2}),
            json::parse(R"({"id": "chatcmpl-abc", "object": "chat.completion.chunk",
                "created": 1700000000, "model": "tiny", "choices": [],
                "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                          "prompt_tokens_details": {"cached_tokens": 0}}})"));
}

TEST(ChatResponse, WholeStreamWithUsageAsSseText) {
  const ResponseContext context = test_context({.include_usage = true});
  std::string stream = sse_event(chat_role_chunk(context, 0));
  stream += sse_event(chat_delta_chunk(context, 0, {.content = "Hi"}));
  stream += sse_event(chat_finish_chunk(context, 0, "stop"));
  stream += sse_event(chat_usage_chunk(context, {.prompt_tokens = 3, .completion_tokens = 1}));
  stream += sse_done();
  // nlohmann::json keeps object keys sorted.
  const std::string frame =
      R"("created":1700000000,"id":"chatcmpl-abc","model":"tiny","object":"chat.completion.chunk")";
  EXPECT_EQ(stream,
            R"(data: {"choices":[{"delta":{"content":"","role":"assistant"},"finish_reason":null,)"
            R"("index":0,"logprobs":null}],)" +
                frame + R"(,"usage":null})" + "\n\n" +
                R"(data: {"choices":[{"delta":{"content":"Hi"},"finish_reason":null,"index":0,)"
                R"("logprobs":null}],)" +
                frame + R"(,"usage":null})" + "\n\n" +
                R"(data: {"choices":[{"delta":{},"finish_reason":"stop","index":0,)"
                R"("logprobs":null}],)" +
                frame + R"(,"usage":null})" + "\n\n" + R"(data: {"choices":[],)" + frame +
                R"(,"usage":{"completion_tokens":1,"prompt_tokens":3,)"
                R"("prompt_tokens_details":{"cached_tokens":0},"total_tokens":4}})" +
                "\n\ndata: [DONE]\n\n");
}

TEST(ChatResponse, ContinuousUsageStatsOnEveryChunk) {
  const ResponseContext context =
      test_context({.include_usage = true, .continuous_usage_stats = true});
  const Usage so_far = {.prompt_tokens = 5, .completion_tokens = 1};
  EXPECT_EQ(chat_delta_chunk(context, 0, {.content = "x"}, so_far)["usage"], usage_json(so_far));
  // continuous_usage_stats alone asks for nothing (vLLM needs include_usage too).
  const ResponseContext alone = test_context({.continuous_usage_stats = true});
  EXPECT_FALSE(chat_delta_chunk(alone, 0, {.content = "x"}, so_far).contains("usage"));
}

TEST(ChatResponse, DeltaWithLogprobsReasoningAndToolCalls) {
  const std::vector<runtime::SampleResult> samples = {
      {.token = 2, .logprob = -0.25f, .top_logprobs = {}}};
  const json calls = json::parse(R"([{"index": 0, "function": {"arguments": "{\"a\""}}])");
  const json chunk = chat_delta_chunk(
      test_context(), 2,
      {.reasoning_content = "r", .tool_calls = calls, .with_logprobs = true, .samples = samples});
  EXPECT_EQ(chunk["choices"][0], json::parse(R"({"index": 2,
      "delta": {"reasoning_content": "r",
                "tool_calls": [{"index": 0, "function": {"arguments": "{\"a\""}}]},
      "logprobs": {"content": [{"token": " world", "logprob": -0.25,
                                "bytes": [32, 119, 111, 114, 108, 100], "top_logprobs": []}]},
      "finish_reason": null})"));
}

TEST(ChatResponse, InvalidUtf8TextIsReplacedNotThrown) {
  const json chunk = chat_delta_chunk(test_context(), 0, {.content = std::string("a\xff")});
  EXPECT_EQ(chunk["choices"][0]["delta"]["content"], "a\xef\xbf\xbd");
  EXPECT_NO_THROW(sse_event(chunk));
}

}  // namespace chat_response_test
}  // namespace dz::serve::openai
