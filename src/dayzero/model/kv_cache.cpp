#include "dayzero/model/kv_cache.h"

#include <fmt/format.h>

namespace dz::model {

Result<KvCache> KvCache::create(std::span<const LayerCacheSpec> layers, int64_t num_blocks,
                                int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "KV cache: num_blocks {} and block_size {} must be positive", num_blocks,
                      block_size);
  KvCache cache;
  cache.num_blocks_ = num_blocks;
  cache.block_size_ = block_size;
  const int64_t num_slots = num_blocks * block_size;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCacheSpec& spec = layers[i];
    if (spec.mla.latent_dim > 0 && spec.mla.dtype == kernels::KvCacheDtype::kFp8 &&
        spec.mla.latent_dim % 128 != 0)
      return make_error(StatusCode::kUnsupported,
                        "KV cache layer {}: an fp8 latent cache needs kv_lora_rank divisible by "
                        "128, got {} (use --kv-cache-dtype bf16)",
                        i, spec.mla.latent_dim);
    Layer layer;
    layer.spec = spec;
    if (spec.mla.latent_dim > 0)
      layer.mla_pool = AlignedBuffer(static_cast<size_t>(num_slots * spec.mla.record_bytes()));
    if (spec.index_key_dim > 0) {
      kernels::IndexCacheLayout index{.key_dim = spec.index_key_dim, .block_size = block_size};
      layer.index_pool = AlignedBuffer(static_cast<size_t>(num_blocks * index.block_bytes()));
    }
    cache.layers_.push_back(std::move(layer));
  }
  return cache;
}

int64_t KvCache::bytes_per_token() const {
  int64_t total = 0;
  for (const Layer& layer : layers_) {
    if (layer.spec.mla.latent_dim > 0) total += layer.spec.mla.record_bytes();
    if (layer.spec.index_key_dim > 0) total += layer.spec.index_key_dim + 4;
  }
  return total;
}

MlaLayerCache KvCache::mla_layer(int layer_id) {
  Layer& layer = layers_.at(static_cast<size_t>(layer_id));
  DZ_CHECK(layer.spec.mla.latent_dim > 0, "layer {} has no MLA cache", layer_id);
  return {.layout = layer.spec.mla, .pool = layer.mla_pool.data()};
}

IndexLayerCache KvCache::index_layer(int layer_id) {
  Layer& layer = layers_.at(static_cast<size_t>(layer_id));
  DZ_CHECK(layer.spec.index_key_dim > 0, "layer {} has no indexer cache", layer_id);
  return {.layout = {.key_dim = layer.spec.index_key_dim, .block_size = block_size_},
          .pool = layer.index_pool.data()};
}

SequentialBlocks::SequentialBlocks(int64_t num_blocks, int64_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  DZ_CHECK(num_blocks > 0 && block_size > 0, "empty block pool");
}

Status SequentialBlocks::reserve(int64_t num_tokens) {
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  if (needed > num_blocks_)
    return make_error(StatusCode::kInvalidArgument,
                      "KV cache: {} tokens need {} blocks of {}, the pool has {}", num_tokens,
                      needed, block_size_, num_blocks_);
  while (static_cast<int64_t>(block_table_.size()) < needed)
    block_table_.push_back(
        static_cast<int32_t>(num_blocks_ - 1 - static_cast<int64_t>(block_table_.size())));
  return Status::ok_status();
}

int64_t SequentialBlocks::slot_of(int64_t pos) const {
  return model::slot_of(block_table_, block_size_, pos);
}

}  // namespace dz::model
