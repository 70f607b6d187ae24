#pragma once
// A simple paged attention cache for one process: per layer an MLA latent pool and an indexer key
// pool (kernels/paged_cache.h layouts), each num_blocks · block_size token records, allocated once.
// The runtime's block manager (serving.md) hands out block ids; this container only maps ids to
// pools. SequentialBlocks is the trivial allocator for one sequence (the CLI's logits/generate).

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/status.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/blocks/dsa_indexer.h"
#include "dayzero/model/blocks/mla.h"

namespace dz::model {

// What one layer caches per token. latent_dim 0: no MLA cache; index_key_dim 0: no indexer cache.
struct LayerCacheSpec {
  kernels::MlaCacheLayout mla{.latent_dim = 0, .rope_dim = 0};
  int64_t index_key_dim = 0;
};

class KvCache {
 public:
  // layers: one spec per layer id (MTP layers included), in layer order.
  static Result<KvCache> create(std::span<const LayerCacheSpec> layers, int64_t num_blocks,
                                int64_t block_size);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Bytes one cached token takes over all layers.
  int64_t bytes_per_token() const;

  MlaLayerCache mla_layer(int layer_id);
  IndexLayerCache index_layer(int layer_id);

 private:
  struct Layer {
    LayerCacheSpec spec;
    AlignedBuffer mla_pool;    // [num_blocks · block_size] MLA records
    AlignedBuffer index_pool;  // [num_blocks] block-planar indexer blocks
  };

  std::vector<Layer> layers_;
  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
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
