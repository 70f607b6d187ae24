#include "dayzero/model/kv_cache.h"

#include <gtest/gtest.h>

namespace dz::model {
namespace {

LayerCacheSpec deepseek_layer(kernels::KvCacheDtype dtype) {
  return {.mla = {.latent_dim = 512, .rope_dim = 64, .dtype = dtype}, .index_key_dim = 128};
}

TEST(KvCache, BytesPerTokenMatchModelsMd) {
  // models.md §7.5: 61 × (656 fp8 or 1152 bf16 + 132 indexer) = 48,068 / 78,324 B per token.
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

}  // namespace
}  // namespace dz::model
