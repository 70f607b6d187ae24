#include "dayzero/model/kv_cache.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>

#include "dayzero/core/check.h"

namespace dz::model {

namespace {

// A KDA layout is either absent (0 heads) or fully positive; a pool above this is a config error.
constexpr int64_t kMaxStatePoolBytes = int64_t{1} << 46;

Status check_kda_layout(size_t layer, const LayerCacheSpec& spec, int64_t num_state_slots) {
  const KdaStateLayout& kda = spec.kda;
  if (kda.num_heads == 0) return Status::ok_status();
  if (kda.num_heads < 0 || kda.head_dim <= 0 || kda.conv_width <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "KV cache layer {}: KDA state of {} heads of {} with conv width {} (want all "
                      "positive)",
                      layer, kda.num_heads, kda.head_dim, kda.conv_width);
  if (spec.mla.latent_dim > 0)
    return make_error(StatusCode::kInvalidArgument,
                      "KV cache layer {}: a layer has an MLA cache or a KDA state, not both",
                      layer);
  if (num_state_slots <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "KV cache layer {}: a KDA layer needs num_state_slots > 0, got {}", layer,
                      num_state_slots);
  if (kda.slot_bytes() > kMaxStatePoolBytes / num_state_slots)
    return make_error(StatusCode::kInvalidArgument,
                      "KV cache layer {}: {} state slots of {} bytes exceed {} bytes", layer,
                      num_state_slots, kda.slot_bytes(), kMaxStatePoolBytes);
  return Status::ok_status();
}

}  // namespace

Result<KvCache> KvCache::create(std::span<const LayerCacheSpec> layers, int64_t num_blocks,
                                int64_t block_size, int64_t num_state_slots, BlockShard shard) {
  if (num_blocks <= 0 || block_size <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "KV cache: num_blocks {} and block_size {} must be positive", num_blocks,
                      block_size);
  if (num_state_slots < 0 || num_state_slots > std::numeric_limits<int32_t>::max())
    return make_error(StatusCode::kInvalidArgument, "KV cache: num_state_slots {} out of range",
                      num_state_slots);
  if (shard.count <= 0 || shard.index < 0 || shard.index >= shard.count)
    return make_error(StatusCode::kInvalidArgument, "KV cache: shard {} of {}", shard.index,
                      shard.count);
  static std::atomic<uint64_t> next_id{1};
  KvCache cache;
  cache.id_ = next_id++;
  cache.num_blocks_ = num_blocks;
  cache.block_size_ = block_size;
  cache.num_state_slots_ = num_state_slots;
  cache.shard_ = shard;
  const int64_t stored_blocks = shard.stored_blocks(num_blocks);
  const int64_t num_slots = stored_blocks * block_size;
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerCacheSpec& spec = layers[i];
    if (spec.mla.latent_dim > 0 && spec.mla.dtype == kernels::KvCacheDtype::kFp8 &&
        spec.mla.latent_dim % 128 != 0)
      return make_error(StatusCode::kUnsupported,
                        "KV cache layer {}: an fp8 latent cache needs kv_lora_rank divisible by "
                        "128, got {} (use --kv-cache-dtype bf16)",
                        i, spec.mla.latent_dim);
    DZ_RETURN_IF_ERROR(check_kda_layout(i, spec, num_state_slots));
    Layer layer;
    layer.spec = spec;
    if (spec.mla.latent_dim > 0)
      layer.mla_pool = AlignedBuffer(static_cast<size_t>(num_slots * spec.mla.record_bytes()));
    if (spec.index_key_dim > 0) {
      kernels::IndexCacheLayout index{.key_dim = spec.index_key_dim, .block_size = block_size};
      layer.index_pool = AlignedBuffer(static_cast<size_t>(stored_blocks * index.block_bytes()));
    }
    if (spec.kda.num_heads > 0) {
      layer.kda_states =
          AlignedBuffer(static_cast<size_t>(num_state_slots * spec.kda.state_floats() * 4));
      layer.kda_conv =
          AlignedBuffer(static_cast<size_t>(num_state_slots * spec.kda.conv_elems() * 2));
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

int64_t KvCache::state_bytes_per_slot() const {
  int64_t total = 0;
  for (const Layer& layer : layers_)
    if (layer.spec.kda.num_heads > 0) total += layer.spec.kda.slot_bytes();
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

KdaLayerState KvCache::kda_layer(int layer_id) {
  Layer& layer = layers_.at(static_cast<size_t>(layer_id));
  DZ_CHECK(layer.spec.kda.num_heads > 0, "layer {} has no KDA state", layer_id);
  return {.layout = layer.spec.kda,
          .states = layer.kda_states.as_span<float>().data(),
          .conv = layer.kda_conv.as_span<uint16_t>().data(),
          .num_slots = static_cast<int32_t>(num_state_slots_)};
}

void KvCache::copy_state_slot(int32_t from, int32_t to) {
  DZ_CHECK(from >= 0 && from < num_state_slots_ && to >= 0 && to < num_state_slots_,
           "state slots {} -> {} out of [0, {})", from, to, num_state_slots_);
  if (from == to) return;
  for (Layer& layer : layers_) {
    const KdaStateLayout& kda = layer.spec.kda;
    if (kda.num_heads == 0) continue;
    const size_t state_bytes = static_cast<size_t>(kda.state_floats()) * 4;
    const size_t conv_bytes = static_cast<size_t>(kda.conv_elems()) * 2;
    std::memcpy(layer.kda_states.data() + static_cast<size_t>(to) * state_bytes,
                layer.kda_states.data() + static_cast<size_t>(from) * state_bytes, state_bytes);
    if (conv_bytes > 0)
      std::memcpy(layer.kda_conv.data() + static_cast<size_t>(to) * conv_bytes,
                  layer.kda_conv.data() + static_cast<size_t>(from) * conv_bytes, conv_bytes);
  }
}

template <typename Visit>
void KvCache::visit_block_runs(int32_t stored, int64_t num_rows, Visit visit) {
  const int64_t first_slot = int64_t{stored} * block_size_;
  for (Layer& layer : layers_) {
    if (layer.spec.mla.latent_dim > 0) {  // records are token-major: one run
      const int64_t record_bytes = layer.spec.mla.record_bytes();
      visit(layer.mla_pool.data() + first_slot * record_bytes, num_rows * record_bytes);
    }
    if (layer.spec.index_key_dim > 0) {  // block-planar: the keys and the scales are two runs
      const kernels::IndexCacheLayout index{.key_dim = layer.spec.index_key_dim,
                                            .block_size = block_size_};
      std::byte* pool = layer.index_pool.data();
      visit(pool + index.key_offset_bytes(first_slot), num_rows * index.key_dim);
      visit(pool + index.scale_offset_bytes(first_slot), num_rows * 4);
    }
  }
}

void KvCache::copy_block_rows(int32_t from_block, int32_t to_block, int64_t num_rows) {
  DZ_CHECK(from_block >= 0 && from_block < num_blocks_ && to_block >= 0 && to_block < num_blocks_,
           "blocks {} -> {} out of [0, {})", from_block, to_block, num_blocks_);
  DZ_CHECK(num_rows >= 0 && num_rows <= block_size_, "{} rows of a block of {}", num_rows,
           block_size_);
  if (from_block == to_block || num_rows == 0) return;
  const int32_t from = shard_.stored_block(from_block), to = shard_.stored_block(to_block);
  if (from < 0 && to < 0) return;
  DZ_CHECK(from >= 0 && to >= 0, "blocks {} -> {} cross shards: use block_rows / set_block_rows",
           from_block, to_block);
  std::vector<std::byte*> sources;
  visit_block_runs(from, num_rows, [&](std::byte* run, int64_t) { sources.push_back(run); });
  size_t i = 0;
  visit_block_runs(to, num_rows, [&](std::byte* run, int64_t bytes) {
    std::memcpy(run, sources[i++], static_cast<size_t>(bytes));
  });
}

std::vector<std::byte> KvCache::block_rows(int32_t block, int64_t num_rows) {
  const int32_t stored = shard_.stored_block(block);
  DZ_CHECK(stored >= 0 && num_rows >= 0 && num_rows <= block_size_,
           "block_rows: block {} ({} rows) is not stored here", block, num_rows);
  std::vector<std::byte> rows;
  visit_block_runs(stored, num_rows, [&](std::byte* run, int64_t bytes) {
    rows.insert(rows.end(), run, run + bytes);
  });
  return rows;
}

void KvCache::set_block_rows(int32_t block, int64_t num_rows, std::span<const std::byte> rows) {
  const int32_t stored = shard_.stored_block(block);
  DZ_CHECK(stored >= 0 && num_rows >= 0 && num_rows <= block_size_,
           "set_block_rows: block {} ({} rows) is not stored here", block, num_rows);
  size_t at = 0;
  visit_block_runs(stored, num_rows, [&](std::byte* run, int64_t bytes) {
    DZ_CHECK(at + static_cast<size_t>(bytes) <= rows.size(), "set_block_rows: {} bytes given",
             rows.size());
    std::memcpy(run, rows.data() + at, static_cast<size_t>(bytes));
    at += static_cast<size_t>(bytes);
  });
  DZ_CHECK(at == rows.size(), "set_block_rows: {} bytes given, {} taken", rows.size(), at);
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
