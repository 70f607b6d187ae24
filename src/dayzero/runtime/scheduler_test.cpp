#include "dayzero/runtime/scheduler.h"

#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <vector>

namespace dz::runtime {
namespace {

constexpr int64_t kBlock = 4;

struct Fixture {
  cache::BlockPool pool;
  Scheduler scheduler;

  Fixture(int64_t num_blocks, int64_t reserve, SchedulerConfig config)
      : pool(cache::BlockPool::create(num_blocks, kBlock, reserve).value()),
        scheduler(config, pool, nullptr, cache::model_seed_hash("test"), "fmt") {}

  Request& add(int64_t id, int64_t num_prompt, int32_t priority = 0, int32_t first_token = 0) {
    GenerationRequest g;
    for (int64_t i = 0; i < num_prompt; ++i)
      g.prompt_token_ids.push_back(static_cast<int32_t>((first_token + i * 7 + id * 13) % 50));
    g.priority = priority;
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
                         .max_model_len = 1000,
                         .enable_prefix_caching = true,
                         .state_checkpoint_interval = 16};
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
  EXPECT_EQ(f.pool.metrics().used, 8);
  EXPECT_EQ(f.pool.num_allocatable(), 0);
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
  EXPECT_TRUE(two->block_table.empty());
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

TEST(Scheduler, CheckpointPositionsOnlyForRecurrentModels) {
  Fixture f(64, 0, config(100, 100));
  const Request& r = f.add(1, 37);
  EXPECT_EQ(f.scheduler.next_checkpoint(r, 0), std::numeric_limits<int64_t>::max());

  cache::BlockPool pool = cache::BlockPool::create(64, kBlock, 0).value();
  Result<cache::StatePool> states =
      cache::StatePool::create(1 + 2 + 2, 2, 2, [](int32_t, int32_t) {});
  ASSERT_TRUE(states.ok());
  Scheduler hybrid(config(100, 100), pool, &*states, cache::model_seed_hash("t"), "fmt");
  GenerationRequest g;
  g.prompt_token_ids.assign(37, 3);
  Request& h = hybrid.add(std::make_unique<Request>(1, g, std::vector<int32_t>{}));
  // Interval 16, last prompt block boundary 36.
  EXPECT_EQ(hybrid.next_checkpoint(h, 0), 16);
  EXPECT_EQ(hybrid.next_checkpoint(h, 16), 32);
  EXPECT_EQ(hybrid.next_checkpoint(h, 33), 36);
  EXPECT_EQ(hybrid.next_checkpoint(h, 36), 48);
  // The first chunk ends at the first checkpoint.
  EXPECT_EQ(chunks(hybrid.schedule()), (std::vector<std::pair<int64_t, int64_t>>{{1, 16}}));
}

}  // namespace
}  // namespace dz::runtime
