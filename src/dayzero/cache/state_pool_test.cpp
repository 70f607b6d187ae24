#include "dayzero/cache/state_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "dayzero/model/kv_cache.h"

namespace dz::cache {
namespace state_pool_test {

// A stand-in for the KDA state pool: one value per slot, copied by the pool's copy function.
struct FakeStates {
  std::vector<uint64_t> value;
  int64_t num_copies = 0;

  explicit FakeStates(int32_t num_slots) : value(static_cast<size_t>(num_slots), 0) {}
  StateCopyFn copier() {
    return [this](int32_t from, int32_t to) {
      value.at(static_cast<size_t>(to)) = value.at(static_cast<size_t>(from));
      ++num_copies;
    };
  }
  uint64_t& at(int32_t slot) { return value.at(static_cast<size_t>(slot)); }
};

BlockHash key(uint64_t i) {
  return {.lo = i * 0x9E3779B97F4A7C15ull, .hi = i};
}

StatePool make_pool(FakeStates& states, int32_t max_live, int32_t max_checkpoints) {
  Result<StatePool> pool = StatePool::create(static_cast<int32_t>(states.value.size()), max_live,
                                             max_checkpoints, states.copier());
  EXPECT_TRUE(pool.ok()) << pool.status().to_string();
  return std::move(pool).value();
}

TEST(StatePool, CreateRefusesBadSizes) {
  FakeStates states(4);
  EXPECT_EQ(StatePool::create(4, 2, 2, states.copier()).status().message(),
            "state pool: 2 live + 2 checkpoint slots need 5 state slots (slot 0 is null), the "
            "cache has 4");
  EXPECT_EQ(StatePool::create(4, -1, 0, states.copier()).status().message(),
            "state pool: max_live -1 and max_checkpoints 0 must not be negative");
  EXPECT_EQ(StatePool::create(4, 1, 1, nullptr).status().message(), "state pool: no copy function");
  EXPECT_EQ(StatePool::create(4, 2, 2, states.copier()).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(StatePool::create(4, 2, 1, states.copier()).ok());
}

TEST(StatePool, AcquireAndReleaseLiveSlots) {
  FakeStates states(6);
  StatePool pool = make_pool(states, 2, 2);
  EXPECT_EQ(pool.metrics().live_free, 2);
  Result<int32_t> a = pool.acquire_live();
  Result<int32_t> b = pool.acquire_live();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, 1);  // never the null slot 0
  EXPECT_EQ(*b, 2);
  EXPECT_TRUE(pool.is_live(1) && pool.is_live(2));
  EXPECT_FALSE(pool.is_live(0) || pool.is_live(3) || pool.is_live(-1) || pool.is_live(6));
  Result<int32_t> c = pool.acquire_live();
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(c.status().message(), "state pool: all 2 live slots are taken");
  EXPECT_EQ(pool.metrics().live_used, 2);
  EXPECT_EQ(pool.metrics().live_free, 0);
  EXPECT_TRUE(pool.check_invariants(std::vector<int32_t>{1, 2}).ok());
  pool.release_live(1);
  EXPECT_FALSE(pool.is_live(1));
  EXPECT_EQ(pool.metrics().live_used, 1);
  EXPECT_EQ(*pool.acquire_live(), 1);
  EXPECT_TRUE(pool.check_invariants(std::vector<int32_t>{2, 1}).ok());
}

TEST(StatePoolDeathTest, ReleasingASlotNotHeldAborts) {
  FakeStates states(6);
  StatePool pool = make_pool(states, 2, 2);
  const int32_t slot = *pool.acquire_live();
  pool.release_live(slot);
  EXPECT_DEATH(pool.release_live(slot), "release_live: state slot 1 is not a live slot in use");
  EXPECT_DEATH(pool.release_live(0), "release_live: state slot 0 is not a live slot in use");
  EXPECT_DEATH(pool.release_live(3), "release_live: state slot 3 is not a live slot in use");
  EXPECT_DEATH(pool.release_live(9), "release_live: state slot 9 is not a live slot in use");
  EXPECT_DEATH((void)pool.fork_live(2), "fork_live: state slot 2 is not a live slot in use");
  EXPECT_DEATH((void)pool.save_checkpoint(2, key(1), 16),
               "save_checkpoint: state slot 2 is not a live slot in use");
  EXPECT_DEATH((void)pool.restore(key(1), 2), "restore: state slot 2 is not a live slot in use");
}

TEST(StatePool, ForkCopiesTheParentState) {
  FakeStates states(5);
  StatePool pool = make_pool(states, 3, 1);
  const int32_t parent = *pool.acquire_live();
  states.at(parent) = 0xABCD;
  Result<int32_t> child = pool.fork_live(parent);
  ASSERT_TRUE(child.ok());
  EXPECT_NE(*child, parent);
  EXPECT_TRUE(pool.is_live(*child));
  EXPECT_EQ(states.at(*child), 0xABCDu);
  ASSERT_TRUE(pool.fork_live(parent).ok());
  Result<int32_t> none = pool.fork_live(parent);
  EXPECT_EQ(none.status().message(), "state pool: all 3 live slots are taken");
  EXPECT_EQ(states.num_copies, 2);
}

TEST(StatePool, SaveFindRestore) {
  FakeStates states(5);
  StatePool pool = make_pool(states, 2, 2);
  const int32_t live = *pool.acquire_live();
  const std::vector<BlockHash> chain = {key(1), key(2), key(3), key(4)};
  EXPECT_EQ(pool.find_deepest(chain), std::nullopt);
  EXPECT_EQ(pool.find_deepest({}), std::nullopt);

  states.at(live) = 111;
  ASSERT_TRUE(pool.save_checkpoint(live, key(1), 16).ok());
  states.at(live) = 333;
  ASSERT_TRUE(pool.save_checkpoint(live, key(3), 48).ok());
  EXPECT_EQ(pool.find_deepest(chain), 2u);
  EXPECT_EQ(pool.find_deepest(std::span(chain).first(2)), 0u);  // the KV hit stops at block 1
  EXPECT_EQ(pool.checkpoint_position(key(3)), 48);
  EXPECT_EQ(pool.checkpoint_position(key(2)), std::nullopt);

  states.at(live) = 999;
  ASSERT_TRUE(pool.restore(key(1), live).ok());
  EXPECT_EQ(states.at(live), 111u);
  ASSERT_TRUE(pool.restore(key(3), live).ok());
  EXPECT_EQ(states.at(live), 333u);
  Status miss = pool.restore(key(2), live);
  EXPECT_EQ(miss.code(), StatusCode::kNotFound);
  EXPECT_EQ(miss.message(), "state pool: no checkpoint for block 00000000000000023c6ef372fe94f82a");

  // Saving a key again only touches it: no copy, the first state stays.
  const int64_t copies = states.num_copies;
  states.at(live) = 777;
  ASSERT_TRUE(pool.save_checkpoint(live, key(1), 16).ok());
  EXPECT_EQ(states.num_copies, copies);
  ASSERT_TRUE(pool.restore(key(1), live).ok());
  EXPECT_EQ(states.at(live), 111u);

  StatePoolMetrics m = pool.metrics();
  EXPECT_EQ(m.checkpoints_used, 2);
  EXPECT_EQ(m.checkpoints_free, 0);
  EXPECT_EQ(m.checkpoint_saves, 2);
  EXPECT_EQ(m.checkpoint_hits, 3);
  EXPECT_EQ(m.checkpoint_evictions, 0);
  EXPECT_TRUE(pool.check_invariants(std::vector<int32_t>{live}).ok());

  EXPECT_TRUE(pool.release_checkpoint(key(3)));
  EXPECT_FALSE(pool.release_checkpoint(key(3)));
  EXPECT_FALSE(pool.release_checkpoint(key(2)));
  EXPECT_EQ(pool.find_deepest(chain), 0u);
  EXPECT_EQ(pool.metrics().checkpoints_free, 1);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(StatePool, EvictsTheLeastRecentlyUsedCheckpoint) {
  FakeStates states(5);
  StatePool pool = make_pool(states, 1, 3);
  const int32_t live = *pool.acquire_live();
  for (uint64_t i = 1; i <= 3; ++i) {
    states.at(live) = i;
    ASSERT_TRUE(pool.save_checkpoint(live, key(i), static_cast<int64_t>(16 * i)).ok());
  }
  ASSERT_TRUE(pool.restore(key(1), live).ok());              // 1 becomes most recent: LRU 2, 3, 1
  ASSERT_TRUE(pool.save_checkpoint(live, key(3), 48).ok());  // touch: LRU 2, 1, 3
  ASSERT_TRUE(pool.save_checkpoint(live, key(4), 64).ok());  // evicts 2
  EXPECT_EQ(pool.checkpoint_position(key(2)), std::nullopt);
  ASSERT_TRUE(pool.save_checkpoint(live, key(5), 80).ok());  // evicts 1
  EXPECT_EQ(pool.checkpoint_position(key(1)), std::nullopt);
  EXPECT_EQ(pool.checkpoint_position(key(3)), 48);
  EXPECT_EQ(pool.metrics().checkpoint_evictions, 2);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(StatePool, PinnedCheckpointsAreNotEvicted) {
  FakeStates states(4);
  StatePool pool = make_pool(states, 1, 2);
  const int32_t live = *pool.acquire_live();
  ASSERT_TRUE(pool.save_checkpoint(live, key(1), 16).ok());
  ASSERT_TRUE(pool.save_checkpoint(live, key(2), 32).ok());
  pool.pin(key(1));  // the LRU one
  ASSERT_TRUE(pool.save_checkpoint(live, key(3), 48).ok());
  EXPECT_EQ(pool.checkpoint_position(key(1)), 16);
  EXPECT_EQ(pool.checkpoint_position(key(2)), std::nullopt);
  pool.pin(key(3));
  Status full = pool.save_checkpoint(live, key(4), 64);
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(full.message(),
            "state pool: no checkpoint slot for block 000000000000000478dde6e5fd29f054 (2 slots, "
            "all pinned)");
  EXPECT_TRUE(pool.check_invariants().ok());
  pool.unpin(key(3));
  pool.unpin(key(1));
  ASSERT_TRUE(pool.save_checkpoint(live, key(4), 64).ok());  // evicts 1, the LRU
  EXPECT_EQ(pool.checkpoint_position(key(1)), std::nullopt);
  EXPECT_TRUE(pool.check_invariants().ok());
}

TEST(StatePool, NoCheckpointSlots) {
  FakeStates states(2);
  StatePool pool = make_pool(states, 1, 0);
  const int32_t live = *pool.acquire_live();
  Status s = pool.save_checkpoint(live, key(1), 16);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(s.message(),
            "state pool: no checkpoint slot for block 00000000000000019e3779b97f4a7c15 "
            "(max_checkpoints is 0)");
  EXPECT_EQ(pool.find_deepest(std::vector<BlockHash>{key(1)}), std::nullopt);
}

TEST(StatePoolDeathTest, PinsAndPositionsAreChecked) {
  FakeStates states(4);
  StatePool pool = make_pool(states, 1, 2);
  const int32_t live = *pool.acquire_live();
  ASSERT_TRUE(pool.save_checkpoint(live, key(1), 16).ok());
  EXPECT_DEATH(pool.pin(key(2)), "pin: no checkpoint for block 00000000000000023c6ef372fe94f82a");
  EXPECT_DEATH(pool.unpin(key(1)),
               "unpin: checkpoint slot 2 of block 00000000000000019e3779b97f4a7c15 is not pinned");
  EXPECT_DEATH((void)pool.save_checkpoint(live, key(1), 32),
               "save_checkpoint: block 00000000000000019e3779b97f4a7c15 has a checkpoint at "
               "position 16, not 32");
  pool.pin(key(1));
  EXPECT_DEATH((void)pool.release_checkpoint(key(1)),
               "release_checkpoint: checkpoint slot 2 of block 00000000000000019e3779b97f4a7c15 "
               "is pinned");
}

TEST(StatePool, CheckInvariantsComparesOwners) {
  FakeStates states(5);
  StatePool pool = make_pool(states, 3, 1);
  const int32_t a = *pool.acquire_live();
  const int32_t b = *pool.acquire_live();
  EXPECT_TRUE(pool.check_invariants(std::vector<int32_t>{a, b}).ok());
  Status leak = pool.check_invariants(std::vector<int32_t>{a});
  EXPECT_EQ(leak.code(), StatusCode::kInternal);
  EXPECT_EQ(leak.message(), "state pool: 2 live slots in use, 1 owned (leak)");
  EXPECT_EQ(pool.check_invariants(std::vector<int32_t>{a, a}).message(),
            "state pool: live slot 1 has two owners");
  EXPECT_EQ(pool.check_invariants(std::vector<int32_t>{a, 3}).message(),
            "state pool: an owner holds slot 3, not live");
  EXPECT_EQ(pool.check_invariants(std::vector<int32_t>{a, 4}).message(),
            "state pool: an owner holds slot 4, not live");
}

// A model of the pool: owned live slots, checkpoints with their state value and position, the
// LRU order (front = least recent) and pins. Every operation is applied to both and compared.
struct Model {
  std::vector<int32_t> live;
  std::map<uint64_t, std::pair<uint64_t, int64_t>> checkpoints;  // key id -> (value, position)
  std::vector<uint64_t> lru;
  std::map<uint64_t, int> pins;

  void touch(uint64_t k) {
    lru.erase(std::find(lru.begin(), lru.end(), k));
    lru.push_back(k);
  }
  void erase(uint64_t k) {
    checkpoints.erase(k);
    lru.erase(std::find(lru.begin(), lru.end(), k));
  }
};

void run_random_ops(uint32_t seed, int32_t max_live, int32_t max_checkpoints, int num_ops) {
  SCOPED_TRACE(testing::Message() << "seed " << seed << ", " << max_live << " live, "
                                  << max_checkpoints << " checkpoints");
  std::mt19937_64 rng(seed);
  auto uniform = [&rng](uint64_t n) {
    return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng);
  };
  FakeStates states(1 + max_live + max_checkpoints + 1);  // one slot left unused
  StatePool pool = make_pool(states, max_live, max_checkpoints);
  Model model;
  const uint64_t num_keys = static_cast<uint64_t>(2 * max_checkpoints + 3);
  int64_t hits = 0;
  int64_t evictions = 0;

  for (int op = 0; op < num_ops; ++op) {
    SCOPED_TRACE(testing::Message() << "op " << op);
    const uint64_t k = 1 + uniform(num_keys);
    const uint64_t kind = uniform(9);
    if (kind == 0) {  // admit
      Result<int32_t> slot = pool.acquire_live();
      if (static_cast<int32_t>(model.live.size()) == max_live) {
        ASSERT_EQ(slot.status().code(), StatusCode::kResourceExhausted);
      } else {
        ASSERT_TRUE(slot.ok());
        model.live.push_back(*slot);
        states.at(*slot) = rng();
      }
    } else if (kind == 1 && !model.live.empty()) {  // finish or preempt
      const size_t i = uniform(model.live.size());
      pool.release_live(model.live[i]);
      model.live.erase(model.live.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (kind == 2 && !model.live.empty()) {  // n > 1
      const int32_t parent = model.live[uniform(model.live.size())];
      Result<int32_t> child = pool.fork_live(parent);
      if (static_cast<int32_t>(model.live.size()) == max_live) {
        ASSERT_EQ(child.status().code(), StatusCode::kResourceExhausted);
      } else {
        ASSERT_TRUE(child.ok());
        ASSERT_EQ(states.at(*child), states.at(parent));
        model.live.push_back(*child);
      }
    } else if (kind == 3 && !model.live.empty()) {  // a step advances a state
      states.at(model.live[uniform(model.live.size())]) = rng();
    } else if (kind == 4 && !model.live.empty()) {  // save
      const int32_t slot = model.live[uniform(model.live.size())];
      const int64_t position = static_cast<int64_t>(16 * k);
      Status s = pool.save_checkpoint(slot, key(k), position);
      if (model.checkpoints.contains(k)) {
        ASSERT_TRUE(s.ok());
        model.touch(k);
      } else {
        if (static_cast<int32_t>(model.checkpoints.size()) == max_checkpoints) {
          auto victim = std::find_if(model.lru.begin(), model.lru.end(),
                                     [&](uint64_t c) { return model.pins[c] == 0; });
          if (victim == model.lru.end()) {
            ASSERT_EQ(s.code(), StatusCode::kResourceExhausted);
            continue;
          }
          model.erase(*victim);
          ++evictions;
        }
        ASSERT_TRUE(s.ok()) << s.to_string();
        model.checkpoints[k] = {states.at(slot), position};
        model.lru.push_back(k);
      }
    } else if (kind == 5 && !model.live.empty()) {  // restore
      const int32_t slot = model.live[uniform(model.live.size())];
      Status s = pool.restore(key(k), slot);
      if (!model.checkpoints.contains(k)) {
        ASSERT_EQ(s.code(), StatusCode::kNotFound);
      } else {
        ASSERT_TRUE(s.ok());
        ASSERT_EQ(states.at(slot), model.checkpoints[k].first);
        model.touch(k);
        ++hits;
      }
    } else if (kind == 6) {  // the KV block under k is evicted
      const bool had = model.checkpoints.contains(k);
      if (had && model.pins[k] > 0) continue;
      ASSERT_EQ(pool.release_checkpoint(key(k)), had);
      if (had) model.erase(k);
    } else if (kind == 7) {  // pin or unpin
      if (!model.checkpoints.contains(k)) continue;
      if (model.pins[k] > 0 && uniform(2) == 0) {
        pool.unpin(key(k));
        --model.pins[k];
      } else if (model.pins[k] < 2) {
        pool.pin(key(k));
        ++model.pins[k];
      }
    } else if (kind == 8) {  // lookup of a random chain
      std::vector<BlockHash> chain;
      std::optional<size_t> want;
      for (uint64_t i = 0, n = uniform(6); i < n; ++i) {
        const uint64_t c = 1 + uniform(num_keys);
        if (model.checkpoints.contains(c)) want = chain.size();
        chain.push_back(key(c));
      }
      ASSERT_EQ(pool.find_deepest(chain), want);
      if (want) {
        ASSERT_EQ(pool.checkpoint_position(chain[*want]),
                  model.checkpoints[chain[*want].hi].second);
      }
    }
    Status inv = pool.check_invariants(model.live);
    ASSERT_TRUE(inv.ok()) << inv.to_string();
    const StatePoolMetrics m = pool.metrics();
    ASSERT_EQ(m.live_used, static_cast<int32_t>(model.live.size()));
    ASSERT_EQ(m.live_free, max_live - m.live_used);
    ASSERT_EQ(m.checkpoints_used, static_cast<int32_t>(model.checkpoints.size()));
    ASSERT_EQ(m.checkpoints_free, max_checkpoints - m.checkpoints_used);
    ASSERT_EQ(m.checkpoint_hits, hits);
    ASSERT_EQ(m.checkpoint_evictions, evictions);
    ASSERT_EQ(states.at(0), 0u);  // the null slot is never written
  }
  // The mix reached the interesting paths.
  if (max_checkpoints > 0 && num_ops >= 2000) {
    EXPECT_GT(hits, 0);
    EXPECT_GT(evictions, 0);
  }
  // Drain: every slot goes back.
  for (int32_t slot : model.live) pool.release_live(slot);
  for (uint64_t k = 1; k <= num_keys; ++k) {
    for (; model.pins[k] > 0; --model.pins[k]) pool.unpin(key(k));
    pool.release_checkpoint(key(k));
  }
  ASSERT_TRUE(pool.check_invariants(std::span<const int32_t>{}).ok());
  EXPECT_EQ(pool.metrics().live_free, max_live);
  EXPECT_EQ(pool.metrics().checkpoints_free, max_checkpoints);
}

TEST(StatePool, RandomOperationsKeepInvariants) {
  for (uint32_t seed = 1; seed <= 4; ++seed) run_random_ops(seed, 4, 8, 3000);
  run_random_ops(11, 1, 1, 2000);
  run_random_ops(12, 8, 2, 3000);
  run_random_ops(13, 3, 0, 1000);
}

// The real KDA state pool: save -> overwrite the live slot -> restore is bit-exact.
TEST(StatePool, CheckpointsOfARealKvCache) {
  const std::vector<model::LayerCacheSpec> layers = {
      {.kda = {.num_heads = 2, .head_dim = 8, .conv_width = 4}},
      {.kda = {.num_heads = 2, .head_dim = 8, .conv_width = 4}}};
  Result<model::KvCache> cache = model::KvCache::create(layers, 1, 16, 1 + 2 + 2);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  Result<StatePool> created =
      StatePool::create(static_cast<int32_t>(cache->num_state_slots()), 2, 2,
                        [&](int32_t from, int32_t to) { cache->copy_state_slot(from, to); });
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  StatePool pool = std::move(created).value();

  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  // Fills a slot of every KDA layer with random states and conv codes; returns its bytes.
  auto fill = [&](int32_t slot) {
    for (int layer = 0; layer < 2; ++layer) {
      model::KdaLayerState st = cache->kda_layer(layer);
      float* s = st.state(slot);
      uint16_t* c = st.conv_rows(slot);
      for (int64_t i = 0; i < st.layout.state_floats(); ++i) s[i] = normal(rng);
      for (int64_t i = 0; i < st.layout.conv_elems(); ++i) c[i] = static_cast<uint16_t>(rng());
    }
  };
  auto snapshot = [&](int32_t slot) {
    std::vector<unsigned char> bytes;
    for (int layer = 0; layer < 2; ++layer) {
      model::KdaLayerState st = cache->kda_layer(layer);
      const auto* s = reinterpret_cast<const unsigned char*>(st.state(slot));
      const auto* c = reinterpret_cast<const unsigned char*>(st.conv_rows(slot));
      bytes.insert(bytes.end(), s, s + st.layout.state_floats() * 4);
      bytes.insert(bytes.end(), c, c + st.layout.conv_elems() * 2);
    }
    return bytes;
  };

  const int32_t live = *pool.acquire_live();
  const int32_t other = *pool.acquire_live();
  fill(live);
  const std::vector<unsigned char> at_a = snapshot(live);
  ASSERT_TRUE(pool.save_checkpoint(live, key(1), 64).ok());
  fill(live);
  const std::vector<unsigned char> at_b = snapshot(live);
  ASSERT_NE(at_a, at_b);
  ASSERT_TRUE(pool.save_checkpoint(live, key(2), 128).ok());
  fill(live);
  ASSERT_TRUE(pool.restore(key(1), live).ok());
  EXPECT_EQ(snapshot(live), at_a);
  ASSERT_TRUE(pool.restore(key(2), other).ok());
  EXPECT_EQ(snapshot(other), at_b);

  // LRU: key 1 was restored before key 2, so key 1 is the one evicted by a third save.
  fill(live);
  const std::vector<unsigned char> at_c = snapshot(live);
  ASSERT_TRUE(pool.save_checkpoint(live, key(3), 192).ok());
  EXPECT_EQ(pool.restore(key(1), other).code(), StatusCode::kNotFound);
  ASSERT_TRUE(pool.restore(key(3), other).ok());
  EXPECT_EQ(snapshot(other), at_c);
  ASSERT_TRUE(pool.restore(key(2), live).ok());
  EXPECT_EQ(snapshot(live), at_b);

  // Fork copies the live state bit-exactly.
  pool.release_live(other);
  Result<int32_t> child = pool.fork_live(live);
  ASSERT_TRUE(child.ok());
  EXPECT_EQ(snapshot(*child), at_b);
  EXPECT_TRUE(pool.check_invariants(std::vector<int32_t>{live, *child}).ok());
}

}  // namespace state_pool_test
}  // namespace dz::cache
