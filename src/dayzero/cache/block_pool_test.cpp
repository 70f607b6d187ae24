#include "dayzero/cache/block_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>

namespace dz::cache {
namespace block_pool_test {

using Tables = std::vector<std::vector<int32_t>>;

BlockPool make_pool(int64_t num_blocks, int64_t block_size, int64_t reserve = 0) {
  Result<BlockPool> pool = BlockPool::create(num_blocks, block_size, reserve);
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(*pool);
}

std::vector<int32_t> take(BlockPool& pool, int64_t n, bool decode = false) {
  Result<std::vector<int32_t>> blocks = pool.allocate(n, decode);
  EXPECT_TRUE(blocks.ok()) << blocks.status().to_string();
  return blocks.ok() ? *blocks : std::vector<int32_t>{};
}

// A prefix hit taken: the matched blocks, each with one more reference.
std::vector<int32_t> lookup(BlockPool& pool, std::span<const BlockHash> hashes,
                            std::span<const int32_t> tokens) {
  std::vector<int32_t> hit = pool.match_prefix(hashes, tokens);
  pool.touch(hit);
  return hit;
}

void expect_ok(const BlockPool& pool, const Tables& tables) {
  const Status status = pool.check_invariants(tables);
  EXPECT_TRUE(status.ok()) << status.to_string();
}

std::vector<int32_t> iota_tokens(int32_t first, int64_t n) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

TEST(BlockPool, CreateRefusesBadSizes) {
  EXPECT_EQ(BlockPool::create(1, 16, 0).status().message(),
            "block pool: num_blocks 1 out of [2, 2^31 - 1) (block 0 is null)");
  EXPECT_EQ(BlockPool::create(4, 0, 0).status().message(),
            "block pool: block_size 0 must be positive");
  EXPECT_EQ(BlockPool::create(4, 16, 4).status().message(),
            "block pool: reserve of 4 blocks out of [0, 3]");
  EXPECT_EQ(BlockPool::create(4, 16, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(BlockPool::create(4, 16, 3).ok());
}

TEST(BlockPool, FreshPoolHandsOutAscendingIdsNeverTheNullBlock) {
  BlockPool pool = make_pool(5, 16);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(take(pool, 3), std::vector<int32_t>({1, 2, 3}));
  EXPECT_EQ(take(pool, 1), std::vector<int32_t>({4}));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.ref_count(0), 0);
  expect_ok(pool, {{1, 2, 3}, {4}});
  EXPECT_TRUE(take(pool, 0).empty());
}

TEST(BlockPool, AllocateFailsAtomicallyAndKeepsTheReserveForDecodes) {
  BlockPool pool = make_pool(6, 16, 2);  // 5 usable, 2 reserved
  EXPECT_EQ(pool.num_allocatable(false), 3);
  EXPECT_EQ(pool.num_allocatable(true), 5);
  Result<std::vector<int32_t>> too_many = pool.allocate(4, false);
  EXPECT_EQ(too_many.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(too_many.status().message(),
            "block pool: 4 blocks wanted, 3 allocatable (5 free, reserve 2 kept)");
  expect_ok(pool, {});
  EXPECT_EQ(pool.num_free(), 5);
  std::vector<int32_t> table;
  ASSERT_TRUE(pool.append_blocks(table, 3).ok());
  EXPECT_EQ(pool.append_blocks(table, 1).code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(table.size(), 3u);  // unchanged on failure
  // A running decode may take the reserve, and no more.
  ASSERT_TRUE(pool.append_blocks(table, 2, true).ok());
  EXPECT_EQ(pool.allocate(1, true).status().message(),
            "block pool: 1 blocks wanted, 0 allocatable (0 free, reserve 2 open to decodes)");
  EXPECT_EQ(pool.metrics().allocatable, 0);
  expect_ok(pool, {table});
  pool.free(table);
  expect_ok(pool, {});
  EXPECT_EQ(pool.num_free(), 5);
}

TEST(BlockPool, UnderContextParallelismEachTableAlternatesBetweenTheRanks) {
  // Two sequences growing a block at a time in turn: without a preference sequence 0 would get
  // blocks 1, 3, 5, ... (all on CP rank 1 of 2) and sequence 1 blocks 2, 4, 6, ...
  BlockPool pool = make_pool(40, 16);
  pool.set_shard_count(2);
  Tables tables(2);
  for (int step = 0; step < 8; ++step)
    for (std::vector<int32_t>& table : tables) ASSERT_TRUE(pool.append_blocks(table, 1).ok());
  for (const std::vector<int32_t>& table : tables)
    for (size_t i = 0; i < table.size(); ++i)
      EXPECT_EQ(table[i] % 2, static_cast<int32_t>(i % 2)) << "entry " << i;
  expect_ok(pool, tables);
  // A fork's copy of a partial block (entry 3) lands on the rank that stores the original.
  std::vector<int32_t> child(tables[0].begin(), tables[0].begin() + 3);
  pool.fork(child);
  ASSERT_TRUE(pool.append_blocks(child, 1).ok());
  EXPECT_EQ(child[3] % 2, tables[0][3] % 2);
  tables.push_back(child);
  // Four ranks, several blocks at once; with no block of the class near the head, the head's.
  pool.free(tables[1]);
  tables.erase(tables.begin() + 1);
  pool.set_shard_count(4);
  std::vector<int32_t> table;
  ASSERT_TRUE(pool.append_blocks(table, 8).ok());
  for (size_t i = 0; i < table.size(); ++i) EXPECT_EQ(table[i] % 4, static_cast<int32_t>(i % 4));
  tables.push_back(table);
  expect_ok(pool, tables);
  BlockPool tiny = make_pool(3, 16);  // blocks 1 and 2
  tiny.set_shard_count(2);
  std::vector<int32_t> odd;
  ASSERT_TRUE(tiny.append_blocks(odd, 1).ok());
  ASSERT_TRUE(tiny.append_blocks(odd, 1).ok());
  EXPECT_EQ(odd, (std::vector<int32_t>{2, 1}));
}

TEST(BlockPool, FreeAppendsToTheTailInReverseTableOrder) {
  BlockPool pool = make_pool(7, 4);
  const std::vector<int32_t> a = take(pool, 3);  // 1 2 3
  const std::vector<int32_t> b = take(pool, 2);  // 4 5; 6 stays free
  pool.free(a);                                  // list: 6, 3, 2, 1
  pool.free(b);                                  // list: 6, 3, 2, 1, 5, 4
  expect_ok(pool, {});
  EXPECT_EQ(take(pool, 6), std::vector<int32_t>({6, 3, 2, 1, 5, 4}));
}

TEST(BlockPoolDeathTest, DoubleFreeAbortsNamingTheBlock) {
  BlockPool pool = make_pool(4, 4);
  const std::vector<int32_t> a = take(pool, 2);
  pool.free(a);
  EXPECT_DEATH(pool.free(a), "double free of block 2");  // freed last first
  EXPECT_DEATH(pool.free(std::vector<int32_t>{0}), "block id 0 out of \\[1, 4\\)");
  EXPECT_DEATH(pool.fork(std::vector<int32_t>{2}), "fork of block 2, which no table holds");
}

TEST(BlockPool, ForkSharesAndFreeReleasesOnLastOwner) {
  BlockPool pool = make_pool(8, 4);
  const std::vector<int32_t> parent = take(pool, 3);
  pool.fork(parent);
  pool.fork(parent);
  const std::vector<int32_t> child1 = parent, child2 = parent;
  for (int32_t block : parent) EXPECT_EQ(pool.ref_count(block), 3);
  expect_ok(pool, {parent, child1, child2});
  EXPECT_FALSE(pool.check_invariants({{parent, child1}}).ok());
  pool.free(parent);
  pool.free(child1);
  EXPECT_EQ(pool.num_free(), 4);
  expect_ok(pool, {child2});
  pool.free(child2);
  EXPECT_EQ(pool.num_free(), 7);
  expect_ok(pool, {});
}

TEST(BlockPool, RegisterAndLookupReuseFullBlocksAndTouchFreeOnes) {
  BlockPool pool = make_pool(8, 4);
  const std::vector<int32_t> tokens = iota_tokens(100, 10);  // 2 full blocks + 2
  const BlockHash seed = model_seed_hash("m");
  const std::vector<BlockHash> hashes = hash_full_blocks(seed, tokens, 4, "", "f");
  std::vector<int32_t> a = take(pool, 3);
  std::span<const int32_t> all(tokens);
  EXPECT_TRUE(pool.register_full_block(a, 0, hashes[0], all.subspan(0, 4)));
  EXPECT_TRUE(pool.register_full_block(a, 1, hashes[1], all.subspan(4, 4)));
  EXPECT_TRUE(pool.register_full_block(a, 1, hashes[1], all.subspan(4, 4)));  // idempotent
  EXPECT_EQ(pool.hash_of(a[1]), hashes[1]);
  expect_ok(pool, {a});
  // In use: a hit takes another reference.
  std::vector<int32_t> b = lookup(pool, hashes, tokens);
  EXPECT_EQ(b, std::vector<int32_t>({1, 2}));
  EXPECT_EQ(pool.ref_count(1), 2);
  // The same blocks computed twice: the second copy is not registered.
  std::vector<int32_t> c = take(pool, 1);
  EXPECT_FALSE(pool.register_full_block(c, 0, hashes[0], all.subspan(0, 4)));
  EXPECT_FALSE(pool.hash_of(c[0]).has_value());
  expect_ok(pool, {a, b, c});
  pool.free(a);
  pool.free(b);
  pool.free(c);
  EXPECT_EQ(pool.metrics().cached, 2);
  expect_ok(pool, {});
  // Free and cached: a hit touches them out of the free list.
  const int64_t free_before = pool.num_free();
  std::vector<int32_t> d = lookup(pool, hashes, tokens);
  EXPECT_EQ(d, std::vector<int32_t>({1, 2}));
  EXPECT_EQ(pool.num_free(), free_before - 2);
  EXPECT_EQ(pool.metrics().cached, 0);
  expect_ok(pool, {d});
  pool.free(d);
  // A miss stops the walk; a hash whose token ids differ (a collision) is a miss.
  std::vector<int32_t> other = tokens;
  other[1] += 1000;
  EXPECT_TRUE(pool.match_prefix(hashes, other).empty());
  other = tokens;
  other[5] += 1000;
  EXPECT_EQ(pool.match_prefix(hashes, other), std::vector<int32_t>({1}));
  std::vector<BlockHash> broken = hashes;
  broken[0].lo ^= 1;
  EXPECT_TRUE(pool.match_prefix(broken, tokens).empty());
  // Fewer tokens than hashes cover: only full blocks of tokens are matched.
  EXPECT_EQ(pool.match_prefix(hashes, all.first(7)), std::vector<int32_t>({1}));
}

TEST(BlockPoolDeathTest, RegisterChecksItsArguments) {
  BlockPool pool = make_pool(4, 4);
  std::vector<int32_t> a = take(pool, 1);
  const std::vector<int32_t> tokens = iota_tokens(0, 4);
  EXPECT_DEATH(pool.register_full_block(a, 0, {1, 2}, std::span(tokens).first(3)),
               "register of block 1 with 3 token ids, want 4");
  ASSERT_TRUE(pool.register_full_block(a, 0, {1, 2}, tokens));
  EXPECT_DEATH(pool.register_full_block(a, 0, {1, 3}, tokens),
               "block 1 registered again under another hash");
  pool.free(a);
  EXPECT_DEATH(pool.register_full_block(a, 0, {1, 2}, tokens), "register of free block 1");
}

TEST(BlockPool, AllocationEvictsCachedBlocksAndReportsTheirHashes) {
  BlockPool pool = make_pool(4, 2);
  std::vector<BlockHash> evicted;
  pool.set_eviction_listener([&](const BlockHash& hash) { evicted.push_back(hash); });
  std::vector<int32_t> a = take(pool, 3);
  const std::vector<int32_t> tokens = iota_tokens(7, 6);
  const std::vector<BlockHash> hashes = hash_full_blocks(model_seed_hash("m"), tokens, 2, "", "");
  for (int64_t j = 0; j < 3; ++j)
    ASSERT_TRUE(pool.register_full_block(a, j, hashes[static_cast<size_t>(j)],
                                         std::span(tokens).subspan(static_cast<size_t>(j) * 2, 2)));
  pool.free(a);  // list: 3, 2, 1 — the last block first
  EXPECT_EQ(pool.metrics().cached, 3);
  EXPECT_EQ(take(pool, 1), std::vector<int32_t>({3}));
  EXPECT_EQ(evicted, std::vector<BlockHash>({hashes[2]}));
  EXPECT_FALSE(pool.hash_of(3).has_value());
  EXPECT_EQ(pool.metrics().cached, 2);
  // The first two blocks still hit; the evicted third does not.
  std::vector<int32_t> hit = lookup(pool, hashes, tokens);
  EXPECT_EQ(hit, std::vector<int32_t>({1, 2}));
  expect_ok(pool, {{3}, hit});
  pool.free(hit);
  EXPECT_EQ(pool.evict_free_cached(), 2);
  EXPECT_EQ(evicted.size(), 3u);
  EXPECT_EQ(pool.metrics().cached, 0);
  EXPECT_TRUE(pool.match_prefix(hashes, tokens).empty());
  expect_ok(pool, {{3}});
}

TEST(BlockPool, SharedHeadOfAPromptIsEvictedLast) {
  // Two requests share a cached 2-block system prompt and add private blocks; once both are done,
  // allocation pressure evicts the private blocks first and the shared head last.
  BlockPool pool = make_pool(9, 2);
  const std::vector<int32_t> system = iota_tokens(50, 4);
  const std::vector<BlockHash> hashes = hash_full_blocks(model_seed_hash("m"), system, 2, "", "");
  std::vector<int32_t> r1 = take(pool, 4);  // 1 2 | 3 4
  ASSERT_TRUE(pool.register_full_block(r1, 0, hashes[0], std::span(system).first(2)));
  ASSERT_TRUE(pool.register_full_block(r1, 1, hashes[1], std::span(system).last(2)));
  std::vector<int32_t> r2 = lookup(pool, hashes, system);
  ASSERT_TRUE(pool.append_blocks(r2, 2).ok());  // 1 2 | 5 6
  pool.free(r1);                                // 4 3 reach 0; 1 2 still held
  pool.free(r2);                                // 6 5 2 1
  expect_ok(pool, {});
  EXPECT_EQ(take(pool, 8), std::vector<int32_t>({7, 8, 4, 3, 6, 5, 2, 1}));
}

TEST(BlockPool, CheckInvariantsNamesTheViolation) {
  BlockPool pool = make_pool(5, 4);
  std::vector<int32_t> a = take(pool, 2);
  EXPECT_EQ(pool.check_invariants({}).message(), "block 1 has ref_cnt 1 but 0 owning tables");
  EXPECT_EQ(pool.check_invariants({{a, {0}}}).message(), "table 1 holds the null block 0");
  EXPECT_EQ(pool.check_invariants({{a, {9}}}).message(), "table 1 holds block id 9 out of [1, 5)");
  EXPECT_EQ(pool.check_invariants({{a, {3}}}).message(),
            "block 3 has ref_cnt 0 but 1 owning tables");
  expect_ok(pool, {a});
}

TEST(BlockPool, MetricsAndInternalFragmentation) {
  BlockPool pool = make_pool(11, 16, 2);
  std::vector<int32_t> a = take(pool, 3);
  const BlockPoolMetrics m = pool.metrics();
  EXPECT_EQ(m.num_blocks, 11);
  EXPECT_EQ(m.used, 3);
  EXPECT_EQ(m.free, 7);
  EXPECT_EQ(m.cached, 0);
  EXPECT_EQ(m.allocatable, 5);
  EXPECT_EQ(m.reserve, 2);
  pool.free(a);
}

// A model-free fuzz of the pool (docs/serving.md §1.9, 5): requests are admitted with a prefix
// lookup, grow by decode tokens (new blocks at boundaries), fork as CacheCoordinator::fork does
// (full blocks shared, a partial last block copied into a fresh one), finish and get preempted when
// blocks run out. The test keeps its own model: each request's table and tokens (the owners), and
// what each block "holds" (the token at each row, -1 for stale rows after an allocation). After
// every operation: check_invariants, the contents of every live table equal its tokens (no block
// handed to two writers, a fork copied what it should), and every hash the pool still indexes
// matches its tokens (cached blocks reusable until evicted; evicted ones not).
class BlockPoolFuzz {
 public:
  BlockPoolFuzz(uint32_t seed, int64_t num_blocks, int64_t block_size, int64_t reserve)
      : rng_(seed), pool_(make_pool(num_blocks, block_size, reserve)), block_size_(block_size) {
    contents_.assign(static_cast<size_t>(num_blocks), {});
    pool_.set_eviction_listener([this](const BlockHash& hash) {
      const auto it = registered_.find(key(hash));
      ASSERT_NE(it, registered_.end()) << "evicted a hash never registered";
      registered_.erase(it);
      ++evictions_;
    });
    // A few shared "system prompts", so that lookups hit.
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> prompt(static_cast<size_t>(block_size * 5));
      for (int32_t& t : prompt) t = token();
      prompts_.push_back(prompt);
    }
  }

  void run(int num_ops) {
    for (int op = 0; op < num_ops; ++op) {
      SCOPED_TRACE(::testing::Message() << "op " << op);
      const int kind = pick(0, 99);
      if (kind < 25 || requests_.empty())
        admit();
      else if (kind < 75)
        decode(pick_request());
      else if (kind < 82)
        fork(pick_request());
      else if (kind < 97)
        finish(pick_request());
      else
        pool_.evict_free_cached();
      verify();
      if (::testing::Test::HasFatalFailure()) return;
    }
    while (!requests_.empty()) finish(0);
    verify();
    EXPECT_EQ(pool_.num_free(), pool_.num_blocks() - 1);  // no leak
    EXPECT_EQ(pool_.metrics().used, 0);
  }

  int64_t evictions() const { return evictions_; }
  int64_t hits() const { return hits_; }
  int64_t copies() const { return copies_; }
  int64_t preemptions() const { return preemptions_; }

 private:
  struct Request {
    std::vector<int32_t> table;
    std::vector<int32_t> tokens;
  };
  using Key = std::pair<uint64_t, uint64_t>;
  static Key key(const BlockHash& h) { return {h.lo, h.hi}; }

  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  int32_t token() { return std::uniform_int_distribution<int32_t>(0, 999)(rng_); }
  size_t pick_request() {
    return static_cast<size_t>(pick(0, static_cast<int>(requests_.size()) - 1));
  }
  int64_t num_tokens_in_blocks(size_t n) const { return static_cast<int64_t>(n) * block_size_; }

  std::vector<int32_t>& rows(int32_t block) { return contents_[static_cast<size_t>(block)]; }

  void on_allocated(std::span<const int32_t> blocks) {
    for (int32_t block : blocks) rows(block).assign(static_cast<size_t>(block_size_), -1);
  }

  void admit() {
    Request r;
    const std::vector<int32_t>& prompt = prompts_[static_cast<size_t>(pick(0, 2))];
    const auto shared = static_cast<size_t>(pick(0, static_cast<int>(prompt.size())));
    r.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(shared));
    for (int i = pick(shared == 0 ? 1 : 0, 3 * static_cast<int>(block_size_)); i > 0; --i)
      r.tokens.push_back(token());
    const std::vector<BlockHash> hashes = hash_full_blocks(seed_, r.tokens, block_size_, "", "f");
    // The last prompt token must run: cap the hit at (len - 1) rounded down to a block.
    const size_t cap = (r.tokens.size() - 1) / static_cast<size_t>(block_size_);
    r.table = lookup(pool_, std::span(hashes).first(std::min(cap, hashes.size())), r.tokens);
    hits_ += static_cast<int64_t>(r.table.size());
    for (size_t j = 0; j < r.table.size(); ++j)  // a hit holds exactly the prompt's tokens
      ASSERT_TRUE(std::equal(rows(r.table[j]).begin(), rows(r.table[j]).end(),
                             r.tokens.begin() + num_tokens_in_blocks(j)))
          << "hit block " << r.table[j] << " holds foreign tokens";
    const auto needed =
        static_cast<int64_t>((r.tokens.size() + static_cast<size_t>(block_size_) - 1) /
                             static_cast<size_t>(block_size_)) -
        static_cast<int64_t>(r.table.size());
    const int64_t free_before = pool_.num_free();
    Result<std::vector<int32_t>> fresh = pool_.allocate(needed, false);
    if (!fresh.ok()) {
      // Must be refused only for the reserve, and change nothing.
      ASSERT_GT(needed, pool_.num_allocatable(false));
      ASSERT_EQ(pool_.num_free(), free_before);
      pool_.free(r.table);  // give the hit back: not admitted
      return;
    }
    on_allocated(*fresh);
    r.table.insert(r.table.end(), fresh->begin(), fresh->end());
    // "Compute" the rows the hit did not cover, then register the full blocks.
    for (size_t pos = r.table.size() - fresh->size(); pos < r.table.size(); ++pos)
      for (int64_t row = 0; row < block_size_; ++row) {
        const auto p = static_cast<size_t>(num_tokens_in_blocks(pos) + row);
        if (p < r.tokens.size()) rows(r.table[pos])[static_cast<size_t>(row)] = r.tokens[p];
      }
    register_full(r, hashes);
    requests_.push_back(std::move(r));
  }

  void register_full(const Request& r, const std::vector<BlockHash>& hashes) {
    for (size_t j = 0; j < hashes.size(); ++j) {
      const std::span<const int32_t> block_tokens = std::span(r.tokens).subspan(
          static_cast<size_t>(num_tokens_in_blocks(j)), static_cast<size_t>(block_size_));
      const std::optional<BlockHash> had = pool_.hash_of(r.table[j]);
      if (pool_.register_full_block(r.table, static_cast<int64_t>(j), hashes[j], block_tokens) &&
          !had)
        registered_.emplace(key(hashes[j]),
                            std::vector<int32_t>(block_tokens.begin(), block_tokens.end()));
    }
  }

  void decode(size_t i) {
    Request& r = requests_[i];
    const size_t pos = r.tokens.size();
    const size_t j = pos / static_cast<size_t>(block_size_);
    if (j == r.table.size()) {
      Status grown = pool_.append_blocks(r.table, 1, /*for_running_decode=*/true);
      if (!grown.ok()) {
        ASSERT_EQ(pool_.num_free(), 0);
        preempt(i);
        return;
      }
      on_allocated(std::span(r.table).last(1));
    } else {
      // Only partial blocks are written, never a shared or a hashed one.
      ASSERT_EQ(pool_.ref_count(r.table[j]), 1);
      ASSERT_FALSE(pool_.hash_of(r.table[j]).has_value());
    }
    const int32_t t = token();
    r.tokens.push_back(t);
    rows(r.table[j])[pos % static_cast<size_t>(block_size_)] = t;
    if (r.tokens.size() % static_cast<size_t>(block_size_) == 0)
      register_full(r, hash_full_blocks(seed_, r.tokens, block_size_, "", "f"));
  }

  void fork(size_t i) {
    const Request& parent = requests_[i];
    const size_t num_full = parent.tokens.size() / static_cast<size_t>(block_size_);
    const bool partial = num_full < parent.table.size();
    if (partial && pool_.num_allocatable() < 1) return;  // no room: no fork
    Request child{.table = {}, .tokens = parent.tokens};
    child.table.assign(parent.table.begin(),
                       parent.table.begin() + static_cast<std::ptrdiff_t>(num_full));
    pool_.fork(child.table);
    if (partial) {
      ASSERT_TRUE(pool_.append_blocks(child.table, 1).ok());
      on_allocated(std::span(child.table).last(1));
      std::copy_n(rows(parent.table[num_full]).begin(),
                  parent.tokens.size() % static_cast<size_t>(block_size_),
                  rows(child.table.back()).begin());
      ++copies_;
    }
    requests_.push_back(std::move(child));
  }

  void finish(size_t i) {
    pool_.free(requests_[i].table);
    requests_.erase(requests_.begin() + static_cast<std::ptrdiff_t>(i));
  }

  // Out of blocks: preempt (by recompute) the newest other request, or this one if alone.
  void preempt(size_t i) {
    ++preemptions_;
    finish(requests_.size() - 1 == i ? i : requests_.size() - 1);
  }

  void verify() {
    std::vector<std::vector<int32_t>> tables;
    for (const Request& r : requests_) tables.push_back(r.table);
    const Status status = pool_.check_invariants(tables);
    ASSERT_TRUE(status.ok()) << status.to_string();
    for (const Request& r : requests_) {
      ASSERT_EQ(r.table.size(), (r.tokens.size() + static_cast<size_t>(block_size_) - 1) /
                                    static_cast<size_t>(block_size_));
      for (size_t p = 0; p < r.tokens.size(); ++p)
        ASSERT_EQ(rows(r.table[p / static_cast<size_t>(block_size_)])[p % static_cast<size_t>(
                                                                              block_size_)],
                  r.tokens[p])
            << "position " << p;
    }
    for (const auto& [k, tokens] : registered_) {
      const BlockHash hash{.lo = k.first, .hi = k.second};
      const std::vector<int32_t> hit = pool_.match_prefix(std::span(&hash, 1), tokens);
      ASSERT_EQ(hit.size(), 1u) << "a registered hash no longer matches";
      ASSERT_EQ(rows(hit[0]), tokens);
    }
    const BlockPoolMetrics m = pool_.metrics();
    ASSERT_EQ(m.used + m.free, m.num_blocks - 1);
    ASSERT_LE(m.cached, static_cast<int64_t>(registered_.size()));
  }

  std::mt19937 rng_;
  BlockPool pool_;
  int64_t block_size_;
  BlockHash seed_ = model_seed_hash("fuzz");
  std::vector<std::vector<int32_t>> prompts_;
  std::vector<Request> requests_;
  std::vector<std::vector<int32_t>> contents_;      // per block: the token of each row
  std::map<Key, std::vector<int32_t>> registered_;  // hashes the pool indexes, with their tokens
  int64_t evictions_ = 0;
  int64_t hits_ = 0;
  int64_t copies_ = 0;
  int64_t preemptions_ = 0;
};

TEST(BlockPool, RandomOperationsKeepEveryInvariant) {
  int64_t evictions = 0, hits = 0, copies = 0, preemptions = 0;
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    // Small pools so that eviction, the reserve and preemption all happen.
    BlockPoolFuzz fuzz(seed, 24 + 8 * seed, seed % 2 == 0 ? 4 : 2, seed % 3);
    fuzz.run(4000);
    if (::testing::Test::HasFatalFailure()) return;
    evictions += fuzz.evictions();
    hits += fuzz.hits();
    copies += fuzz.copies();
    preemptions += fuzz.preemptions();
  }
  std::printf("evictions %lld hits %lld copies %lld preemptions %lld\n",
              static_cast<long long>(evictions), static_cast<long long>(hits),
              static_cast<long long>(copies), static_cast<long long>(preemptions));
  // The run exercised every path.
  EXPECT_GT(evictions, 100);
  EXPECT_GT(hits, 100);
  EXPECT_GT(copies, 20);
  EXPECT_GT(preemptions, 20);
}

}  // namespace block_pool_test
}  // namespace dz::cache
