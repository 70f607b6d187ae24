#pragma once
// A simple paged attention cache for one process: per layer an MLA latent pool and an indexer key
// pool (kernels/paged_cache.h layouts), each num_blocks · block_size token records, allocated once;
// per KDA layer num_state_slots recurrent states and conv rows (the recurrent-state pool of
// docs/serving.md §1.6, docs/formats.md §5.5), addressed by SequenceSlice::state_slot.
// The runtime's block manager (docs/serving.md) hands out block ids; this container only maps ids
// to pools. SequentialBlocks is the trivial allocator for one sequence (the CLI's logits/generate).
// Under context parallelism each rank of a CP group stores only its share of the blocks
// (BlockShard, docs/parallel.md §9.4); the block ids stay those of the one cache manager.

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/status.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/blocks/dsa_indexer.h"
#include "dayzero/model/blocks/kda.h"
#include "dayzero/model/blocks/mla.h"

namespace dz::model {

// What one layer caches per token (MLA, indexer) or per sequence slot (KDA). latent_dim 0: no MLA
// cache; index_key_dim 0: no indexer cache; kda.num_heads 0: no recurrent state.
struct LayerCacheSpec {
  kernels::MlaCacheLayout mla{.latent_dim = 0, .rope_dim = 0};
  int64_t index_key_dim = 0;
  KdaStateLayout kda{};
};

// Which paged blocks a cache stores: block b lives on shard b % count, as its block b / count.
// The recurrent states are not sharded (every CP rank keeps the same state bits).
struct BlockShard {
  int count = 1;
  int index = 0;

  bool operator==(const BlockShard&) const = default;
  bool stores(int64_t block) const { return block % count == index; }
  int64_t stored_blocks(int64_t num_blocks) const { return (num_blocks + count - 1) / count; }
  // Where block `block` is among this shard's blocks; −1 when another shard stores it.
  int32_t stored_block(int32_t block) const { return stores(block) ? block / count : -1; }
  // The same for a slot (block · block_size + offset).
  int64_t stored_slot(int64_t slot, int64_t block_size) const {
    const int32_t block = stored_block(static_cast<int32_t>(slot / block_size));
    return block < 0 ? -1 : block * block_size + slot % block_size;
  }
  // A block table as the shard's pools see it: stored blocks renumbered, the others −1.
  std::vector<int32_t> stored_table(std::span<const int32_t> block_table) const {
    std::vector<int32_t> stored(block_table.size());
    for (size_t i = 0; i < block_table.size(); ++i) stored[i] = stored_block(block_table[i]);
    return stored;
  }
};

class KvCache {
 public:
  // layers: one spec per layer id (MTP layers included), in layer order. num_state_slots: slots
  // of every KDA layer's state pool (must be positive when a layer has KDA state).
  // shard: the part of the num_blocks blocks this cache stores.
  static Result<KvCache> create(std::span<const LayerCacheSpec> layers, int64_t num_blocks,
                                int64_t block_size, int64_t num_state_slots = 0,
                                BlockShard shard = {});

  // Distinct for every cache this process creates (moves keep it): how rank 0 names its cache to
  // the other ranks of a plan (model/step_broadcast.h).
  uint64_t id() const { return id_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  // The blocks this cache stores; the pools of mla_layer() / index_layer() hold them renumbered
  // by shard().stored_block().
  const BlockShard& shard() const { return shard_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Bytes one cached token takes over all layers (the paged part only).
  int64_t bytes_per_token() const;
  int64_t num_state_slots() const { return num_state_slots_; }
  // Bytes one state slot takes over all KDA layers (states and conv rows).
  int64_t state_bytes_per_slot() const;

  MlaLayerCache mla_layer(int layer_id);
  IndexLayerCache index_layer(int layer_id);
  KdaLayerState kda_layer(int layer_id);
  // Copies slot `from` to slot `to` in every KDA layer (prefix checkpoints, docs/serving.md §1.7).
  void copy_state_slot(int32_t from, int32_t to);
  // Copies the first num_rows token records of block `from` to block `to` in every paged layer
  // pool (MLA records; indexer keys and their scales, block-planar): copy-on-write of a shared
  // partial block (docs/serving.md §1.3). num_rows in [0, block_size]. On a sharded cache it copies
  // when this shard stores both blocks and does nothing when it stores neither; between shards the
  // rows travel through block_rows / set_block_rows.
  void copy_block_rows(int32_t from_block, int32_t to_block, int64_t num_rows);
  // The first num_rows token rows of a stored block in every paged pool, as bytes, and back.
  std::vector<std::byte> block_rows(int32_t block, int64_t num_rows);
  void set_block_rows(int32_t block, int64_t num_rows, std::span<const std::byte> rows);

 private:
  struct Layer {
    LayerCacheSpec spec;
    AlignedBuffer mla_pool;    // [num_blocks · block_size] MLA records
    AlignedBuffer index_pool;  // [num_blocks] block-planar indexer blocks
    AlignedBuffer kda_states;  // [num_state_slots, H, d_v, d_k] FP32
    AlignedBuffer kda_conv;    // [num_state_slots, 3, W−1, H·d] BF16 codes
  };

  // Calls visit(run start, run bytes) for each contiguous run that the first num_rows rows of
  // stored block `stored` take in the paged pools, in layer order.
  template <typename Visit>
  void visit_block_runs(int32_t stored, int64_t num_rows, Visit visit);

  std::vector<Layer> layers_;
  BlockShard shard_;
  uint64_t id_ = 0;
  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  int64_t num_state_slots_ = 0;
};

// Blocks for one sequence out of a pool of num_blocks. Hands ids out from the top of the pool
// down, so that a kernel that ignores the block table (treats position as slot) fails the tests.
class SequentialBlocks {
 public:
  SequentialBlocks(int64_t num_blocks, int64_t block_size);

  // Grows the block table to cover positions [0, num_tokens); kInvalidArgument when the pool is
  // too small.
  Status reserve(int64_t num_tokens);
  std::span<const int32_t> block_table() const { return block_table_; }
  int64_t slot_of(int64_t pos) const;

 private:
  int64_t num_blocks_;
  int64_t block_size_;
  std::vector<int32_t> block_table_;
};

}  // namespace dz::model
