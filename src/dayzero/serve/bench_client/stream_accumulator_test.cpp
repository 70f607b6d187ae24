#include "dayzero/serve/bench_client/stream_accumulator.h"

#include <chrono>
#include <string>

#include <gtest/gtest.h>

namespace dz::serve {
namespace stream_accumulator_test {

using Clock = StreamAccumulator::Clock;
using std::chrono::milliseconds;

SseEvent data(std::string d) {
  return SseEvent{.event = "", .data = std::move(d)};
}

const Clock::time_point kSent = Clock::time_point{} + std::chrono::hours(1);
Clock::time_point at(int ms) {
  return kSent + milliseconds(ms);
}

TEST(StreamAccumulator, CompletionsTimings) {
  StreamAccumulator s(ApiKind::kCompletions, kSent);
  s.on_event(data(R"({"choices":[{"index":0,"text":"He"}]})"), at(100));
  s.on_event(data(R"({"choices":[{"index":0,"text":""}]})"), at(120));  // no text: no ITL
  s.on_event(data(R"({"choices":[{"index":0,"text":"ll"}]})"), at(150));
  s.on_event(data(R"({"choices":[{"index":0,"text":"o"}]})"), at(210));
  s.on_event(data(R"({"choices":[{"index":0,"text":"","finish_reason":"length"}]})"), at(220));
  s.on_event(data(R"({"choices":[],"usage":{"prompt_tokens":16,"completion_tokens":4,)"
                  R"("prompt_tokens_details":{"cached_tokens":8}}})"),
             at(230));
  s.on_event(data("[DONE]"), at(231));
  RequestResult r;
  r.prompt_len = 15;  // the dataset's; usage overrides it
  s.finish(r);
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_DOUBLE_EQ(r.ttft_s, 0.100);
  ASSERT_EQ(r.itl_s.size(), 2u);
  EXPECT_NEAR(r.itl_s[0], 0.050, 1e-12);
  EXPECT_NEAR(r.itl_s[1], 0.060, 1e-12);
  EXPECT_NEAR(r.latency_s, 0.220, 1e-12);  // the finish chunk, not the usage chunk
  EXPECT_EQ(r.generated_text, "Hello");
  EXPECT_EQ(r.num_content_chunks, 3);
  EXPECT_EQ(r.prompt_len, 16);
  EXPECT_EQ(r.usage_output_tokens, 4);
  EXPECT_EQ(r.cached_tokens, 8);
  EXPECT_EQ(output_tokens(r), 4);
}

TEST(StreamAccumulator, ChatRoleDeltaIsNotTheFirstToken) {
  StreamAccumulator s(ApiKind::kChatCompletions, kSent);
  s.on_event(data(R"({"choices":[{"delta":{"role":"assistant","content":""}}]})"), at(5));
  s.on_event(data(R"({"choices":[{"delta":{"reasoning_content":"hm"}}]})"), at(40));
  s.on_event(data(R"({"choices":[{"delta":{"content":"Hi"}}]})"), at(70));
  s.on_event(data(R"({"choices":[{"delta":{},"finish_reason":"stop"}]})"), at(75));
  s.on_event(data("[DONE]"), at(80));
  RequestResult r;
  s.finish(r);
  ASSERT_TRUE(r.success) << r.error;
  EXPECT_NEAR(r.ttft_s, 0.040, 1e-12);
  ASSERT_EQ(r.itl_s.size(), 1u);
  EXPECT_NEAR(r.itl_s[0], 0.030, 1e-12);
  EXPECT_NEAR(r.latency_s, 0.075, 1e-12);
  EXPECT_EQ(r.generated_text, "hmHi");
  EXPECT_EQ(r.usage_output_tokens, -1);
  EXPECT_EQ(output_tokens(r), 1);  // neither usage nor a tokenizer: vLLM's fallback
}

TEST(StreamAccumulator, ErrorChunkFails) {
  StreamAccumulator s(ApiKind::kCompletions, kSent);
  s.on_event(data(R"({"choices":[{"text":"a"}]})"), at(10));
  s.on_event(data(R"({"error":{"message":"engine overloaded","type":"x","code":503}})"), at(20));
  s.on_event(data(R"({"choices":[{"text":"b"}]})"), at(30));  // ignored after the error
  s.on_event(data("[DONE]"), at(40));
  RequestResult r;
  s.finish(r);
  EXPECT_FALSE(r.success);
  EXPECT_EQ(r.error, "error chunk: engine overloaded");
  EXPECT_EQ(r.generated_text, "a");
}

TEST(StreamAccumulator, ErrorEventFails) {
  StreamAccumulator s(ApiKind::kCompletions, kSent);
  s.on_event(SseEvent{.event = "error", .data = "bad things"}, at(10));
  RequestResult r;
  s.finish(r);
  EXPECT_FALSE(r.success);
  EXPECT_EQ(r.error, "error event: bad things");
}

TEST(StreamAccumulator, MalformedChunkFails) {
  StreamAccumulator s(ApiKind::kCompletions, kSent);
  s.on_event(data(R"({"choices":[{"text":"a"}]})"), at(10));
  s.on_event(data(R"({"choices":[{"te)"), at(20));
  s.on_event(data("[DONE]"), at(40));
  RequestResult r;
  s.finish(r);
  EXPECT_FALSE(r.success);
  EXPECT_EQ(r.error, R"(malformed stream chunk: {"choices":[{"te)");
}

TEST(StreamAccumulator, MissingDoneOrTextFails) {
  {
    StreamAccumulator s(ApiKind::kCompletions, kSent);
    s.on_event(data(R"({"choices":[{"text":"a"}]})"), at(10));
    RequestResult r;
    s.finish(r);
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.error, "the stream ended without data: [DONE]");
  }
  {
    StreamAccumulator s(ApiKind::kCompletions, kSent);
    s.on_event(data(R"({"choices":[{"text":"","finish_reason":"stop"}]})"), at(10));
    s.on_event(data("[DONE]"), at(11));
    RequestResult r;
    s.finish(r);
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.error, "the stream carried no generated text");
  }
  {
    StreamAccumulator s(ApiKind::kCompletions, kSent);
    s.on_event(data(R"({"choices":[{"text":"a"}]})"), at(10));
    s.fail("timed out");
    s.fail("second reason is dropped");
    RequestResult r;
    s.finish(r);
    EXPECT_FALSE(r.success);
    EXPECT_EQ(r.error, "timed out");
  }
}

}  // namespace stream_accumulator_test
}  // namespace dz::serve
