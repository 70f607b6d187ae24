#pragma once
// The cache side of scheduling (docs/serving.md): owns the block pool and, for models with
// recurrent layers, the state pool, and answers the scheduler per sequence: the longest cached
// prefix, slots for n more tokens or no, full blocks registered (and state checkpoints saved)
// once a step computed them, a fork of a computed prompt (n > 1), and the release of everything
// a sequence holds. The scheduler keeps queue policy only. Single-threaded.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/cache/block_pool.h"
#include "dayzero/cache/prefix_hash.h"
#include "dayzero/cache/state_pool.h"
#include "dayzero/core/status.h"

namespace dz::cache {

// Everything one sequence holds in the cache.
struct SequenceCache {
  std::vector<int32_t> block_table;
  int32_t state_slot = -1;              // live recurrent-state slot; −1 without KDA layers
  std::vector<BlockHash> block_hashes;  // chain over the full blocks of the tokens so far
  int64_t num_registered_blocks = 0;    // table blocks already offered to the prefix index
  std::optional<BlockHash> rolling_checkpoint;  // the decode checkpoint this sequence saved
};

// The tokens of a sequence as the cache sees them.
struct SequenceTokens {
  std::span<const int32_t> tokens;  // prompt + output
  int64_t num_prompt_tokens = 0;
  std::string_view cache_salt;
  std::span<const ImagePlacement> images{};  // their hashes enter the blocks they fall in
};

// Recurrent states a verified speculative row kept (SequenceSlice::snapshot_slots): slot j holds
// the state after first_position + j tokens.
struct StateSnapshots {
  int64_t first_position = 0;
  std::span<const int32_t> slots;
};

// The longest usable cached prefix of a sequence, from get_computed_blocks. It stays valid until
// the pool changes, so it must be allocated in the same scheduling pass or dropped.
struct CachedPrefix {
  std::vector<int32_t> blocks;          // first block first
  int64_t num_tokens = 0;               // the tokens they hold: blocks × block size
  int64_t num_free_blocks = 0;          // of those, held by no one: taking them uses free blocks
  std::optional<BlockHash> checkpoint;  // hybrid models: the state to restore into the live slot
};

struct CacheCoordinatorConfig {
  bool enable_prefix_caching = true;
  // Hybrid models: checkpoints every interval tokens (a multiple of the block size), at the last
  // block boundary ≤ the prompt, and one rolling checkpoint while decoding.
  int64_t state_checkpoint_interval = 1024;
  BlockHash seed;            // starts every sequence's hash chain
  std::string cache_format;  // in every block's extra keys
};

// Copies the first num_rows token records of one block into another in every paged layer
// (model::KvCache::copy_block_rows); tests pass their own.
using BlockCopyFn = std::function<void(int32_t from_block, int32_t to_block, int64_t num_rows)>;

class CacheCoordinator {
 public:
  // states: the pool of a model with recurrent layers, nullopt otherwise. The coordinator
  // releases a checkpoint when the block keyed by the same hash is evicted, so it keeps pointers
  // into itself: it can be neither copied nor moved.
  CacheCoordinator(BlockPool blocks, std::optional<StatePool> states, BlockCopyFn copy_rows,
                   CacheCoordinatorConfig config);
  CacheCoordinator(const CacheCoordinator&) = delete;
  CacheCoordinator& operator=(const CacheCoordinator&) = delete;

  int64_t block_size() const { return blocks_.block_size(); }
  // A hybrid model without checkpoint slots cannot hit safely: a KV hit without the state.
  bool prefix_caching() const { return prefix_caching_; }

  // The longest cached prefix of the sequence, in whole blocks, leaving at least one token to
  // run for logits; for a hybrid model cut to the deepest block with a state checkpoint. Extends
  // seq.block_hashes to every full block. One walk of the prefix index, no other side effect.
  CachedPrefix get_computed_blocks(SequenceCache& seq, const SequenceTokens& tokens);

  // A chunk of n tokens from position `from` cut to end at the next checkpoint position, since a
  // checkpoint is the live slot as a step leaves it.
  int64_t clip_to_checkpoint(int64_t num_prompt_tokens, int64_t from, int64_t n) const;
  // The first checkpoint position > from (multiples of the interval, the last block boundary ≤
  // the prompt); INT64_MAX when the model has no recurrent state or prefix caching is off.
  int64_t next_checkpoint(int64_t num_prompt_tokens, int64_t from) const;

  // Whether allocate_prefix would succeed: the fresh blocks for num_new_tokens after the prefix
  // plus the prefix's free blocks fit in what the pool may give (the reserve only when
  // use_reserve). The scheduler asks before it takes the request off the queue.
  bool can_allocate(const CachedPrefix& prefix, int64_t num_new_tokens, bool use_reserve) const;
  // Admits an empty sequence: references on the prefix blocks, fresh blocks for num_new_tokens
  // after it, a live state slot restored from the prefix's checkpoint. Aborts when can_allocate
  // is false or no live slot is free (the scheduler bounds the running sequences by max_live).
  void allocate_prefix(SequenceCache& seq, const CachedPrefix& prefix, int64_t num_new_tokens,
                       bool use_reserve);
  // Grows a running sequence's table to hold num_tokens tokens; false, changing nothing, when
  // the pool has too few allocatable blocks (running decodes may take the reserve).
  bool allocate_slots(SequenceCache& seq, int64_t num_tokens, bool for_running_decode);
  // The most tokens seq's table could hold with every block allocatable now.
  int64_t max_tokens_holdable(const SequenceCache& seq, bool for_running_decode) const;

  // After a step computed the sequence through num_computed_tokens: registers its newly full
  // blocks in the prefix index and saves the state checkpoint ending there, if one is due. A
  // verified speculative row may also have crossed a block boundary before its end: `snapshots`
  // hold the states inside it, and the checkpoint of such a boundary comes from them.
  void cache_full_blocks(SequenceCache& seq, const SequenceTokens& tokens,
                         int64_t num_computed_tokens, const StateSnapshots& snapshots = {});

  // n > 1: `child` (empty) takes over the first num_computed_tokens of `parent`. The full blocks
  // are shared (one more reference each), the partial last block is copied into a fresh block
  // (both sequences write into it next), and the recurrent state is copied into a fresh live
  // slot. False, changing nothing, when no block or live slot is free (the reserve is kept).
  bool fork(const SequenceCache& parent, int64_t num_computed_tokens, SequenceCache& child);

  // Frees the blocks of seq's table past the first num_tokens tokens (speculative decoding: the
  // rows of rejected drafts); they were never registered.
  void trim(SequenceCache& seq, int64_t num_tokens);

  // Releases the sequence's blocks and live slot (finished or preempted); its hash chain and
  // rolling checkpoint stay, the tokens being the same.
  void free(SequenceCache& seq);

  // BlockPool and StatePool invariants (docs/serving.md) with `sequences` the only owners of
  // blocks and live slots; kInternal naming the first violation.
  Status check_invariants(std::span<const SequenceCache* const> sequences) const;

  BlockPoolMetrics block_metrics() const { return blocks_.metrics(); }
  const BlockPool& blocks() const { return blocks_; }
  const StatePool* states() const { return states_ ? &*states_ : nullptr; }

 private:
  void update_block_hashes(SequenceCache& seq, const SequenceTokens& tokens) const;
  void save_checkpoint(SequenceCache& seq, const SequenceTokens& tokens, int64_t position,
                       std::optional<int32_t> source);
  int64_t blocks_for(int64_t num_tokens) const;

  BlockPool blocks_;
  std::optional<StatePool> states_;
  BlockCopyFn copy_rows_;
  CacheCoordinatorConfig config_;
  bool prefix_caching_;
  bool checkpoints_;  // hybrid with prefix caching: state checkpoints at chunk ends
};

}  // namespace dz::cache
