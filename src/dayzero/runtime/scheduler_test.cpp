#include "dayzero/runtime/scheduler.h"

#include <gtest/gtest.h>

#include <array>
#include <memory>
#include <string>
#include <vector>

namespace dz::runtime {
namespace scheduler_test {

constexpr int64_t kBlock = 4;

cache::CacheCoordinatorConfig cache_config() {
  return {.enable_prefix_caching = true,
          .state_checkpoint_interval = 16,
          .seed = cache::model_seed_hash("test"),
          .cache_format = "fmt"};
}

void no_copy(int32_t, int32_t, int64_t) {}

struct Fixture {
  cache::CacheCoordinator cache;
  Scheduler scheduler;

  Fixture(int64_t num_blocks, int64_t reserve, SchedulerConfig config,
          const EncoderCache* encoder_cache = nullptr)
      : cache(cache::BlockPool::create(num_blocks, kBlock, reserve).value(), std::nullopt, no_copy,
              cache_config()),
        scheduler(config, cache, encoder_cache) {}

  Request& add(int64_t id, int64_t num_prompt, int32_t priority = 0, int32_t first_token = 0) {
    GenerationRequest g;
    for (int64_t i = 0; i < num_prompt; ++i)
      g.prompt_token_ids.push_back(static_cast<int32_t>((first_token + i * 7 + id * 13) % 50));
    g.priority = priority;
    g.max_tokens = 100;
    return scheduler.add(std::make_unique<Request>(id, std::move(g), std::vector<int32_t>{}));
  }

  // A request whose prompt holds images at {offset, tokens, hash}.
  Request& add_with_images(int64_t id, int64_t num_prompt,
                           std::vector<std::array<int64_t, 3>> images) {
    GenerationRequest g;
    g.prompt_token_ids.assign(static_cast<size_t>(num_prompt), 7);
    for (const auto& [offset, tokens, hash] : images)
      g.images.push_back({.offset = offset,
                          .num_tokens = tokens,
                          .hash = {.lo = static_cast<uint64_t>(hash), .hi = 0},
                          .data = std::make_shared<const std::string>("image")});
    g.max_tokens = 100;
    return scheduler.add(std::make_unique<Request>(id, std::move(g), std::vector<int32_t>{}));
  }

  // One step without a model: every request whose chunk reached its end "samples" a token.
  SchedulerOutput step() {
    SchedulerOutput out = scheduler.schedule();
    scheduler.advance(out);
    for (const ScheduledChunk& c : out.chunks)
      if (c.request->num_computed_tokens == c.request->num_tokens()) c.request->tokens.push_back(1);
    const Status inv = scheduler.check_invariants();
    EXPECT_TRUE(inv.ok()) << inv.to_string();
    return out;
  }
};

SchedulerConfig config(int64_t budget, int64_t threshold, int64_t max_seqs = 8) {
  return SchedulerConfig{.max_num_seqs = max_seqs,
                         .max_num_batched_tokens = budget,
                         .long_prefill_threshold = threshold,
                         .max_long_partial_prefills = 1,
                         .max_model_len = 1000};
}

std::vector<std::pair<int64_t, int64_t>> chunks(const SchedulerOutput& out) {
  std::vector<std::pair<int64_t, int64_t>> v;
  for (const ScheduledChunk& c : out.chunks) v.emplace_back(c.request->id, c.num_tokens);
  return v;
}

TEST(Scheduler, RunningFirstThenWaitingWithinTheBudget) {
  Fixture f(64, 0, config(10, 6));
  f.add(1, 9);
  f.add(2, 3);
  // Step 1: request 1 gets the threshold (6), request 2 its 3 tokens.
  EXPECT_EQ(chunks(f.step()), (std::vector<std::pair<int64_t, int64_t>>{{1, 6}, {2, 3}}));
  f.add(3, 20);
  // Step 2: running first: 1 finishes its prompt (3), 2 decodes (1); 3 gets the remaining 6.
  EXPECT_EQ(chunks(f.step()), (std::vector<std::pair<int64_t, int64_t>>{{1, 3}, {2, 1}, {3, 6}}));
  EXPECT_EQ(f.scheduler.num_running(), 3);
}

TEST(Scheduler, EncoderBudgetStopsAChunkBeforeAnImageItCannotEncode) {
  using Chunks = std::vector<std::pair<int64_t, int64_t>>;
  EncoderCache encoder(int64_t{1} << 20);
  SchedulerConfig c = config(100, 100);
  c.max_num_encoder_tokens = 10;
  Fixture f(64, 0, c, &encoder);
  f.add_with_images(1, 40, {{5, 8, 1}, {20, 8, 2}});
  // Image 1 fits the 10 tokens, image 2 would pass them: the chunk stops where it begins.
  EXPECT_EQ(chunks(f.step()), (Chunks{{1, 20}}));
  // Request 1 spends 8 on image 2; request 2's image of 9 waits, and so does request 2 (it
  // starts with that image: the head of the line).
  f.add_with_images(2, 40, {{0, 9, 3}});
  EXPECT_EQ(chunks(f.step()), (Chunks{{1, 20}}));
  EXPECT_EQ(chunks(f.step()), (Chunks{{1, 1}, {2, 40}}));
  // Images in the encoder cache cost nothing: a request with three of 8 goes whole.
  for (int64_t hash : {1, 2, 4})
    encoder.insert({.lo = static_cast<uint64_t>(hash), .hi = 0},
                   std::make_shared<const std::vector<float>>(8, 1.0f));
  f.add_with_images(3, 40, {{0, 8, 1}, {10, 8, 2}, {30, 8, 4}});
  EXPECT_EQ(chunks(f.step()), (Chunks{{1, 1}, {2, 1}, {3, 40}}));
  // The same image twice in one step is encoded once: 2 x 6 tokens under a budget of 10.
  f.add_with_images(4, 30, {{0, 6, 5}, {10, 6, 5}});
  EXPECT_EQ(chunks(f.step()), (Chunks{{1, 1}, {2, 1}, {3, 1}, {4, 30}}));
}

TEST(Scheduler, WaitingIsOrderedByPriorityThenArrival) {
  Fixture f(64, 0, config(4, 4, 1));
  f.add(1, 2, 1);
  f.add(2, 2, 0);
  f.add(3, 2, 1);
  f.add(4, 2, 0);
  std::vector<int64_t> admitted;
  for (int i = 0; i < 4; ++i) {
    const SchedulerOutput out = f.step();
    for (int64_t id : out.admitted_ids) admitted.push_back(id);
    // max_num_seqs = 1: finish the running one.
    for (Request* r : std::vector<Request*>(f.scheduler.running())) f.scheduler.finish(r->id);
  }
  EXPECT_EQ(admitted, (std::vector<int64_t>{2, 4, 1, 3}));
}

TEST(Scheduler, HeadOfLineBlocksAndAdmissionKeepsTheReserve) {
  // 8 usable blocks, 2 reserved: admissions may take 6.
  Fixture f(9, 2, config(100, 100));
  f.add(1, 16);  // 4 blocks
  f.step();
  f.add(2, 12);  // 3 blocks; once 1 decodes into its 5th block, 1 is left above the reserve
  f.add(3, 2);   // 1 block would fit, but the head of the line blocks it
  SchedulerOutput out = f.step();
  EXPECT_TRUE(out.admitted_ids.empty());
  EXPECT_EQ(f.scheduler.num_waiting(), 2);
  // The running decode may take the reserve: it grows to blocks 5..8 without preemption.
  for (int i = 0; i < 12; ++i) {
    out = f.step();
    EXPECT_TRUE(out.preempted_ids.empty());
  }
  EXPECT_EQ(f.cache.block_metrics().used, 8);
  EXPECT_EQ(f.cache.blocks().num_allocatable(), 0);
}

TEST(Scheduler, PreemptionTakesTheLowestPriorityThenTheNewestAndAdmitsNothing) {
  Fixture f(7, 0, config(100, 100));
  f.add(1, 4, 0);  // 1 block each, growing by decode
  f.add(2, 4, 1);
  f.add(3, 4, 0);
  f.step();
  EXPECT_EQ(f.scheduler.num_running(), 3);
  // Running order is (priority, arrival): 1, 3, 2; each needs a second block at position 4.
  f.step();  // 3 more blocks: 6 used of 6
  f.add(4, 1, -5);
  // Next boundary at 8: request 1 needs a block; the victim is 2 (priority 1), then 3 (newest).
  SchedulerOutput out;
  for (int i = 0; i < 4 && out.preempted_ids.empty(); ++i) out = f.step();
  ASSERT_FALSE(out.preempted_ids.empty());
  EXPECT_EQ(out.preempted_ids, std::vector<int64_t>{2});  // its 2 blocks serve 1 and 3
  EXPECT_TRUE(out.admitted_ids.empty());                  // not even the high-priority request 4
  // At the next boundary (12) the victim among equal priorities is the newer, 3.
  SchedulerOutput next;
  for (int i = 0; i < 4 && next.preempted_ids.empty(); ++i) next = f.step();
  EXPECT_EQ(next.preempted_ids, std::vector<int64_t>{3});
  EXPECT_TRUE(next.admitted_ids.empty());
  EXPECT_EQ(f.step().admitted_ids, std::vector<int64_t>{4});
  const Request* two = f.scheduler.find(2);
  EXPECT_EQ(two->num_computed_tokens, 0);
  EXPECT_TRUE(two->cache.block_table.empty());
  EXPECT_EQ(two->num_preemptions, 1);
  EXPECT_EQ(f.scheduler.counters().num_preemptions, 2);
}

TEST(Scheduler, ResumedRequestHitsItsOwnCachedBlocks) {
  Fixture f(7, 0, config(100, 100));
  f.add(1, 4, 0);
  f.add(2, 9, 1);  // 3 blocks with its first token
  f.step();
  f.step();
  while (f.scheduler.find(2)->num_preemptions == 0) f.step();
  // Its full blocks stayed cached: re-admission hits them (all but the last token's block).
  f.scheduler.finish(1);
  const SchedulerOutput out = f.step();
  ASSERT_EQ(out.admitted_ids, std::vector<int64_t>{2});
  const Request* two = f.scheduler.find(2);
  EXPECT_EQ(two->num_cached_tokens, (two->num_tokens() - 1) / kBlock * kBlock);
  EXPECT_GT(two->num_cached_tokens, 0);
}

TEST(Scheduler, OneLongPrefillAtATimeShortPromptsPass) {
  Fixture f(64, 0, config(16, 8));
  f.add(1, 30);
  f.add(2, 30);
  f.add(3, 5);
  SchedulerOutput out = f.step();
  EXPECT_EQ(chunks(out), (std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {3, 5}}));
  out = f.step();  // 1 continues (8), 3 decodes; 2 still waits behind the long prefill
  EXPECT_EQ(chunks(out), (std::vector<std::pair<int64_t, int64_t>>{{1, 8}, {3, 1}}));
  EXPECT_EQ(f.scheduler.num_waiting(), 1);
}

TEST(Scheduler, MaxNumSeqsBoundsRunning) {
  Fixture f(64, 0, config(100, 100, 2));
  for (int64_t id = 0; id < 5; ++id) f.add(id, 3);
  f.step();
  EXPECT_EQ(f.scheduler.num_running(), 2);
  EXPECT_EQ(f.scheduler.num_waiting(), 3);
}

TEST(Scheduler, FirstChunkOfAHybridModelEndsAtTheFirstCheckpoint) {
  Result<cache::StatePool> states =
      cache::StatePool::create(1 + 2 + 2, 2, 2, [](int32_t, int32_t) {});
  ASSERT_TRUE(states.ok());
  cache::CacheCoordinator coordinator(cache::BlockPool::create(64, kBlock, 0).value(),
                                      std::move(*states), no_copy, cache_config());
  Scheduler hybrid(config(100, 100), coordinator);
  GenerationRequest g;
  g.prompt_token_ids.assign(37, 3);
  hybrid.add(std::make_unique<Request>(1, g, std::vector<int32_t>{}));
  // Interval 16: the first chunk ends at 16, the next at 32, then at the last block boundary 36.
  for (const int64_t want : {16, 16, 4, 1}) {
    const SchedulerOutput out = hybrid.schedule();
    EXPECT_EQ(chunks(out), (std::vector<std::pair<int64_t, int64_t>>{{1, want}}));
    hybrid.advance(out);
  }
}

TEST(Scheduler, PendingChoicesForkOnceThePromptIsComputed) {
  Fixture f(64, 0, config(6, 6));
  Request& parent = f.add(1, 10);
  GenerationRequest g;
  g.prompt_token_ids = parent.tokens;
  g.max_tokens = 100;
  Request& child = f.scheduler.add_fork(
      std::make_unique<Request>(2, std::move(g), std::vector<int32_t>{}), parent);
  EXPECT_EQ(f.scheduler.num_waiting(), 2);
  SchedulerOutput out = f.scheduler.schedule();  // 6 of 10 tokens: the child still waits
  f.scheduler.advance(out);
  EXPECT_EQ(chunks(out), (std::vector<std::pair<int64_t, int64_t>>{{1, 6}}));
  EXPECT_EQ(child.status, RequestStatus::kForkPending);
  ASSERT_TRUE(f.scheduler.check_invariants().ok());
  out = f.scheduler.schedule();
  f.scheduler.advance(out);
  EXPECT_EQ(chunks(out), (std::vector<std::pair<int64_t, int64_t>>{{1, 4}}));
  EXPECT_EQ(f.scheduler.fork_pending(parent), std::vector<Request*>{&child});
  EXPECT_EQ(child.status, RequestStatus::kRunning);
  EXPECT_EQ(child.num_computed_tokens, 10);
  // Blocks 0 and 1 (tokens 0..7) shared, the partial third block copied into a fresh one.
  ASSERT_EQ(child.cache.block_table.size(), 3u);
  EXPECT_EQ(child.cache.block_table[0], parent.cache.block_table[0]);
  EXPECT_EQ(child.cache.block_table[1], parent.cache.block_table[1]);
  EXPECT_NE(child.cache.block_table[2], parent.cache.block_table[2]);
  EXPECT_EQ(f.cache.blocks().ref_count(parent.cache.block_table[0]), 2);
  EXPECT_EQ(f.scheduler.num_running(), 2);
  ASSERT_TRUE(f.scheduler.check_invariants().ok());
  f.scheduler.finish(1);
  EXPECT_EQ(f.cache.blocks().ref_count(child.cache.block_table[0]), 1);
  ASSERT_TRUE(f.scheduler.check_invariants().ok());
}

TEST(Scheduler, PendingChoicesOfAFinishedRequestRunAlone) {
  Fixture f(64, 0, config(100, 100));
  Request& parent = f.add(1, 10);
  GenerationRequest g;
  g.prompt_token_ids = parent.tokens;
  g.max_tokens = 100;
  Request& child = f.scheduler.add_fork(
      std::make_unique<Request>(2, std::move(g), std::vector<int32_t>{}), parent);
  f.scheduler.finish(1);  // aborted before its prompt ran
  EXPECT_EQ(child.status, RequestStatus::kWaiting);
  EXPECT_EQ(chunks(f.step()), (std::vector<std::pair<int64_t, int64_t>>{{2, 10}}));
}

TEST(Scheduler, NoForkBeyondMaxNumSeqs) {
  Fixture f(64, 0, config(100, 100, 1));
  Request& parent = f.add(1, 10);
  GenerationRequest g;
  g.prompt_token_ids = parent.tokens;
  g.max_tokens = 100;
  Request& child = f.scheduler.add_fork(
      std::make_unique<Request>(2, std::move(g), std::vector<int32_t>{}), parent);
  f.scheduler.advance(f.scheduler.schedule());
  EXPECT_TRUE(f.scheduler.fork_pending(parent).empty());
  EXPECT_EQ(child.status, RequestStatus::kWaiting);
  EXPECT_TRUE(child.cache.block_table.empty());
  ASSERT_TRUE(f.scheduler.check_invariants().ok());
}

}  // namespace scheduler_test
}  // namespace dz::runtime
