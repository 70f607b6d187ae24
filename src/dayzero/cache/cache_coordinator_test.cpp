#include "dayzero/cache/cache_coordinator.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <random>
#include <vector>

namespace dz::cache {
namespace cache_coordinator_test {

constexpr int64_t kBlock = 4;

// What the coordinator copied, recorded instead of bytes.
struct Copies {
  struct Rows {
    int32_t from = 0, to = 0;
    int64_t num_rows = 0;
  };
  std::vector<Rows> rows;
  std::vector<std::pair<int32_t, int32_t>> states;
};

CacheCoordinatorConfig config(int64_t interval = 8) {
  return {.enable_prefix_caching = true,
          .state_checkpoint_interval = interval,
          .seed = model_seed_hash("coordinator"),
          .cache_format = "fmt"};
}

struct Fixture {
  Copies copies;
  CacheCoordinator cache;

  // max_live 0: a model without recurrent state.
  Fixture(int64_t num_blocks, int64_t reserve, int32_t max_live = 0, int32_t max_checkpoints = 0)
      : cache(
            BlockPool::create(num_blocks, kBlock, reserve).value(),
            max_live == 0
                ? std::nullopt
                : std::optional<StatePool>(StatePool::create(1 + max_live + max_checkpoints,
                                                             max_live, max_checkpoints,
                                                             [this](int32_t from, int32_t to) {
                                                               copies.states.emplace_back(from, to);
                                                             })
                                               .value()),
            [this](int32_t from, int32_t to, int64_t num_rows) {
              copies.rows.push_back({from, to, num_rows});
            },
            config()) {}

  // Admits seq with whatever prefix hits and runs it through all of tokens in one step.
  void admit_and_compute(SequenceCache& seq, const SequenceTokens& tokens) {
    const CachedPrefix prefix = cache.get_computed_blocks(seq, tokens);
    const auto n = static_cast<int64_t>(tokens.tokens.size()) - prefix.num_tokens;
    ASSERT_TRUE(cache.can_allocate(prefix, n, false));
    cache.allocate_prefix(seq, prefix, n, false);
    cache.cache_full_blocks(seq, tokens, static_cast<int64_t>(tokens.tokens.size()));
  }

  void expect_ok(std::vector<const SequenceCache*> sequences) const {
    const Status status = cache.check_invariants(sequences);
    EXPECT_TRUE(status.ok()) << status.to_string();
  }
};

std::vector<int32_t> random_tokens(int64_t n) {
  static const uint32_t seed = std::random_device{}();
  static std::mt19937 rng = [] {
    std::printf("cache_coordinator_test token seed %u\n", seed);
    return std::mt19937(seed);
  }();
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int32_t& t : tokens) t = std::uniform_int_distribution<int32_t>(0, 999)(rng);
  return tokens;
}

SequenceTokens view(const std::vector<int32_t>& tokens, int64_t num_prompt) {
  return {.tokens = tokens, .num_prompt_tokens = num_prompt, .cache_salt = ""};
}

TEST(CacheCoordinator, LongestCachedPrefixLeavesOneTokenToRun) {
  Fixture f(16, 0);
  const std::vector<int32_t> tokens = random_tokens(12);
  SequenceCache a;
  f.admit_and_compute(a, view(tokens, 12));
  EXPECT_EQ(a.block_table.size(), 3u);
  EXPECT_EQ(a.num_registered_blocks, 3);
  // The same 12 tokens: 2 blocks hit, the third holds the last token, which must run.
  SequenceCache b;
  CachedPrefix hit = f.cache.get_computed_blocks(b, view(tokens, 12));
  EXPECT_EQ(hit.blocks, std::vector<int32_t>(a.block_table.begin(), a.block_table.begin() + 2));
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_EQ(hit.num_free_blocks, 0);  // a still holds them
  EXPECT_FALSE(hit.checkpoint.has_value());
  f.cache.free(a);
  // Free but cached: taking them costs free blocks.
  hit = f.cache.get_computed_blocks(b, view(tokens, 12));
  EXPECT_EQ(hit.blocks.size(), 2u);
  EXPECT_EQ(hit.num_free_blocks, 2);
  f.cache.allocate_prefix(b, hit, 4, false);
  EXPECT_EQ(b.block_table.size(), 3u);
  EXPECT_EQ(f.cache.blocks().ref_count(b.block_table[0]), 1);
  f.expect_ok({&b});
  // Another token in the first block: no hit at all.
  std::vector<int32_t> other = tokens;
  other[1] += 1000;
  SequenceCache c;
  EXPECT_TRUE(f.cache.get_computed_blocks(c, view(other, 12)).blocks.empty());
  f.cache.free(b);
  f.expect_ok({});
}

TEST(CacheCoordinator, AllocationSaysNoAndChangesNothing) {
  // 6 usable blocks, 2 of them reserved for running decodes.
  Fixture f(7, 2);
  const std::vector<int32_t> tokens = random_tokens(40);
  SequenceCache a;
  const CachedPrefix none = f.cache.get_computed_blocks(a, view(tokens, 40));
  EXPECT_TRUE(f.cache.can_allocate(none, 16, false));
  EXPECT_FALSE(f.cache.can_allocate(none, 17, false));
  EXPECT_TRUE(f.cache.can_allocate(none, 24, true));
  f.cache.allocate_prefix(a, none, 16, false);
  EXPECT_EQ(f.cache.max_tokens_holdable(a, false), 16);
  EXPECT_EQ(f.cache.max_tokens_holdable(a, true), 24);
  EXPECT_FALSE(f.cache.allocate_slots(a, 17, false));
  EXPECT_EQ(a.block_table.size(), 4u);
  EXPECT_TRUE(f.cache.allocate_slots(a, 16, false));  // already held
  EXPECT_TRUE(f.cache.allocate_slots(a, 24, true));   // a decode may take the reserve
  EXPECT_EQ(a.block_table.size(), 6u);
  EXPECT_FALSE(f.cache.allocate_slots(a, 25, true));
  f.expect_ok({&a});
  f.cache.free(a);
  f.expect_ok({});
}

TEST(CacheCoordinator, ForkSharesFullBlocksAndCopiesThePartialBlockAndTheState) {
  Fixture f(16, 0, /*max_live=*/3, /*max_checkpoints=*/2);
  const std::vector<int32_t> tokens = random_tokens(10);
  SequenceCache parent;
  f.admit_and_compute(parent, view(tokens, 10));
  ASSERT_EQ(parent.block_table.size(), 3u);
  SequenceCache child;
  ASSERT_TRUE(f.cache.fork(parent, 10, child));
  ASSERT_EQ(child.block_table.size(), 3u);
  EXPECT_EQ(child.block_table[0], parent.block_table[0]);
  EXPECT_EQ(child.block_table[1], parent.block_table[1]);
  EXPECT_NE(child.block_table[2], parent.block_table[2]);
  EXPECT_EQ(f.cache.blocks().ref_count(parent.block_table[0]), 2);
  EXPECT_EQ(f.cache.blocks().ref_count(parent.block_table[2]), 1);
  ASSERT_EQ(f.copies.rows.size(), 1u);
  EXPECT_EQ(f.copies.rows[0].from, parent.block_table[2]);
  EXPECT_EQ(f.copies.rows[0].to, child.block_table[2]);
  EXPECT_EQ(f.copies.rows[0].num_rows, 2);
  EXPECT_NE(child.state_slot, parent.state_slot);
  EXPECT_EQ(f.copies.states.back(), std::make_pair(parent.state_slot, child.state_slot));
  EXPECT_EQ(child.block_hashes,
            std::vector<BlockHash>(parent.block_hashes.begin(), parent.block_hashes.begin() + 2));
  EXPECT_EQ(child.num_registered_blocks, 2);
  f.expect_ok({&parent, &child});

  // On a block boundary nothing is copied but the state.
  SequenceCache second;
  const size_t rows_before = f.copies.rows.size();
  ASSERT_TRUE(f.cache.fork(parent, 8, second));
  EXPECT_EQ(second.block_table,
            std::vector<int32_t>(parent.block_table.begin(), parent.block_table.begin() + 2));
  EXPECT_EQ(f.copies.rows.size(), rows_before);
  f.expect_ok({&parent, &child, &second});

  // No live slot left: no fork, nothing changed.
  SequenceCache third;
  EXPECT_FALSE(f.cache.fork(parent, 10, third));
  EXPECT_TRUE(third.block_table.empty());
  EXPECT_EQ(third.state_slot, -1);
  f.expect_ok({&parent, &child, &second});
  for (SequenceCache* seq : {&parent, &child, &second}) f.cache.free(*seq);
  f.expect_ok({});
}

TEST(CacheCoordinator, ForkKeepsTheReserve) {
  Fixture f(5, 2);  // 4 usable blocks, 2 reserved
  const std::vector<int32_t> tokens = random_tokens(6);
  SequenceCache parent;
  f.admit_and_compute(parent, view(tokens, 6));  // 2 blocks: none left above the reserve
  SequenceCache child;
  EXPECT_FALSE(f.cache.fork(parent, 6, child));
  EXPECT_TRUE(child.block_table.empty());
  EXPECT_TRUE(f.cache.fork(parent, 4, child));  // the full block alone needs nothing new
  f.expect_ok({&parent, &child});
}

TEST(CacheCoordinator, CheckpointPositionsOnlyForRecurrentModels) {
  Fixture plain(16, 0);
  EXPECT_EQ(plain.cache.next_checkpoint(37, 0), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(plain.cache.clip_to_checkpoint(37, 0, 30), 30);
  Fixture hybrid(16, 0, 2, 2);
  // Interval 8, last prompt block boundary 20.
  EXPECT_EQ(hybrid.cache.next_checkpoint(21, 0), 8);
  EXPECT_EQ(hybrid.cache.next_checkpoint(21, 16), 20);
  EXPECT_EQ(hybrid.cache.next_checkpoint(21, 20), 24);
  EXPECT_EQ(hybrid.cache.clip_to_checkpoint(21, 3, 30), 5);
  // Without checkpoint slots a hybrid model cannot hit: no prefix caching, no checkpoints.
  Fixture blind(16, 0, 2, 0);
  EXPECT_FALSE(blind.cache.prefix_caching());
  EXPECT_EQ(blind.cache.next_checkpoint(21, 0), std::numeric_limits<int64_t>::max());
}

TEST(CacheCoordinator, HybridHitIsCutToTheDeepestCheckpointAndRestored) {
  Fixture f(32, 0, 2, 4);
  const std::vector<int32_t> tokens = random_tokens(21);
  SequenceCache a;
  const CachedPrefix none = f.cache.get_computed_blocks(a, view(tokens, 21));
  f.cache.allocate_prefix(a, none, 21, false);
  // Chunks end at the checkpoints 8 and 20 (interval 8, last prompt boundary 20; 16 is one too).
  for (const int64_t end : {8, 16, 20, 21}) f.cache.cache_full_blocks(a, view(tokens, 21), end);
  EXPECT_EQ(f.cache.states()->metrics().checkpoints_used, 3);
  // 5 full blocks are indexed; the hit stops at the deepest checkpoint, 20 tokens.
  SequenceCache b;
  const std::vector<int32_t> longer = [&] {
    std::vector<int32_t> t = tokens;
    for (const int32_t x : random_tokens(10)) t.push_back(x);
    return t;
  }();
  const CachedPrefix hit = f.cache.get_computed_blocks(b, view(longer, 31));
  EXPECT_EQ(hit.blocks.size(), 5u);
  ASSERT_TRUE(hit.checkpoint.has_value());
  EXPECT_EQ(*hit.checkpoint, a.block_hashes[4]);
  const size_t copies_before = f.copies.states.size();
  f.cache.allocate_prefix(b, hit, 11, false);
  ASSERT_EQ(f.copies.states.size(), copies_before + 1);  // the checkpoint restored into b's slot
  EXPECT_EQ(f.copies.states.back().second, b.state_slot);
  f.expect_ok({&a, &b});
}

TEST(CacheCoordinator, EvictingABlockReleasesItsCheckpoint) {
  Fixture f(4, 0, 1, 2);  // 3 usable blocks
  const std::vector<int32_t> tokens = random_tokens(9);
  SequenceCache a;
  const CachedPrefix empty = f.cache.get_computed_blocks(a, view(tokens, 9));
  f.cache.allocate_prefix(a, empty, 9, false);
  f.cache.cache_full_blocks(a, view(tokens, 9), 8);  // the checkpoint at 8
  f.cache.cache_full_blocks(a, view(tokens, 9), 9);
  EXPECT_EQ(f.cache.states()->metrics().checkpoints_used, 1);
  f.cache.free(a);
  SequenceCache b;
  const std::vector<int32_t> other = random_tokens(12);
  const CachedPrefix none = f.cache.get_computed_blocks(b, view(other, 12));
  f.cache.allocate_prefix(b, none, 12, false);  // takes every block, evicting a's
  EXPECT_EQ(f.cache.states()->metrics().checkpoints_used, 0);
  f.expect_ok({&b});
}

}  // namespace cache_coordinator_test
}  // namespace dz::cache
