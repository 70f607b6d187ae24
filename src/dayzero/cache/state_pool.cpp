#include "dayzero/cache/state_pool.h"

#include <utility>

#include "dayzero/core/check.h"

namespace dz::cache {

namespace {

// For messages: the hash as 32 hex digits, high half first.
std::string hex(const BlockHash& h) {
  return fmt::format("{:016x}{:016x}", h.hi, h.lo);
}

}  // namespace

Result<StatePool> StatePool::create(int32_t num_state_slots, int32_t max_live,
                                    int32_t max_checkpoints, StateCopyFn copy) {
  if (max_live < 0 || max_checkpoints < 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "state pool: max_live {} and max_checkpoints {} must not be negative",
                      max_live, max_checkpoints);
  }
  const int64_t needed = int64_t{1} + max_live + max_checkpoints;
  if (needed > num_state_slots) {
    return make_error(StatusCode::kInvalidArgument,
                      "state pool: {} live + {} checkpoint slots need {} state slots (slot 0 is "
                      "null), the cache has {}",
                      max_live, max_checkpoints, needed, num_state_slots);
  }
  if (!copy) return make_error(StatusCode::kInvalidArgument, "state pool: no copy function");
  return StatePool(num_state_slots, max_live, max_checkpoints, std::move(copy));
}

StatePool::StatePool(int32_t num_state_slots, int32_t max_live, int32_t max_checkpoints,
                     StateCopyFn copy)
    : num_state_slots_(num_state_slots),
      max_live_(max_live),
      max_checkpoints_(max_checkpoints),
      copy_(std::move(copy)) {
  const auto n = static_cast<size_t>(num_state_slots);
  role_.assign(n, Role::kUnused);
  key_.assign(n, BlockHash{});
  position_.assign(n, 0);
  pins_.assign(n, 0);
  lru_prev_.assign(n, 0);
  lru_next_.assign(n, 0);
  if (n > 0) role_[0] = Role::kNull;
  // Stacks pop from the back: hand out the lowest ids first.
  for (int32_t s = max_live; s >= 1; --s) {
    role_[static_cast<size_t>(s)] = Role::kLiveFree;
    free_live_.push_back(s);
  }
  for (int32_t s = max_live + max_checkpoints; s > max_live; --s) {
    role_[static_cast<size_t>(s)] = Role::kCheckpointFree;
    free_ckpt_.push_back(s);
  }
}

Result<int32_t> StatePool::acquire_live() {
  if (free_live_.empty()) {
    return make_error(StatusCode::kResourceExhausted, "state pool: all {} live slots are taken",
                      max_live_);
  }
  const int32_t slot = free_live_.back();
  free_live_.pop_back();
  role_[static_cast<size_t>(slot)] = Role::kLive;
  return slot;
}

bool StatePool::is_live(int32_t slot) const {
  return slot >= 0 && slot < num_state_slots_ && role_[static_cast<size_t>(slot)] == Role::kLive;
}

void StatePool::release_live(int32_t slot) {
  DZ_CHECK(is_live(slot), "release_live: state slot {} is not a live slot in use", slot);
  role_[static_cast<size_t>(slot)] = Role::kLiveFree;
  free_live_.push_back(slot);
}

Result<int32_t> StatePool::fork_live(int32_t parent) {
  DZ_CHECK(is_live(parent), "fork_live: state slot {} is not a live slot in use", parent);
  DZ_ASSIGN_OR_RETURN(const int32_t child, acquire_live());
  copy_(parent, child);
  return child;
}

void StatePool::lru_unlink(int32_t slot) {
  const auto s = static_cast<size_t>(slot);
  lru_next_[static_cast<size_t>(lru_prev_[s])] = lru_next_[s];
  lru_prev_[static_cast<size_t>(lru_next_[s])] = lru_prev_[s];
  lru_prev_[s] = lru_next_[s] = 0;
}

void StatePool::lru_push_back(int32_t slot) {
  const auto s = static_cast<size_t>(slot);
  const int32_t last = lru_prev_[0];
  lru_prev_[s] = last;
  lru_next_[s] = 0;
  lru_next_[static_cast<size_t>(last)] = slot;
  lru_prev_[0] = slot;
}

void StatePool::free_checkpoint_slot(int32_t slot) {
  const auto s = static_cast<size_t>(slot);
  lru_unlink(slot);
  index_.erase(key_[s]);
  key_[s] = BlockHash{};
  position_[s] = 0;
  role_[s] = Role::kCheckpointFree;
  free_ckpt_.push_back(slot);
}

Status StatePool::save_checkpoint(int32_t live_slot, const BlockHash& key, int64_t position,
                                  std::optional<int32_t> source) {
  DZ_CHECK(is_live(live_slot), "save_checkpoint: state slot {} is not a live slot in use",
           live_slot);
  if (auto it = index_.find(key); it != index_.end()) {
    const auto s = static_cast<size_t>(it->second);
    DZ_CHECK(position_[s] == position,
             "save_checkpoint: block {} has a checkpoint at position {}, not {}", hex(key),
             position_[s], position);
    lru_unlink(it->second);
    lru_push_back(it->second);
    return Status::ok_status();
  }
  if (max_checkpoints_ == 0) {
    return make_error(StatusCode::kResourceExhausted,
                      "state pool: no checkpoint slot for block {} (max_checkpoints is 0)",
                      hex(key));
  }
  if (free_ckpt_.empty()) {
    int32_t victim = lru_next_[0];
    while (victim != 0 && pins_[static_cast<size_t>(victim)] > 0) {
      victim = lru_next_[static_cast<size_t>(victim)];
    }
    if (victim == 0) {
      return make_error(StatusCode::kResourceExhausted,
                        "state pool: no checkpoint slot for block {} ({} slots, all pinned)",
                        hex(key), max_checkpoints_);
    }
    free_checkpoint_slot(victim);
    ++evictions_;
  }
  const int32_t slot = free_ckpt_.back();
  free_ckpt_.pop_back();
  const auto s = static_cast<size_t>(slot);
  role_[s] = Role::kCheckpoint;
  key_[s] = key;
  position_[s] = position;
  index_.emplace(key, slot);
  lru_push_back(slot);
  copy_(source.value_or(live_slot), slot);
  ++saves_;
  return Status::ok_status();
}

std::optional<size_t> StatePool::find_deepest(std::span<const BlockHash> chain) const {
  for (size_t i = chain.size(); i > 0; --i) {
    if (index_.contains(chain[i - 1])) return i - 1;
  }
  return std::nullopt;
}

std::optional<int64_t> StatePool::checkpoint_position(const BlockHash& key) const {
  auto it = index_.find(key);
  if (it == index_.end()) return std::nullopt;
  return position_[static_cast<size_t>(it->second)];
}

Status StatePool::restore(const BlockHash& key, int32_t live_slot) {
  DZ_CHECK(is_live(live_slot), "restore: state slot {} is not a live slot in use", live_slot);
  auto it = index_.find(key);
  if (it == index_.end()) {
    return make_error(StatusCode::kNotFound, "state pool: no checkpoint for block {}", hex(key));
  }
  const int32_t slot = it->second;
  const auto s = static_cast<size_t>(slot);
  ++pins_[s];
  copy_(slot, live_slot);
  --pins_[s];
  lru_unlink(slot);
  lru_push_back(slot);
  ++hits_;
  return Status::ok_status();
}

int32_t StatePool::checkpoint_slot(const BlockHash& key, const char* op) const {
  auto it = index_.find(key);
  DZ_CHECK(it != index_.end(), "{}: no checkpoint for block {}", op, hex(key));
  return it->second;
}

bool StatePool::release_checkpoint(const BlockHash& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  const int32_t slot = it->second;
  DZ_CHECK(pins_[static_cast<size_t>(slot)] == 0,
           "release_checkpoint: checkpoint slot {} of block {} is pinned", slot, hex(key));
  free_checkpoint_slot(slot);
  return true;
}

void StatePool::pin(const BlockHash& key) {
  ++pins_[static_cast<size_t>(checkpoint_slot(key, "pin"))];
}

void StatePool::unpin(const BlockHash& key) {
  const int32_t slot = checkpoint_slot(key, "unpin");
  DZ_CHECK(pins_[static_cast<size_t>(slot)] > 0,
           "unpin: checkpoint slot {} of block {} is not pinned", slot, hex(key));
  --pins_[static_cast<size_t>(slot)];
}

StatePoolMetrics StatePool::metrics() const {
  StatePoolMetrics m;
  m.live_free = static_cast<int32_t>(free_live_.size());
  m.live_used = max_live_ - m.live_free;
  m.checkpoints_free = static_cast<int32_t>(free_ckpt_.size());
  m.checkpoints_used = max_checkpoints_ - m.checkpoints_free;
  m.checkpoint_saves = saves_;
  m.checkpoint_evictions = evictions_;
  m.checkpoint_hits = hits_;
  return m;
}

Status StatePool::check_invariants() const {
  const auto n = static_cast<size_t>(num_state_slots_);
  if (n > 0 && role_[0] != Role::kNull)
    return make_error(StatusCode::kInternal, "state pool: slot 0 is not null");
  // Each slot keeps the role range it was created with.
  for (size_t s = 1; s < n; ++s) {
    const auto slot = static_cast<int32_t>(s);
    const Role r = role_[s];
    const bool live_range = slot <= max_live_;
    const bool ckpt_range = !live_range && slot <= max_live_ + max_checkpoints_;
    const bool ok = live_range   ? (r == Role::kLive || r == Role::kLiveFree)
                    : ckpt_range ? (r == Role::kCheckpoint || r == Role::kCheckpointFree)
                                 : r == Role::kUnused;
    if (!ok)
      return make_error(StatusCode::kInternal, "state pool: slot {} has the wrong role {}", slot,
                        static_cast<int>(r));
  }
  // Free lists: in range, the matching free role, each slot once; every free-role slot listed.
  std::vector<unsigned char> listed(n, 0);
  for (const auto* list : {&free_live_, &free_ckpt_}) {
    const Role want = list == &free_live_ ? Role::kLiveFree : Role::kCheckpointFree;
    for (int32_t slot : *list) {
      if (slot <= 0 || slot >= num_state_slots_ || role_[static_cast<size_t>(slot)] != want) {
        return make_error(StatusCode::kInternal,
                          "state pool: free list holds slot {} that is not free", slot);
      }
      if (listed[static_cast<size_t>(slot)]++ != 0) {
        return make_error(StatusCode::kInternal, "state pool: slot {} is on a free list twice",
                          slot);
      }
    }
  }
  size_t num_checkpoints = 0;
  for (size_t s = 1; s < n; ++s) {
    const Role r = role_[s];
    if ((r == Role::kLiveFree || r == Role::kCheckpointFree) && listed[s] == 0) {
      return make_error(StatusCode::kInternal, "state pool: free slot {} is on no free list", s);
    }
    if (r != Role::kCheckpoint && pins_[s] != 0) {
      return make_error(StatusCode::kInternal,
                        "state pool: slot {} is pinned but holds no checkpoint", s);
    }
    if (r != Role::kCheckpoint) continue;
    ++num_checkpoints;
    auto it = index_.find(key_[s]);
    if (it == index_.end() || it->second != static_cast<int32_t>(s)) {
      return make_error(StatusCode::kInternal,
                        "state pool: checkpoint slot {} is not indexed under its key {}", s,
                        hex(key_[s]));
    }
    if (pins_[s] < 0)
      return make_error(StatusCode::kInternal, "state pool: checkpoint slot {} has {} pins", s,
                        pins_[s]);
  }
  if (index_.size() != num_checkpoints) {
    return make_error(StatusCode::kInternal,
                      "state pool: {} checkpoint keys for {} checkpoint slots", index_.size(),
                      num_checkpoints);
  }
  // The LRU list: exactly the checkpoint slots, each once, links consistent both ways.
  size_t walked = 0;
  for (int32_t slot = lru_next_[0]; slot != 0; slot = lru_next_[static_cast<size_t>(slot)]) {
    const auto s = static_cast<size_t>(slot);
    if (slot < 0 || slot >= num_state_slots_ || role_[s] != Role::kCheckpoint ||
        ++walked > num_checkpoints) {
      return make_error(StatusCode::kInternal,
                        "state pool: LRU list holds slot {} that is not a checkpoint", slot);
    }
    if (lru_next_[static_cast<size_t>(lru_prev_[s])] != slot) {
      return make_error(StatusCode::kInternal, "state pool: LRU links broken at slot {}", slot);
    }
  }
  if (walked != num_checkpoints) {
    return make_error(StatusCode::kInternal, "state pool: LRU list holds {} of {} checkpoints",
                      walked, num_checkpoints);
  }
  return Status::ok_status();
}

Status StatePool::check_invariants(std::span<const int32_t> owned_live_slots) const {
  DZ_RETURN_IF_ERROR(check_invariants());
  std::vector<unsigned char> owners(static_cast<size_t>(num_state_slots_), 0);
  for (int32_t slot : owned_live_slots) {
    if (!is_live(slot)) {
      return make_error(StatusCode::kInternal, "state pool: an owner holds slot {}, not live",
                        slot);
    }
    if (owners[static_cast<size_t>(slot)]++ != 0) {
      return make_error(StatusCode::kInternal, "state pool: live slot {} has two owners", slot);
    }
  }
  const int32_t live_used = max_live_ - static_cast<int32_t>(free_live_.size());
  if (static_cast<int32_t>(owned_live_slots.size()) != live_used) {
    return make_error(StatusCode::kInternal, "state pool: {} live slots in use, {} owned (leak)",
                      live_used, owned_live_slots.size());
  }
  return Status::ok_status();
}

}  // namespace dz::cache
