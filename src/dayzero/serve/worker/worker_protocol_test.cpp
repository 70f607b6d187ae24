#include "dayzero/serve/worker/worker_protocol.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include <gtest/gtest.h>

namespace dz::serve::worker {
namespace worker_protocol_test {

// Every field set to a value that is not its default, so a field a codec forgets shows.
runtime::GenerationRequest full_request() {
  runtime::GenerationRequest r;
  r.prompt_token_ids = {5, 6, 7};
  r.images.push_back(
      {.offset = 1,
       .num_tokens = 2,
       .hash = {.lo = 0x0123456789abcdefull, .hi = ~0ull},
       .data = std::make_shared<const std::string>(std::string("\x89PNG\0\xff", 6))});
  runtime::SamplingParams& p = r.sampling;
  p.temperature = 0.7f;
  p.top_p = 0.9f;
  p.top_k = 40;
  p.min_p = 0.05f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = -0.25f;
  p.logit_bias = {{3, 1.5f}, {9, -100.0f}};
  p.seed = 0xfedcba9876543210ull;
  p.min_tokens = 4;
  p.stop_token_ids = {11, 12};
  p.ignore_eos = true;
  p.logprobs = true;
  p.top_logprobs = 5;
  p.stop = {"\n\n", "é"};
  p.include_stop_str_in_output = true;
  r.max_tokens = 99;
  r.priority = -3;
  r.cache_salt = "tenant";
  r.choice_index = 2;
  r.return_logits = true;
  r.return_prompt_logits = true;
  r.forced_output_token_ids = {1, 2};
  r.return_mtp_logits = true;
  r.resumed_output_token_ids = {8, 9, 10};
  return r;
}

TEST(WorkerProtocol, RequestsRoundTripEveryField) {
  const runtime::GenerationRequest a = full_request();
  Result<runtime::GenerationRequest> b = decode_request(encode_request(a));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->prompt_token_ids, a.prompt_token_ids);
  ASSERT_EQ(b->images.size(), 1u);
  EXPECT_EQ(b->images[0].offset, a.images[0].offset);
  EXPECT_EQ(b->images[0].num_tokens, a.images[0].num_tokens);
  EXPECT_EQ(b->images[0].hash, a.images[0].hash);
  ASSERT_TRUE(b->images[0].data);
  EXPECT_EQ(*b->images[0].data, *a.images[0].data);
  const runtime::SamplingParams &p = a.sampling, &q = b->sampling;
  EXPECT_EQ(q.temperature, p.temperature);
  EXPECT_EQ(q.top_p, p.top_p);
  EXPECT_EQ(q.top_k, p.top_k);
  EXPECT_EQ(q.min_p, p.min_p);
  EXPECT_EQ(q.repetition_penalty, p.repetition_penalty);
  EXPECT_EQ(q.presence_penalty, p.presence_penalty);
  EXPECT_EQ(q.frequency_penalty, p.frequency_penalty);
  EXPECT_EQ(q.logit_bias, p.logit_bias);
  EXPECT_EQ(q.seed, p.seed);
  EXPECT_EQ(q.min_tokens, p.min_tokens);
  EXPECT_EQ(q.stop_token_ids, p.stop_token_ids);
  EXPECT_EQ(q.ignore_eos, p.ignore_eos);
  EXPECT_EQ(q.logprobs, p.logprobs);
  EXPECT_EQ(q.top_logprobs, p.top_logprobs);
  EXPECT_EQ(q.stop, p.stop);
  EXPECT_EQ(q.include_stop_str_in_output, p.include_stop_str_in_output);
  EXPECT_EQ(b->max_tokens, a.max_tokens);
  EXPECT_EQ(b->priority, a.priority);
  EXPECT_EQ(b->cache_salt, a.cache_salt);
  EXPECT_EQ(b->choice_index, a.choice_index);
  EXPECT_EQ(b->return_logits, a.return_logits);
  EXPECT_EQ(b->return_prompt_logits, a.return_prompt_logits);
  EXPECT_EQ(b->forced_output_token_ids, a.forced_output_token_ids);
  EXPECT_EQ(b->return_mtp_logits, a.return_mtp_logits);
  EXPECT_EQ(b->resumed_output_token_ids, a.resumed_output_token_ids);
  // A field missing is corrupt, not a default.
  nlohmann::json broken = encode_request(a);
  broken["sampling"].erase("seed");
  EXPECT_EQ(decode_request(broken).status().code(), StatusCode::kCorrupt);
  nlohmann::json bad_image = encode_request(a);
  bad_image["images"][0]["data"] = "not base64!";
  const Status status = decode_request(bad_image).status();
  EXPECT_EQ(status.code(), StatusCode::kCorrupt);
  EXPECT_NE(status.message().find("not base64"), std::string::npos) << status.to_string();
}

TEST(WorkerProtocol, OutputsRoundTripEveryFieldAndInfiniteLogprobs) {
  runtime::RequestOutput a;
  a.request_id = 77;
  a.new_token_ids = {4, 5};
  a.new_samples = {
      {.token = 4, .logprob = -0.125f, .top_logprobs = {{4, -0.125f}, {8, -3.0f}}},
      {.token = 5, .logprob = -std::numeric_limits<float>::infinity(), .top_logprobs = {}}};
  a.new_logits = {{0.5f, -1.0f}, {2.0f, 3.0f}};
  a.new_prompt_logits = {0.25f, 0.75f};
  a.new_mtp_logits = {-0.5f};
  a.new_text = "h\xc3\xa9";
  a.finished = true;
  a.finish_reason = runtime::FinishReason::kLength;
  a.aborted = true;
  a.error = Status(StatusCode::kInternal, "bad state");
  a.num_prompt_tokens = 12;
  a.num_cached_tokens = 8;
  a.num_output_tokens = 2;
  a.num_preemptions = 1;
  a.first_scheduled = std::chrono::steady_clock::now();
  Result<runtime::RequestOutput> b = decode_output(encode_output(a));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(b->request_id, a.request_id);
  EXPECT_EQ(b->new_token_ids, a.new_token_ids);
  ASSERT_EQ(b->new_samples.size(), 2u);
  EXPECT_EQ(b->new_samples[0].token, 4);
  EXPECT_EQ(b->new_samples[0].logprob, -0.125f);
  ASSERT_EQ(b->new_samples[0].top_logprobs.size(), 2u);
  EXPECT_EQ(b->new_samples[0].top_logprobs[1].token, 8);
  EXPECT_EQ(b->new_samples[0].top_logprobs[1].logprob, -3.0f);
  EXPECT_TRUE(std::isinf(b->new_samples[1].logprob) && b->new_samples[1].logprob < 0);
  EXPECT_EQ(b->new_logits, a.new_logits);
  EXPECT_EQ(b->new_prompt_logits, a.new_prompt_logits);
  EXPECT_EQ(b->new_mtp_logits, a.new_mtp_logits);
  EXPECT_EQ(b->new_text, a.new_text);
  EXPECT_EQ(b->finished, a.finished);
  EXPECT_EQ(b->finish_reason, a.finish_reason);
  EXPECT_EQ(b->aborted, a.aborted);
  EXPECT_EQ(b->error.code(), a.error.code());
  EXPECT_EQ(b->error.message(), a.error.message());
  EXPECT_EQ(b->num_prompt_tokens, a.num_prompt_tokens);
  EXPECT_EQ(b->num_cached_tokens, a.num_cached_tokens);
  EXPECT_EQ(b->num_output_tokens, a.num_output_tokens);
  EXPECT_EQ(b->num_preemptions, a.num_preemptions);
  EXPECT_EQ(b->first_scheduled, a.first_scheduled);
}

TEST(WorkerProtocol, MetricsRoundTripEveryField) {
  runtime::EngineMetrics a;
  a.num_running = 1;
  a.num_waiting = 2;
  a.num_blocks = 3;
  a.num_used_blocks = 4;
  a.num_cached_free_blocks = 5;
  a.kv_cache_usage = 0.375;
  a.prefix_query_tokens = 6;
  a.prefix_hit_tokens = 7;
  a.prompt_tokens = 8;
  a.generation_tokens = 9;
  a.num_preemptions = 10;
  a.num_steps = 11;
  a.live_tokens = 12;
  a.allocated_slots = 13;
  a.comm[{.layer = 3, .op = dist::CommOp::kAllGather}] = {
      .calls = 14, .bytes_received = 15, .bytes_sent = 16};
  a.spec_num_drafts = 19;
  a.spec_num_draft_tokens = 20;
  a.spec_num_accepted_tokens = 21;
  a.spec_accepted_per_position = {22, 23};
  a.spec_rollback_bytes = 24;
  a.worker_restarts = 17;
  a.requests_migrated = 18;
  a.images_preprocessed = 19;
  a.image_preprocess_seconds = 0.125;
  a.images_encoded = 20;
  a.image_tokens_encoded = 21;
  a.image_encode_steps = 22;
  a.image_encode_seconds = 0.375;
  Result<runtime::EngineMetrics> b = decode_metrics(encode_metrics(a));
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_EQ(encode_metrics(*b), encode_metrics(a));
  ASSERT_EQ(b->comm.size(), 1u);
  EXPECT_EQ(b->comm.begin()->first.op, dist::CommOp::kAllGather);
  EXPECT_EQ(b->comm.begin()->second.bytes_sent, 16);
}

TEST(WorkerProtocol, FramesSurviveTheSocketAndBrokenOnesAreNamed) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  const nlohmann::json a = {{"type", "submit"}, {"text", std::string(100000, 'x')}};
  const nlohmann::json b = {{"type", "cancel"}, {"id", 3}};
  ASSERT_TRUE(send_message(fds[0], a).ok());
  ASSERT_TRUE(send_message(fds[0], b).ok());
  auto got_a = read_message(fds[1]);
  auto got_b = read_message(fds[1]);
  ASSERT_TRUE(got_a.ok() && got_a->has_value());
  ASSERT_TRUE(got_b.ok() && got_b->has_value());
  EXPECT_EQ(**got_a, a);
  EXPECT_EQ(**got_b, b);
  // A header promising more than the limit, then a message cut short by the peer closing.
  const unsigned char huge[4] = {0xff, 0xff, 0xff, 0xff};
  ASSERT_EQ(::write(fds[0], huge, 4), 4);
  EXPECT_EQ(read_message(fds[1]).status().code(), StatusCode::kCorrupt);
  const unsigned char cut[6] = {10, 0, 0, 0, '{', '"'};
  ASSERT_EQ(::write(fds[0], cut, 6), 6);
  ::close(fds[0]);
  EXPECT_EQ(read_message(fds[1]).status().code(), StatusCode::kCorrupt);
  auto end = read_message(fds[1]);  // then a clean end of stream
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
  ::close(fds[1]);
}

}  // namespace worker_protocol_test
}  // namespace dz::serve::worker
