#include "dayzero/formats/mxfp4_layouts.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"
#include "dayzero/formats/mx_block.h"

namespace dz::formats {
namespace mxfp4_layouts_test {

// Element (r, c) of the logical weight straight from the description in docs/formats.md §3.4:
// nibble c % 2 of byte [r, c / 2], scale code [r, c / 32].
float spec_element(const std::vector<uint8_t>& packed, const std::vector<uint8_t>& scale,
                   int64_t num_cols, int64_t r, int64_t c) {
  const uint8_t byte = packed[r * (num_cols / 2) + c / 2];
  const uint8_t nibble = c % 2 == 0 ? (byte & 0xF) : (byte >> 4);
  const double value = static_cast<double>(decode_e2m1_int(nibble)) *
                       std::ldexp(1.0, scale[r * (num_cols / 32) + c / 32] - 127);
  return static_cast<float>(value);
}

TEST(Mxfp4Layouts, CompressedTensorsPackedMatchesTheSpecIndexing) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> scale_code(0, 254);  // includes 0 = 2^-127
  const int64_t num_rows = 5, num_cols = 96;
  std::vector<uint8_t> packed(num_rows * num_cols / 2), scale(num_rows * num_cols / 32);
  for (auto& b : packed) b = static_cast<uint8_t>(byte(rng));
  for (auto& s : scale) s = static_cast<uint8_t>(scale_code(rng));
  scale[0] = 0;
  std::vector<float> out(num_rows * num_cols);
  dequantize_mxfp4_packed(packed, scale, num_rows, num_cols, out);
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t c = 0; c < num_cols; ++c)
      ASSERT_EQ(std::bit_cast<uint32_t>(out[r * num_cols + c]),
                std::bit_cast<uint32_t>(spec_element(packed, scale, num_cols, r, c)))
          << r << "," << c;
}

TEST(Mxfp4Layouts, GptOssBlocksMatchTheSpecIndexing) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> scale_code(100, 140);
  const int64_t num_experts = 3, num_rows = 4, num_cols = 64;
  // blocks [E, out, in/32, 16], scales [E, out, in/32]
  std::vector<uint8_t> blocks(num_experts * num_rows * (num_cols / 32) * 16);
  std::vector<uint8_t> scales(num_experts * num_rows * (num_cols / 32));
  for (auto& b : blocks) b = static_cast<uint8_t>(byte(rng));
  for (auto& s : scales) s = static_cast<uint8_t>(scale_code(rng));
  std::vector<float> out(num_experts * num_rows * num_cols);
  dequantize_mxfp4_gpt_oss(blocks, scales, num_experts, num_rows, num_cols, out);
  for (int64_t e = 0; e < num_experts; ++e) {
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t c = 0; c < num_cols; ++c) {
        // Byte j of block b holds element 32b + 2j (low nibble) and 32b + 2j + 1 (high nibble).
        const int64_t block = (e * num_rows + r) * (num_cols / 32) + c / 32;
        const uint8_t byte_value = blocks[block * 16 + (c % 32) / 2];
        const uint8_t nibble = c % 2 == 0 ? (byte_value & 0xF) : (byte_value >> 4);
        const float expected = decode_e2m1_int(nibble) * std::ldexp(1.0f, scales[block] - 127);
        ASSERT_EQ(out[(e * num_rows + r) * num_cols + c], expected) << e << "," << r << "," << c;
      }
    }
  }
}

TEST(Mxfp4Layouts, QuantizePackDequantizeRoundTrip) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t num_rows = 6, num_cols = 128;
  std::vector<float> w(num_rows * num_cols);
  for (auto& v : w) v = normal(rng);
  std::vector<uint8_t> codes(w.size()), scales(w.size() / 32), packed(w.size() / 2);
  quantize_mx(w, MxElem::kE2M1, MxScaleRule::kFloorLog2AmaxRoundedAt1p75, codes, scales);
  pack_fp4(codes, packed);
  std::vector<float> via_layout(w.size()), via_mx(w.size());
  dequantize_mxfp4_packed(packed, scales, num_rows, num_cols, via_layout);
  dequantize_mx(codes, scales, MxElem::kE2M1, via_mx);
  EXPECT_EQ(via_layout, via_mx);
  // Error bound: under EVEN, |x| / 2^k < 7 for every element, so each lies in a binade with an E2M1
  // step of at most 2 (times 2^k) or clips from below 7 to 6: the error is at most 2^k <= amax / 4.
  for (int64_t b = 0; b < num_rows * num_cols / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(w[b * 32 + i]));
    for (int i = 0; i < 32; ++i)
      ASSERT_LE(std::fabs(via_layout[b * 32 + i] - w[b * 32 + i]), 0.25f * amax);
  }
}

}  // namespace mxfp4_layouts_test
}  // namespace dz::formats
