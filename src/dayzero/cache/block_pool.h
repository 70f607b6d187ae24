#pragma once
// The block pool of the paged cache (docs/serving.md §1.1–1.5): num_blocks blocks of block_size
// tokens, block 0 the null block that pads tables and is never handed out. Reference counts (one
// per block table holding a block: prefix hits and forks share blocks), an intrusive doubly linked
// free list in LRU order whose free blocks may still carry a prefix hash (the eviction candidates),
// a hash index of full blocks, and an emergency reserve only running decodes may take. One block id
// reserves a block in every paged layer cache at once (§1.2); this class only does the
// bookkeeping, model::KvCache holds the bytes. Not thread-safe: the cache coordinator owns it.

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "dayzero/cache/prefix_hash.h"
#include "dayzero/core/status.h"

namespace dz::cache {

struct BlockPoolMetrics {
  int64_t num_blocks = 0;   // pool size, null block included
  int64_t used = 0;         // ref_cnt > 0
  int64_t free = 0;         // ref_cnt == 0 (null block excluded), cached or not
  int64_t cached = 0;       // free blocks that still carry a hash
  int64_t allocatable = 0;  // what an admission may take now: max(free - reserve, 0)
  int64_t reserve = 0;      // R, only for running decodes
};

class BlockPool {
 public:
  static constexpr int32_t kNullBlock = 0;

  // num_blocks ≥ 2 (block 0 is null), block_size > 0, 0 ≤ reserve_blocks ≤ num_blocks − 1.
  static Result<BlockPool> create(int64_t num_blocks, int64_t block_size, int64_t reserve_blocks);

  int64_t num_blocks() const { return static_cast<int64_t>(blocks_.size()); }
  int64_t block_size() const { return block_size_; }
  int64_t num_free() const { return num_free_; }
  // What allocate(·, for_running_decode) may take now: free, less the reserve for admissions.
  int64_t num_allocatable(bool for_running_decode = false) const;

  // Called with each evicted hash (a popped free block that was cached), so that the state
  // checkpoint keyed by it can be released (§1.7).
  void set_eviction_listener(std::function<void(const BlockHash&)> listener) {
    eviction_listener_ = std::move(listener);
  }

  // Pops n blocks from the free-list head (least recently freed first), each with ref_cnt 1;
  // evicts the hash of a popped cached block. kResourceExhausted and no change when fewer than n
  // are allocatable: admissions and prefill chunks must leave R blocks, running decodes may take
  // them.
  Result<std::vector<int32_t>> allocate(int64_t n, bool for_running_decode = false);
  // Appends n fresh blocks to table (same rules; table unchanged on failure). With a shard count
  // C > 1 entry i of the table gets a block b with b % C == i % C when one is among the first
  // kShardScan free blocks, else the head's.
  Status append_blocks(std::vector<int32_t>& table, int64_t n, bool for_running_decode = false);
  // Context parallelism (docs/parallel.md §9.4): CP rank r stores the blocks b with b % C == r, so
  // a sequence's consecutive blocks should alternate between the ranks for their decode reads to
  // balance. 1 (the default): no preference.
  void set_shard_count(int count);
  static constexpr int kShardScan = 64;

  // Decrements every block of table; those reaching 0 go to the free-list tail in reverse table
  // order, so the shared head of a prompt is evicted last. Aborts on a block already at 0.
  void free(std::span<const int32_t> table);
  // Increments every block of table, each held already: a forked sequence shares them.
  void fork(std::span<const int32_t> table);

  // Indexes full block table[index] under hash with its block_size token ids, once the step that
  // filled it has completed. Returns false, changing nothing, when another block already holds
  // hash (computed twice concurrently: this copy stays unhashed and is freed normally). A block
  // registers once; re-registering it under the same hash is a no-op returning true.
  bool register_full_block(std::span<const int32_t> table, int64_t index, const BlockHash& hash,
                           std::span<const int32_t> token_ids);

  // The cached blocks of the longest prefix of hashes (block j covers
  // tokens[j·B, (j+1)·B)), stopping at the first miss; a block whose token ids differ (a
  // collision) is a miss. No side effects.
  std::vector<int32_t> match_prefix(std::span<const BlockHash> hashes,
                                    std::span<const int32_t> tokens) const;
  // Takes a reference on each of blocks, hits of match_prefix (a free cached block leaves the
  // free list, ref_cnt 0 → 1). The caller owns them then.
  void touch(std::span<const int32_t> blocks);

  // Drops the hashes of every free cached block (a prefix-cache reset); returns how many.
  int64_t evict_free_cached();

  int32_t ref_count(int32_t block) const;
  std::optional<BlockHash> hash_of(int32_t block) const;
  BlockPoolMetrics metrics() const;

  // §1.9: refcounts equal the owners in all_tables; the free list holds exactly the ref_cnt == 0
  // blocks, once each, with consistent links; each hashed block is indexed under its own hash and
  // the index names nothing else; block 0 is never owned. kInternal naming the first violation.
  Status check_invariants(std::span<const std::vector<int32_t>> all_tables) const;

 private:
  struct Block {
    int32_t ref_cnt = 0;
    int32_t prev_free = -1;  // free-list links; -1 when not in the list
    int32_t next_free = -1;
    bool hashed = false;
    BlockHash hash;
    std::vector<int32_t> token_ids;  // block_size ids when hashed
  };

  BlockPool(int64_t num_blocks, int64_t block_size, int64_t reserve_blocks);
  int32_t sentinel() const { return static_cast<int32_t>(blocks_.size()); }
  int32_t& next(int32_t node) { return node == sentinel() ? head_ : blocks_[node].next_free; }
  int32_t& prev(int32_t node) { return node == sentinel() ? tail_ : blocks_[node].prev_free; }
  void push_back_free(int32_t block);
  void unlink_free(int32_t block);
  void evict(int32_t block);
  void check_block_id(int32_t block) const;
  void take_reference(int32_t block);
  // Takes free block `block` out of the free list with ref_cnt 1, dropping its hash.
  void take_free(int32_t block);
  // A free block whose id is `wanted` mod shard_count_ near the head of the free list, else the
  // head (the pool must have a free block).
  int32_t free_block_near_head(int64_t wanted) const;

  std::vector<Block> blocks_;
  int32_t head_;  // sentinel's next: the eviction end
  int32_t tail_;  // sentinel's prev: the most recently freed
  int64_t block_size_;
  int64_t reserve_blocks_;
  int shard_count_ = 1;
  int64_t num_free_ = 0;
  int64_t num_cached_free_ = 0;
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  std::function<void(const BlockHash&)> eviction_listener_;
};

}  // namespace dz::cache
