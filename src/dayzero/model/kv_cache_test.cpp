#include "dayzero/model/kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

namespace dz::model {
namespace kv_cache_test {

LayerCacheSpec deepseek_layer(kernels::KvCacheDtype dtype) {
  return {.mla = {.latent_dim = 512, .rope_dim = 64, .dtype = dtype}, .index_key_dim = 128};
}

TEST(KvCache, BytesPerTokenMatchModelsMd) {
  // docs/models.md §7.5: 61 × (656 fp8 or 1152 bf16 + 132 indexer) = 48,068 / 78,324 B per token.
  std::vector<LayerCacheSpec> fp8(61, deepseek_layer(kernels::KvCacheDtype::kFp8));
  std::vector<LayerCacheSpec> bf16(61, deepseek_layer(kernels::KvCacheDtype::kBf16));
  EXPECT_EQ(KvCache::create(fp8, 2, 64)->bytes_per_token(), 48068);
  EXPECT_EQ(KvCache::create(bf16, 2, 64)->bytes_per_token(), 78324);
}

TEST(KvCache, PoolsAreDistinctPerLayer) {
  std::vector<LayerCacheSpec> layers(3, deepseek_layer(kernels::KvCacheDtype::kFp8));
  Result<KvCache> cache = KvCache::create(layers, 5, 16);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->num_layers(), 3);
  EXPECT_NE(cache->mla_layer(0).pool, cache->mla_layer(1).pool);
  EXPECT_NE(cache->index_layer(1).pool, cache->index_layer(2).pool);
  EXPECT_EQ(cache->index_layer(2).layout.block_size, 16);
  EXPECT_EQ(cache->mla_layer(2).layout.record_bytes(), 656);
}

TEST(KvCache, RefusesBadSizesAndFp8LatentsOffTheTileGrid) {
  std::vector<LayerCacheSpec> layers(1, deepseek_layer(kernels::KvCacheDtype::kFp8));
  EXPECT_EQ(KvCache::create(layers, 0, 64).status().code(), StatusCode::kInvalidArgument);
  layers[0].mla.latent_dim = 192;
  EXPECT_EQ(KvCache::create(layers, 1, 64).status().message(),
            "KV cache layer 0: an fp8 latent cache needs kv_lora_rank divisible by 128, got 192 "
            "(use --kv-cache-dtype bf16)");
  layers[0].mla.dtype = kernels::KvCacheDtype::kBf16;
  EXPECT_TRUE(KvCache::create(layers, 1, 64).ok());
}

LayerCacheSpec kda_layer_spec(int64_t heads, int64_t head_dim) {
  return {.kda = {.num_heads = heads, .head_dim = head_dim, .conv_width = 4}};
}

TEST(KvCache, KdaStateSizesMatchFormatsMd) {
  // docs/formats.md §5.5, Kimi-Linear: 32 heads of 128, W = 4: 2 MiB state + 72 KiB BF16 conv rows
  // per layer and slot; 20 KDA layers and 7 MLA layers (bf16 latents 512 + 64: 1152 B per token).
  std::vector<LayerCacheSpec> layers;
  for (int i = 0; i < 27; ++i)
    layers.push_back(i % 4 == 3 || i == 26
                         ? LayerCacheSpec{.mla = {.latent_dim = 512,
                                                  .rope_dim = 64,
                                                  .dtype = kernels::KvCacheDtype::kBf16}}
                         : kda_layer_spec(32, 128));
  Result<KvCache> cache = KvCache::create(layers, 2, 64, 1);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  EXPECT_EQ(cache->kda_layer(0).layout.state_floats() * 4, 2 << 20);
  EXPECT_EQ(cache->kda_layer(0).layout.conv_elems() * 2, 72 << 10);
  EXPECT_EQ(cache->state_bytes_per_slot(), 20 * ((2 << 20) + (72 << 10)));
  EXPECT_EQ(cache->bytes_per_token(), 7 * 1152);  // the paged part only
  EXPECT_EQ(cache->num_state_slots(), 1);
  // DeepSeek-like caches have no state.
  std::vector<LayerCacheSpec> mla(3, deepseek_layer(kernels::KvCacheDtype::kFp8));
  EXPECT_EQ(KvCache::create(mla, 2, 64)->state_bytes_per_slot(), 0);
}

TEST(KvCache, StateSlotsAreDistinctAndCopyWholeSlots) {
  std::vector<LayerCacheSpec> layers = {
      kda_layer_spec(2, 8), deepseek_layer(kernels::KvCacheDtype::kBf16), kda_layer_spec(3, 4)};
  Result<KvCache> cache = KvCache::create(layers, 1, 16, 3);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  const KdaLayerState a = cache->kda_layer(0), b = cache->kda_layer(2);
  EXPECT_EQ(a.state(1) - a.state(0), 2 * 8 * 8);
  EXPECT_EQ(a.conv_rows(2) - a.conv_rows(1), 3 * 3 * 2 * 8);
  EXPECT_EQ(b.state(2) - b.state(0), 2 * 3 * 4 * 4);
  // Distinct values in slot 1 of both layers; slots start zeroed.
  for (const KdaLayerState& s : {a, b}) {
    for (int64_t i = 0; i < s.layout.state_floats(); ++i) s.state(1)[i] = static_cast<float>(i + 1);
    for (int64_t i = 0; i < s.layout.conv_elems(); ++i)
      s.conv_rows(1)[i] = static_cast<uint16_t>(1000 + i);
  }
  cache->copy_state_slot(1, 2);
  for (const KdaLayerState& s : {a, b}) {
    for (int64_t i = 0; i < s.layout.state_floats(); ++i) {
      ASSERT_EQ(s.state(2)[i], static_cast<float>(i + 1));
      ASSERT_EQ(s.state(0)[i], 0.0f);
    }
    for (int64_t i = 0; i < s.layout.conv_elems(); ++i) {
      ASSERT_EQ(s.conv_rows(2)[i], 1000 + i);
      ASSERT_EQ(s.conv_rows(0)[i], 0);
    }
  }
  cache->copy_state_slot(0, 1);  // back to zeros
  EXPECT_EQ(a.state(1)[5], 0.0f);
  EXPECT_EQ(b.conv_rows(1)[7], 0);
}

TEST(KvCache, RefusesBadStateSlotSizes) {
  std::vector<LayerCacheSpec> layers = {kda_layer_spec(2, 8)};
  EXPECT_EQ(KvCache::create(layers, 1, 16).status().message(),
            "KV cache layer 0: a KDA layer needs num_state_slots > 0, got 0");
  EXPECT_EQ(KvCache::create(layers, 1, 16, -1).status().message(),
            "KV cache: num_state_slots -1 out of range");
  layers[0].kda.head_dim = 0;
  EXPECT_EQ(KvCache::create(layers, 1, 16, 2).status().message(),
            "KV cache layer 0: KDA state of 2 heads of 0 with conv width 4 (want all positive)");
  layers[0] = kda_layer_spec(2, 8);
  layers[0].mla = {.latent_dim = 512, .rope_dim = 64, .dtype = kernels::KvCacheDtype::kBf16};
  EXPECT_EQ(KvCache::create(layers, 1, 16, 2).status().message(),
            "KV cache layer 0: a layer has an MLA cache or a KDA state, not both");
  layers[0] = kda_layer_spec(1 << 16, 1 << 12);
  EXPECT_EQ(KvCache::create(layers, 1, 16, 32).status().message(),
            "KV cache layer 0: 32 state slots of 4402878349312 bytes exceed 70368744177664 bytes");
}

TEST(KvCacheDeathTest, StateAccessorsCheckTheirArguments) {
  std::vector<LayerCacheSpec> layers = {kda_layer_spec(2, 8),
                                        deepseek_layer(kernels::KvCacheDtype::kBf16)};
  Result<KvCache> cache = KvCache::create(layers, 1, 16, 2);
  ASSERT_TRUE(cache.ok());
  EXPECT_DEATH(cache->kda_layer(1), "layer 1 has no KDA state");
  EXPECT_DEATH(cache->copy_state_slot(0, 2), "state slots 0 -> 2 out of \\[0, 2\\)");
  EXPECT_DEATH(cache->mla_layer(0), "layer 0 has no MLA cache");
}

// Fills a pool with random bytes and returns a copy of it.
std::vector<std::byte> randomize(std::byte* pool, int64_t num_bytes, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int64_t i = 0; i < num_bytes; ++i) pool[i] = static_cast<std::byte>(byte(rng));
  return std::vector<std::byte>(pool, pool + num_bytes);
}

TEST(KvCache, CopyBlockRowsCopiesTheFilledRowsOfEveryPagedPool) {
  // Layer 0: fp8 latent + indexer; layer 1: KDA (no paged cache); layer 2: bf16 latent only.
  std::vector<LayerCacheSpec> layers = {
      {.mla = {.latent_dim = 128, .rope_dim = 16, .dtype = kernels::KvCacheDtype::kFp8},
       .index_key_dim = 32},
      kda_layer_spec(2, 8),
      {.mla = {.latent_dim = 64, .rope_dim = 16, .dtype = kernels::KvCacheDtype::kBf16}}};
  constexpr int64_t kBlocks = 5, kB = 16, kRows = 5;
  Result<KvCache> cache = KvCache::create(layers, kBlocks, kB, 1);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  std::mt19937 rng(7);
  const MlaLayerCache mla0 = cache->mla_layer(0), mla2 = cache->mla_layer(2);
  const IndexLayerCache index0 = cache->index_layer(0);
  const int64_t mla0_bytes = kBlocks * kB * mla0.layout.record_bytes();
  const int64_t mla2_bytes = kBlocks * kB * mla2.layout.record_bytes();
  const int64_t index_bytes = kBlocks * index0.layout.block_bytes();
  std::vector<std::byte> want0 = randomize(mla0.pool, mla0_bytes, rng);
  std::vector<std::byte> want2 = randomize(mla2.pool, mla2_bytes, rng);
  std::vector<std::byte> want_index = randomize(index0.pool, index_bytes, rng);
  cache->copy_block_rows(3, 1, kRows);
  // Expected: slots [16, 21) take slots [48, 53), record by record; keys and scales likewise.
  for (int64_t row = 0; row < kRows; ++row) {
    for (auto [layout, want] : {std::pair{mla0.layout, &want0}, std::pair{mla2.layout, &want2}})
      std::memcpy(want->data() + (kB + row) * layout.record_bytes(),
                  want->data() + (3 * kB + row) * layout.record_bytes(),
                  static_cast<size_t>(layout.record_bytes()));
    const kernels::IndexCacheLayout& index = index0.layout;
    std::memcpy(want_index.data() + index.key_offset_bytes(kB + row),
                want_index.data() + index.key_offset_bytes(3 * kB + row),
                static_cast<size_t>(index.key_dim));
    std::memcpy(want_index.data() + index.scale_offset_bytes(kB + row),
                want_index.data() + index.scale_offset_bytes(3 * kB + row), 4);
  }
  EXPECT_EQ(std::vector<std::byte>(mla0.pool, mla0.pool + mla0_bytes), want0);
  EXPECT_EQ(std::vector<std::byte>(mla2.pool, mla2.pool + mla2_bytes), want2);
  EXPECT_EQ(std::vector<std::byte>(index0.pool, index0.pool + index_bytes), want_index);
  // The copied rows really differ from what was there (random bytes), and row kRows was left.
  EXPECT_NE(std::memcmp(mla0.pool + kB * mla0.layout.record_bytes(),
                        mla0.pool + (kB + kRows) * mla0.layout.record_bytes(),
                        static_cast<size_t>(mla0.layout.record_bytes())),
            0);
  cache->copy_block_rows(2, 2, kB);  // a no-op
  cache->copy_block_rows(0, 4, 0);   // a no-op
  EXPECT_EQ(std::vector<std::byte>(mla0.pool, mla0.pool + mla0_bytes), want0);
  EXPECT_DEATH(cache->copy_block_rows(0, 5, 1), "blocks 0 -> 5 out of \\[0, 5\\)");
  EXPECT_DEATH(cache->copy_block_rows(0, 1, 17), "17 rows of a block of 16");
}

TEST(KvCache, AShardStoresEveryCountthBlockAndMovesRowsAsBytes) {
  // Context parallelism (docs/parallel.md §9.4): shard 1 of 3 over 8 blocks stores blocks 1, 4, 7
  // as its blocks 0, 1, 2.
  std::vector<LayerCacheSpec> layers = {
      {.mla = {.latent_dim = 128, .rope_dim = 16, .dtype = kernels::KvCacheDtype::kFp8},
       .index_key_dim = 32},
      kda_layer_spec(2, 8),
      {.mla = {.latent_dim = 64, .rope_dim = 16, .dtype = kernels::KvCacheDtype::kBf16}}};
  constexpr int64_t kBlocks = 8, kB = 16;
  const BlockShard shard{.count = 3, .index = 1};
  Result<KvCache> cache = KvCache::create(layers, kBlocks, kB, 1, shard);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  EXPECT_EQ(cache->num_blocks(), kBlocks);
  EXPECT_EQ(shard.stored_blocks(kBlocks), 3);
  EXPECT_EQ(shard.stored_block(4), 1);
  EXPECT_EQ(shard.stored_block(5), -1);
  EXPECT_EQ(shard.stored_slot(7 * kB + 3, kB), 2 * kB + 3);
  EXPECT_EQ(shard.stored_slot(6 * kB + 3, kB), -1);
  EXPECT_EQ(shard.stored_table(std::vector<int32_t>{7, 0, 1}), (std::vector<int32_t>{2, -1, 0}));
  // Random bytes in every stored row of every paged pool.
  std::mt19937 rng(11);
  const MlaLayerCache mla0 = cache->mla_layer(0), mla2 = cache->mla_layer(2);
  const IndexLayerCache index0 = cache->index_layer(0);
  randomize(mla0.pool, 3 * kB * mla0.layout.record_bytes(), rng);
  randomize(mla2.pool, 3 * kB * mla2.layout.record_bytes(), rng);
  randomize(index0.pool, 3 * index0.layout.block_bytes(), rng);
  // A block's first rows as bytes: per paged pool, records then keys then scales.
  const int64_t per_row = cache->bytes_per_token();
  EXPECT_EQ(per_row, mla0.layout.record_bytes() + 32 + 4 + mla2.layout.record_bytes());
  const std::vector<std::byte> rows7 = cache->block_rows(7, 5);
  ASSERT_EQ(static_cast<int64_t>(rows7.size()), 5 * per_row);
  EXPECT_EQ(std::memcmp(rows7.data(), mla0.pool + 2 * kB * mla0.layout.record_bytes(),
                        static_cast<size_t>(5 * mla0.layout.record_bytes())),
            0);
  EXPECT_NE(cache->block_rows(1, 5), rows7);
  cache->set_block_rows(1, 5, rows7);
  EXPECT_EQ(cache->block_rows(1, 5), rows7);
  EXPECT_NE(cache->block_rows(1, 6), cache->block_rows(7, 6));  // row 5 was left
  // Copies within the shard, none for two blocks it does not store, and none across shards.
  cache->copy_block_rows(4, 7, kB);
  EXPECT_EQ(cache->block_rows(7, kB), cache->block_rows(4, kB));
  const std::vector<std::byte> before = cache->block_rows(4, kB);
  cache->copy_block_rows(2, 5, kB);
  EXPECT_EQ(cache->block_rows(4, kB), before);
  EXPECT_DEATH(cache->copy_block_rows(1, 2, 1), "blocks 1 -> 2 cross shards");
  EXPECT_DEATH(cache->block_rows(3, 1), "block 3 \\(1 rows\\) is not stored here");
  EXPECT_EQ(KvCache::create(layers, kBlocks, kB, 1, {.count = 2, .index = 2}).status().message(),
            "KV cache: shard 2 of 2");
}

TEST(SequentialBlocks, HandsOutBlocksFromTheTopAndMapsSlots) {
  SequentialBlocks blocks(4, 16);
  ASSERT_TRUE(blocks.reserve(1).ok());
  EXPECT_EQ(std::vector<int32_t>(blocks.block_table().begin(), blocks.block_table().end()),
            std::vector<int32_t>({3}));
  ASSERT_TRUE(blocks.reserve(33).ok());
  EXPECT_EQ(std::vector<int32_t>(blocks.block_table().begin(), blocks.block_table().end()),
            std::vector<int32_t>({3, 2, 1}));
  EXPECT_EQ(blocks.slot_of(0), 48);
  EXPECT_EQ(blocks.slot_of(17), 2 * 16 + 1);
  EXPECT_EQ(blocks.slot_of(32), 16);
  EXPECT_EQ(blocks.reserve(65).message(),
            "KV cache: 65 tokens need 5 blocks of 16, the pool has 4");
}

}  // namespace kv_cache_test
}  // namespace dz::model
