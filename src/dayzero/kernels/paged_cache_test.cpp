// Paged cache record layouts (docs/formats.md §5.2–5.4): round trips through the accessors, byte
// positions, and the block-planar index cache read back through its offsets.
#include "dayzero/kernels/paged_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"

namespace dz::kernels {
namespace paged_cache_test {

// Values whose magnitude varies per 128-tile (so each tile gets its own scale), not BF16-valued.
std::vector<float> random_values(std::mt19937& rng, int64_t num_elems, bool vary_tiles) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 6);
  std::vector<float> v(static_cast<size_t>(num_elems));
  float magnitude = 1.0f;
  for (int64_t i = 0; i < num_elems; ++i) {
    if (vary_tiles && i % 128 == 0) magnitude = std::ldexp(1.0f, exponent(rng));
    v[static_cast<size_t>(i)] = normal(rng) * magnitude;
  }
  return v;
}

TEST(PagedCache, RecordBytesForDeepSeek) {
  EXPECT_EQ((MlaCacheLayout{.latent_dim = 512, .rope_dim = 64, .dtype = KvCacheDtype::kFp8}
                 .record_bytes()),
            656);
  EXPECT_EQ((MlaCacheLayout{.latent_dim = 512, .rope_dim = 64, .dtype = KvCacheDtype::kBf16}
                 .record_bytes()),
            1152);
  EXPECT_EQ((IndexCacheLayout{.key_dim = 128, .block_size = 64}.block_bytes()), 64 * 132);
}

class MlaRecordRoundTrip : public ::testing::TestWithParam<KvCacheDtype> {};

TEST_P(MlaRecordRoundTrip, EverySlotOfSeveralBlocksReadsBackItsOwnRecord) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const MlaCacheLayout layout{.latent_dim = 256, .rope_dim = 64, .dtype = GetParam()};
  const int64_t block_size = 16, num_blocks = 4;
  const int64_t num_slots = block_size * num_blocks;
  const int64_t width = layout.latent_dim + layout.rope_dim;
  std::vector<std::byte> pool(static_cast<size_t>(num_slots * layout.record_bytes()));
  std::vector<std::vector<float>> latents, ropes;
  // Write in a shuffled slot order so that a record overwriting its neighbour shows up.
  std::vector<int64_t> order(static_cast<size_t>(num_slots));
  for (int64_t s = 0; s < num_slots; ++s) order[static_cast<size_t>(s)] = s;
  std::shuffle(order.begin(), order.end(), rng);
  latents.resize(static_cast<size_t>(num_slots));
  ropes.resize(static_cast<size_t>(num_slots));
  for (int64_t slot : order) {
    auto& latent = latents[static_cast<size_t>(slot)];
    auto& rope = ropes[static_cast<size_t>(slot)];
    latent = random_values(rng, layout.latent_dim, true);
    // The cache receives BF16-valued latents (docs/models.md §0); the bf16 layout is also checked
    // on unrounded input below.
    if (layout.dtype == KvCacheDtype::kFp8)
      for (auto& v : latent) v = formats::round_to_bf16(v);
    rope = random_values(rng, layout.rope_dim, false);
    write_mla_record(layout, pool.data(), slot, latent.data(), rope.data());
  }
  std::vector<float> out(static_cast<size_t>(width));
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    const auto& latent = latents[static_cast<size_t>(slot)];
    const auto& rope = ropes[static_cast<size_t>(slot)];
    read_mla_record(layout, pool.data(), slot, out.data());
    std::vector<float> expected(static_cast<size_t>(width));
    if (layout.dtype == KvCacheDtype::kFp8) {
      std::vector<uint16_t> bf16(latent.size());
      for (size_t i = 0; i < latent.size(); ++i) bf16[i] = formats::encode_bf16(latent[i]);
      std::vector<uint8_t> codes(latent.size());
      std::vector<float> scales(latent.size() / 128);
      formats::act_quant(bf16, formats::ActScaleFormat::kUe8m0, codes, scales);
      for (size_t i = 0; i < latent.size(); ++i)
        expected[i] = formats::decode_e4m3(codes[i]) * scales[i / 128];
      // Byte positions of §5.2: codes, then FP32 scales, then BF16 k_pe.
      const std::byte* record = pool.data() + slot * layout.record_bytes();
      ASSERT_EQ(std::memcmp(record, codes.data(), codes.size()), 0) << "slot " << slot;
      ASSERT_EQ(std::memcmp(record + 256, scales.data(), scales.size() * 4), 0) << "slot " << slot;
      uint16_t first_rope;
      std::memcpy(&first_rope, record + 256 + 8, 2);
      ASSERT_EQ(first_rope, formats::encode_bf16(rope[0])) << "slot " << slot;
    } else {
      for (size_t i = 0; i < latent.size(); ++i) expected[i] = formats::round_to_bf16(latent[i]);
      const std::byte* record = pool.data() + slot * layout.record_bytes();
      uint16_t first_rope;
      std::memcpy(&first_rope, record + 256 * 2, 2);
      ASSERT_EQ(first_rope, formats::encode_bf16(rope[0])) << "slot " << slot;
    }
    for (size_t i = 0; i < rope.size(); ++i)
      expected[latent.size() + i] = formats::round_to_bf16(rope[i]);  // k_pe is never quantized
    for (size_t i = 0; i < expected.size(); ++i)
      ASSERT_EQ(out[i], expected[i]) << "slot " << slot << " element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MlaRecordRoundTrip,
                         ::testing::Values(KvCacheDtype::kFp8, KvCacheDtype::kBf16));

TEST(PagedCache, Fp8TilesHaveTheirOwnPowerOfTwoScales) {
  const MlaCacheLayout layout{.latent_dim = 512, .rope_dim = 64, .dtype = KvCacheDtype::kFp8};
  std::vector<float> latent(512), rope(64, 0.5f);
  for (int64_t i = 0; i < 512; ++i)  // tile k has amax 448 · 2^(k − 3) exactly
    latent[static_cast<size_t>(i)] =
        (i % 128 == 7 ? 448.0f : 1.0f) * std::ldexp(1.0f, int(i / 128) - 3);
  std::vector<std::byte> pool(static_cast<size_t>(layout.record_bytes()));
  write_mla_record(layout, pool.data(), 0, latent.data(), rope.data());
  for (int tile = 0; tile < 4; ++tile) {
    float scale;
    std::memcpy(&scale, pool.data() + 512 + tile * 4, 4);
    EXPECT_EQ(scale, std::ldexp(1.0f, tile - 3)) << "tile " << tile;
  }
  std::vector<float> out(576);
  read_mla_record(layout, pool.data(), 0, out.data());
  for (size_t i = 0; i < 512; ++i) ASSERT_EQ(out[i], latent[i]) << i;  // all exactly representable
}

TEST(PagedCache, Fp8LatentMustBeWholeTiles) {
  const MlaCacheLayout layout{.latent_dim = 200, .rope_dim = 64, .dtype = KvCacheDtype::kFp8};
  std::vector<float> latent(200, 1.0f), rope(64, 1.0f);
  std::vector<std::byte> pool(1024);
  EXPECT_DEATH(write_mla_record(layout, pool.data(), 0, latent.data(), rope.data()),
               "fp8 latent_dim 200 is not a multiple of 128");
}

TEST(PagedCache, IndexKeysAreBlockPlanarNotInterleaved) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 2.0f);
  const IndexCacheLayout layout{.key_dim = 128, .block_size = 16};
  const int64_t num_blocks = 3, num_slots = num_blocks * layout.block_size;
  std::vector<std::byte> pool(static_cast<size_t>(num_blocks * layout.block_bytes()));
  std::vector<std::vector<uint8_t>> keys(static_cast<size_t>(num_slots));
  std::vector<float> scales(static_cast<size_t>(num_slots));
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    auto& key = keys[static_cast<size_t>(slot)];
    key.resize(128);
    for (auto& c : key) c = static_cast<uint8_t>(byte(rng) & 0x7E);  // no NaN codes
    key[0] = static_cast<uint8_t>(slot);                             // distinct per slot
    scales[static_cast<size_t>(slot)] = unit(rng);
    write_index_key(layout, pool.data(), slot, key, scales[static_cast<size_t>(slot)]);
  }
  int64_t interleaved_mismatches = 0;
  for (int64_t slot = 0; slot < num_slots; ++slot) {
    const auto& key = keys[static_cast<size_t>(slot)];
    ASSERT_EQ(std::memcmp(pool.data() + layout.key_offset_bytes(slot), key.data(), 128), 0)
        << "slot " << slot;
    float scale;
    std::memcpy(&scale, pool.data() + layout.scale_offset_bytes(slot), 4);
    ASSERT_EQ(scale, scales[static_cast<size_t>(slot)]) << "slot " << slot;
    // Token o of block b at b·B·132 + o·132 (key) and + 128 (scale): the silent-corruption bug.
    const std::byte* wrong = pool.data() + slot * 132;
    float wrong_scale;
    std::memcpy(&wrong_scale, wrong + 128, 4);
    if (std::memcmp(wrong, key.data(), 128) != 0 ||
        wrong_scale != scales[static_cast<size_t>(slot)])
      ++interleaved_mismatches;
  }
  // Only slot 0 of block 0 coincides in both readings (its key; its scale does not).
  EXPECT_EQ(interleaved_mismatches, num_slots);
  EXPECT_EQ(layout.key_offset_bytes(17), 16 * 132 + 128);
  EXPECT_EQ(layout.scale_offset_bytes(17), 16 * 132 + 16 * 128 + 4);
}

TEST(PagedCache, IndexKeyOfTheWrongWidthIsRefused) {
  const IndexCacheLayout layout{.key_dim = 128, .block_size = 16};
  std::vector<std::byte> pool(static_cast<size_t>(layout.block_bytes()));
  std::vector<uint8_t> key(64, 1);
  EXPECT_DEATH(write_index_key(layout, pool.data(), 0, key, 1.0f),
               "index key of 64 codes, want 128");
}

}  // namespace paged_cache_test
}  // namespace dz::kernels
