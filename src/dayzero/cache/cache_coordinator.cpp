#include "dayzero/cache/cache_coordinator.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "dayzero/core/check.h"

namespace dz::cache {

CacheCoordinator::CacheCoordinator(BlockPool blocks, std::optional<StatePool> states,
                                   BlockCopyFn copy_rows, CacheCoordinatorConfig config)
    : blocks_(std::move(blocks)),
      states_(std::move(states)),
      copy_rows_(std::move(copy_rows)),
      config_(std::move(config)),
      prefix_caching_(config_.enable_prefix_caching &&
                      (!states_ || states_->max_checkpoints() > 0)),
      checkpoints_(prefix_caching_ && states_) {
  DZ_CHECK(config_.state_checkpoint_interval > 0 &&
               config_.state_checkpoint_interval % blocks_.block_size() == 0,
           "state checkpoint interval {} is not a positive multiple of the block size {}",
           config_.state_checkpoint_interval, blocks_.block_size());
  if (states_) {
    StatePool* states_ptr = &*states_;
    blocks_.set_eviction_listener(
        [states_ptr](const BlockHash& hash) { states_ptr->release_checkpoint(hash); });
  }
}

int64_t CacheCoordinator::blocks_for(int64_t num_tokens) const {
  return (num_tokens + block_size() - 1) / block_size();
}

void CacheCoordinator::update_block_hashes(SequenceCache& seq, const SequenceTokens& tokens) const {
  const int64_t block_size = blocks_.block_size();
  const auto num_full = static_cast<int64_t>(tokens.tokens.size()) / block_size;
  for (auto j = static_cast<int64_t>(seq.block_hashes.size()); j < num_full; ++j) {
    const BlockHash parent = j == 0 ? config_.seed : seq.block_hashes.back();
    const std::vector<std::byte> extra =
        block_extra_keys(j, tokens.cache_salt, config_.cache_format,
                         image_keys(tokens.images, j * block_size, (j + 1) * block_size));
    seq.block_hashes.push_back(hash_block(
        parent,
        tokens.tokens.subspan(static_cast<size_t>(j * block_size), static_cast<size_t>(block_size)),
        extra));
  }
}

CachedPrefix CacheCoordinator::get_computed_blocks(SequenceCache& seq,
                                                   const SequenceTokens& tokens) {
  CachedPrefix prefix;
  if (!prefix_caching_) return prefix;
  update_block_hashes(seq, tokens);
  // At least one token must run to give logits.
  const auto max_hit_blocks = (static_cast<int64_t>(tokens.tokens.size()) - 1) / block_size();
  const std::span<const BlockHash> chain =
      std::span<const BlockHash>(seq.block_hashes).first(static_cast<size_t>(max_hit_blocks));
  prefix.blocks = blocks_.match_prefix(chain, tokens.tokens);
  if (states_) {
    // Hybrid: the deepest checkpoint within the KV hit, none = no hit (docs/serving.md).
    const std::optional<size_t> deepest = states_->find_deepest(chain.first(prefix.blocks.size()));
    if (!deepest) {
      prefix.blocks.clear();
      return prefix;
    }
    prefix.blocks.resize(*deepest + 1);
    prefix.checkpoint = chain[*deepest];
    const std::optional<int64_t> position = states_->checkpoint_position(chain[*deepest]);
    const auto want = static_cast<int64_t>(prefix.blocks.size()) * block_size();
    DZ_CHECK(position && *position == want, "checkpoint of block {} at position {}, expected {}",
             *deepest, position.value_or(-1), want);
  }
  for (const int32_t block : prefix.blocks)
    if (blocks_.ref_count(block) == 0) ++prefix.num_free_blocks;
  prefix.num_tokens = static_cast<int64_t>(prefix.blocks.size()) * block_size();
  return prefix;
}

int64_t CacheCoordinator::next_checkpoint(int64_t num_prompt_tokens, int64_t from) const {
  if (!checkpoints_) return std::numeric_limits<int64_t>::max();
  const int64_t interval = config_.state_checkpoint_interval;
  int64_t next = (from / interval + 1) * interval;
  const int64_t last_prompt_boundary = num_prompt_tokens / block_size() * block_size();
  if (last_prompt_boundary > from) next = std::min(next, last_prompt_boundary);
  return next;
}

int64_t CacheCoordinator::clip_to_checkpoint(int64_t num_prompt_tokens, int64_t from,
                                             int64_t n) const {
  return std::min(n, next_checkpoint(num_prompt_tokens, from) - from);
}

bool CacheCoordinator::can_allocate(const CachedPrefix& prefix, int64_t num_new_tokens,
                                    bool use_reserve) const {
  const int64_t fresh =
      blocks_for(prefix.num_tokens + num_new_tokens) - static_cast<int64_t>(prefix.blocks.size());
  return fresh + prefix.num_free_blocks <= blocks_.num_allocatable(use_reserve);
}

void CacheCoordinator::allocate_prefix(SequenceCache& seq, const CachedPrefix& prefix,
                                       int64_t num_new_tokens, bool use_reserve) {
  DZ_CHECK(seq.block_table.empty() && seq.state_slot < 0,
           "allocate_prefix of a sequence holding {} blocks", seq.block_table.size());
  DZ_CHECK(can_allocate(prefix, num_new_tokens, use_reserve),
           "allocate_prefix: {} prefix blocks + {} tokens do not fit", prefix.blocks.size(),
           num_new_tokens);
  blocks_.touch(prefix.blocks);
  seq.block_table = prefix.blocks;
  const auto hit = static_cast<int64_t>(prefix.blocks.size());
  const Status grown = blocks_.append_blocks(
      seq.block_table, blocks_for(prefix.num_tokens + num_new_tokens) - hit, use_reserve);
  DZ_CHECK(grown.ok(), "allocate_prefix: {}", grown.message());
  seq.num_registered_blocks = hit;
  if (states_) {
    Result<int32_t> slot = states_->acquire_live();
    DZ_CHECK(slot.ok(), "allocate_prefix: {}", slot.status().message());
    seq.state_slot = *slot;
    if (prefix.checkpoint) {
      const Status restored = states_->restore(*prefix.checkpoint, seq.state_slot);
      DZ_CHECK(restored.ok(), "allocate_prefix: {}", restored.message());
    }
  }
}

bool CacheCoordinator::allocate_slots(SequenceCache& seq, int64_t num_tokens,
                                      bool for_running_decode) {
  const int64_t needed = blocks_for(num_tokens) - static_cast<int64_t>(seq.block_table.size());
  return needed <= 0 || blocks_.append_blocks(seq.block_table, needed, for_running_decode).ok();
}

int64_t CacheCoordinator::max_tokens_holdable(const SequenceCache& seq,
                                              bool for_running_decode) const {
  return (static_cast<int64_t>(seq.block_table.size()) +
          blocks_.num_allocatable(for_running_decode)) *
         block_size();
}

void CacheCoordinator::save_checkpoint(SequenceCache& seq, const SequenceTokens& tokens,
                                       int64_t position, std::optional<int32_t> source) {
  if (position == 0 || position % block_size() != 0) return;
  const int64_t last_prompt_boundary = tokens.num_prompt_tokens / block_size() * block_size();
  const bool fixed =
      position % config_.state_checkpoint_interval == 0 || position == last_prompt_boundary;
  if (!fixed && position < last_prompt_boundary) return;
  const BlockHash key = seq.block_hashes[static_cast<size_t>(position / block_size() - 1)];
  // A checkpoint is a cache entry: failing to save one (every slot pinned) only loses a hit.
  if (!states_->save_checkpoint(seq.state_slot, key, position, source).ok()) return;
  // Past the prompt one rolling checkpoint follows the latest crossed boundary.
  if (seq.rolling_checkpoint && !(*seq.rolling_checkpoint == key))
    states_->release_checkpoint(*seq.rolling_checkpoint);
  seq.rolling_checkpoint.reset();
  if (!fixed) seq.rolling_checkpoint = key;
}

void CacheCoordinator::cache_full_blocks(SequenceCache& seq, const SequenceTokens& tokens,
                                         int64_t num_computed_tokens,
                                         const StateSnapshots& snapshots) {
  if (!prefix_caching_) return;
  update_block_hashes(seq, tokens);
  const int64_t num_full = num_computed_tokens / block_size();
  for (int64_t j = seq.num_registered_blocks; j < num_full; ++j)
    blocks_.register_full_block(seq.block_table, j, seq.block_hashes[static_cast<size_t>(j)],
                                tokens.tokens.subspan(static_cast<size_t>(j * block_size()),
                                                      static_cast<size_t>(block_size())));
  seq.num_registered_blocks = std::max(seq.num_registered_blocks, num_full);
  if (!checkpoints_) return;
  // Boundaries inside the row first, oldest first, so the rolling checkpoint ends at the latest.
  for (int64_t j = 0; j < static_cast<int64_t>(snapshots.slots.size()); ++j)
    if (const int64_t position = snapshots.first_position + j; position < num_computed_tokens)
      save_checkpoint(seq, tokens, position, snapshots.slots[static_cast<size_t>(j)]);
  save_checkpoint(seq, tokens, num_computed_tokens, std::nullopt);
}

bool CacheCoordinator::fork(const SequenceCache& parent, int64_t num_computed_tokens,
                            SequenceCache& child) {
  DZ_CHECK(child.block_table.empty() && child.state_slot < 0,
           "fork into a sequence holding {} blocks", child.block_table.size());
  const int64_t num_full = num_computed_tokens / block_size();
  const int64_t partial_rows = num_computed_tokens % block_size();
  DZ_CHECK(static_cast<int64_t>(parent.block_table.size()) >= blocks_for(num_computed_tokens),
           "fork of {} tokens from a table of {} blocks", num_computed_tokens,
           parent.block_table.size());
  if (partial_rows > 0 && blocks_.num_allocatable() < 1) return false;
  if (states_) {
    Result<int32_t> slot = states_->fork_live(parent.state_slot);
    if (!slot.ok()) return false;
    child.state_slot = *slot;
  }
  const std::span<const int32_t> shared =
      std::span<const int32_t>(parent.block_table).first(static_cast<size_t>(num_full));
  blocks_.fork(shared);
  child.block_table.assign(shared.begin(), shared.end());
  if (partial_rows > 0) {
    const Status grown = blocks_.append_blocks(child.block_table, 1);
    DZ_CHECK(grown.ok(), "fork: {}", grown.message());
    copy_rows_(parent.block_table[static_cast<size_t>(num_full)], child.block_table.back(),
               partial_rows);
  }
  child.block_hashes.assign(
      parent.block_hashes.begin(),
      parent.block_hashes.begin() +
          std::min<std::ptrdiff_t>(static_cast<std::ptrdiff_t>(parent.block_hashes.size()),
                                   static_cast<std::ptrdiff_t>(num_full)));
  child.num_registered_blocks = std::min(parent.num_registered_blocks, num_full);
  return true;
}

void CacheCoordinator::trim(SequenceCache& seq, int64_t num_tokens) {
  const auto keep = static_cast<size_t>(blocks_for(num_tokens));
  if (seq.block_table.size() <= keep) return;
  DZ_CHECK(static_cast<int64_t>(keep) >= seq.num_registered_blocks,
           "trim to {} blocks below {} registered ones", keep, seq.num_registered_blocks);
  blocks_.free(std::span<const int32_t>(seq.block_table).subspan(keep));
  seq.block_table.resize(keep);
}

void CacheCoordinator::free(SequenceCache& seq) {
  if (!seq.block_table.empty()) blocks_.free(seq.block_table);
  seq.block_table.clear();
  seq.num_registered_blocks = 0;
  if (seq.state_slot >= 0) states_->release_live(seq.state_slot);
  seq.state_slot = -1;
}

Status CacheCoordinator::check_invariants(std::span<const SequenceCache* const> sequences) const {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> slots;
  for (const SequenceCache* seq : sequences) {
    tables.push_back(seq->block_table);
    if (states_.has_value() != (seq->state_slot >= 0))
      return make_error(StatusCode::kInternal, "state slot {} on a model {}", seq->state_slot,
                        states_ ? "with recurrent state" : "without");
    if (seq->state_slot >= 0) slots.push_back(seq->state_slot);
  }
  DZ_RETURN_IF_ERROR(blocks_.check_invariants(tables));
  if (states_) DZ_RETURN_IF_ERROR(states_->check_invariants(slots));
  return Status::ok_status();
}

}  // namespace dz::cache
