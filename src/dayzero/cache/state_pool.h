#pragma once
// The recurrent-state slot pool of docs/serving.md §1.6-§1.7. Slot ids index a KvCache's KDA state
// pool; slot 0 is the null slot and never handed out. The pool is split once, at creation: max_live
// live slots (one per running request, reserved up front so admission never waits for one) and
// max_checkpoints checkpoint slots owned by the prefix cache, each holding the state after the
// block keyed by a BlockHash. Checkpoints have their own LRU list and a pin count held while
// copying. Single-threaded: the cache coordinator owns it.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "dayzero/cache/prefix_hash.h"
#include "dayzero/core/status.h"

namespace dz::cache {

// Copies every KDA layer's state and conv rows of slot `from` into slot `to`
// (the engine: through CausalLm::copy_state_slot); tests pass their own.
using StateCopyFn = std::function<void(int32_t from, int32_t to)>;

struct StatePoolMetrics {
  int32_t live_used = 0;
  int32_t live_free = 0;
  int32_t checkpoints_used = 0;
  int32_t checkpoints_free = 0;
  int64_t checkpoint_saves = 0;      // state copies into a new checkpoint
  int64_t checkpoint_evictions = 0;  // LRU evictions to make room for a save
  int64_t checkpoint_hits = 0;       // restores into a live slot
};

class StatePool {
 public:
  // num_state_slots: the cache's slot count, null slot included; 1 + max_live + max_checkpoints
  // of them are used. Slots [1, 1 + max_live) are live, the next max_checkpoints checkpoints.
  static Result<StatePool> create(int32_t num_state_slots, int32_t max_live,
                                  int32_t max_checkpoints, StateCopyFn copy);

  // A free live slot; kResourceExhausted when all max_live are taken. Its contents are stale:
  // the caller runs the sequence from position 0 (zero state) or restores a checkpoint into it.
  Result<int32_t> acquire_live();
  // Aborts naming the slot when it is not a live slot currently held.
  void release_live(int32_t slot);
  // n > 1: a new live slot holding a copy of `parent`'s state (CacheCoordinator::fork).
  Result<int32_t> fork_live(int32_t parent);

  // Keeps the state of `live_slot`, which has consumed tokens [0, position), under `key`, the
  // hash of the block ending at `position`. Evicts the least recently used unpinned checkpoint
  // when none is free. A key already saved is only touched (the same chain hash means the same
  // tokens, hence the same state); its position must agree. kResourceExhausted when every
  // checkpoint slot is pinned or there are none. `source`, when given, holds that state instead of
  // live_slot (a speculative row's snapshot: a slot of the cache outside this pool).
  Status save_checkpoint(int32_t live_slot, const BlockHash& key, int64_t position,
                         std::optional<int32_t> source = std::nullopt);
  // The index of the deepest hash in `chain` (block hashes of a prompt, first block first,
  // already cut to the KV hit) that has a checkpoint; none when no block has one. A hybrid
  // model's hit is (index + 1) blocks, i.e. checkpoint_position() tokens (docs/serving.md §1.7).
  std::optional<size_t> find_deepest(std::span<const BlockHash> chain) const;
  std::optional<int64_t> checkpoint_position(const BlockHash& key) const;
  // Copies the checkpoint under `key` into `live_slot` (pinned while copying) and marks it most
  // recently used. kNotFound when there is no such checkpoint.
  Status restore(const BlockHash& key, int32_t live_slot);
  // Frees the checkpoint under `key`, if any (its KV block is being evicted). Returns whether
  // one was freed. Aborts when it is pinned.
  bool release_checkpoint(const BlockHash& key);
  // Pins keep a checkpoint from eviction and release while an asynchronous copy reads it.
  // Both abort when there is no checkpoint under `key`; unpin also when it is not pinned.
  void pin(const BlockHash& key);
  void unpin(const BlockHash& key);

  bool is_live(int32_t slot) const;
  int32_t max_live() const { return max_live_; }
  int32_t max_checkpoints() const { return max_checkpoints_; }
  StatePoolMetrics metrics() const;

  // kInternal naming the first broken rule: live and checkpoint slots partition their ranges
  // with the free lists (each free slot listed once, no slot both live and checkpoint), each
  // checkpoint key is indexed once and names its slot, the LRU list holds exactly the
  // checkpoints. The second form also checks that `owned_live_slots` (every running request's
  // slot) are exactly the live slots, each with one owner.
  Status check_invariants() const;
  Status check_invariants(std::span<const int32_t> owned_live_slots) const;

 private:
  enum class Role : unsigned char {
    kNull,
    kUnused,
    kLiveFree,
    kLive,
    kCheckpointFree,
    kCheckpoint
  };

  StatePool(int32_t num_state_slots, int32_t max_live, int32_t max_checkpoints, StateCopyFn copy);

  int32_t checkpoint_slot(const BlockHash& key, const char* op) const;
  void lru_unlink(int32_t slot);
  void lru_push_back(int32_t slot);  // most recently used at the back
  void free_checkpoint_slot(int32_t slot);

  int32_t num_state_slots_;
  int32_t max_live_;
  int32_t max_checkpoints_;
  StateCopyFn copy_;

  std::vector<Role> role_;          // [num_state_slots]
  std::vector<int32_t> free_live_;  // stack of free live slots
  std::vector<int32_t> free_ckpt_;  // stack of free checkpoint slots
  std::vector<BlockHash> key_;      // [num_state_slots] key of a checkpoint slot
  std::vector<int64_t> position_;   // [num_state_slots] tokens folded into a checkpoint
  std::vector<int32_t> pins_;       // [num_state_slots]
  // Intrusive doubly linked LRU list over checkpoint slots; slot 0 (null) is the sentinel,
  // lru_next_[0] the least recently used.
  std::vector<int32_t> lru_prev_;
  std::vector<int32_t> lru_next_;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;  // key -> checkpoint slot

  int64_t saves_ = 0;
  int64_t evictions_ = 0;
  int64_t hits_ = 0;
};

}  // namespace dz::cache
