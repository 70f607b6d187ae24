// DeepSeek act_quant (docs/formats.md §4.1): bit-for-bit, so every check is exact.
#include "dayzero/formats/act_quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"

namespace dz::formats {
namespace act_quant_test {

std::vector<uint16_t> to_bf16(const std::vector<float>& values) {
  std::vector<uint16_t> codes(values.size());
  std::transform(values.begin(), values.end(), codes.begin(),
                 [](float v) { return encode_bf16(v); });
  return codes;
}

// The ue8m0 scale from its definition: r = fl32(amax · fl32(1/448)) (an FP64 product of two floats
// is exact, so one cast rounds it like FP32 multiplication), s = 2^ceil(log2 r).
float reference_ue8m0_scale(float amax) {
  const float r = static_cast<float>(static_cast<double>(std::max(amax, 1e-4f)) *
                                     static_cast<double>(1.0f / 448.0f));
  int e = 0;
  const double f = std::frexp(static_cast<double>(r), &e);
  return static_cast<float>(std::ldexp(1.0, f == 0.5 ? e - 1 : e));
}

TEST(ActQuant, WorkedExample) {
  // amax 3: r = 3/448 ≈ 0.0067 → s = 2^-7; x · 128: 1 → 128 (0x70), 3 → 384 (0x7C), −0.5 → −64
  // (0xE8).
  std::vector<float> x(128, 0.0f);
  x[0] = 1.0f;
  x[1] = 3.0f;
  x[2] = -0.5f;
  x[3] = 0x1p-17f;  // 2^-10 after scaling: ties to zero, keeps its sign
  x[4] = -0x1p-17f;
  std::vector<uint8_t> codes(128);
  std::vector<float> scales(1);
  act_quant(to_bf16(x), ActScaleFormat::kUe8m0, codes, scales);
  EXPECT_EQ(scales[0], 0x1p-7f);
  EXPECT_EQ(codes[0], 0x70);
  EXPECT_EQ(codes[1], 0x7C);
  EXPECT_EQ(codes[2], 0xE8);
  EXPECT_EQ(codes[3], 0x00);
  EXPECT_EQ(codes[4], 0x80);
  EXPECT_EQ(codes[5], 0x00);
}

TEST(ActQuant, TinyGroupsUseTheAmaxFloor) {
  // amax clamps at 1e-4: the smallest possible scale is 2^-22.
  std::vector<float> x(256, 1e-6f);
  x[200] = -3e-5f;
  std::vector<uint8_t> codes(256);
  std::vector<float> scales(2);
  act_quant(to_bf16(x), ActScaleFormat::kUe8m0, codes, scales);
  EXPECT_EQ(scales[0], 0x1p-22f);
  EXPECT_EQ(scales[1], 0x1p-22f);
  act_quant(to_bf16(x), ActScaleFormat::kPlain, codes, scales);
  EXPECT_EQ(scales[0], 1e-4f * (1.0f / 448.0f));
}

TEST(ActQuant, Ue8m0ScaleIsCeilLog2OfAmaxOver448AtEveryPowerOfTwoBoundary) {
  std::vector<uint8_t> codes(128);
  std::vector<float> scales(1);
  for (int j = -13; j <= 117; ++j) {  // amax = 448 · 2^j from ~0.05 to the BF16 range top
    const auto boundary = static_cast<float>(std::ldexp(448.0, j));
    for (uint16_t amax_code :
         {static_cast<uint16_t>(encode_bf16(boundary) - 1), encode_bf16(boundary),
          static_cast<uint16_t>(encode_bf16(boundary) + 1)}) {
      std::vector<uint16_t> x(128, encode_bf16(1e-3f));
      x[77] = amax_code | 0x8000;  // negative amax
      act_quant(x, ActScaleFormat::kUe8m0, codes, scales);
      const float amax = decode_bf16(amax_code);
      int e = 0;
      const double f = std::frexp(static_cast<double>(amax) / 448.0, &e);
      ASSERT_EQ(scales[0], std::ldexp(1.0f, f == 0.5 ? e - 1 : e)) << j;
      ASSERT_EQ(scales[0], reference_ue8m0_scale(amax)) << j;
      ASSERT_EQ(codes[77] & 0x7F, encode_e4m3(amax / scales[0]) & 0x7F);
      ASSERT_LE(decode_e4m3(codes[77] & 0x7F), 448.0f);
    }
  }
}

TEST(ActQuant, RandomGroupsMatchTheDefinitionBitForBit) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> magnitude(-20, 20);
  constexpr int kNumGroups = 12;
  std::vector<float> x(kNumGroups * 128);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(normal(rng), magnitude(rng) / 4 + static_cast<int>(i / 128));
  const std::vector<uint16_t> x_bf16 = to_bf16(x);
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(kNumGroups);
  for (ActScaleFormat format : {ActScaleFormat::kUe8m0, ActScaleFormat::kPlain}) {
    act_quant(x_bf16, format, codes, scales);
    for (int g = 0; g < kNumGroups; ++g) {
      float amax = 0.0f;
      for (int i = 0; i < 128; ++i)
        amax = std::max(amax, std::fabs(decode_bf16(x_bf16[g * 128 + i])));
      const float r = std::max(amax, 1e-4f) * (1.0f / 448.0f);
      const float s = format == ActScaleFormat::kUe8m0 ? reference_ue8m0_scale(amax) : r;
      ASSERT_EQ(scales[g], s);
      for (int i = 0; i < 128; ++i) {
        const float v = decode_bf16(x_bf16[g * 128 + i]);
        const uint8_t code = codes[g * 128 + i];
        ASSERT_EQ(code, encode_e4m3(std::clamp(v / s, -448.0f, 448.0f)));
        // Dequantized error: at most half an E4M3 step (relative 2^-4, absolute 2^-10 · s) of
        // v / s, which is itself rounded to FP32 (a plain scale is no power of two): a value at
        // a rounding midpoint may exceed the half step by that rounding, hence the 2^-20 slack.
        // The error is taken in FP64 so the check adds no rounding of its own.
        const double error = std::fabs(static_cast<double>(decode_e4m3(code)) * s - v);
        ASSERT_LE(error, std::max(std::fabs(v) * 0x1p-4, 0x1p-10 * s) * (1.0 + 0x1p-20));
      }
    }
  }
}

TEST(ActQuant, NanOrInfGroupGetsNanScaleAndNanCodes) {
  std::vector<float> x(384, 0.25f);
  x[130] = NAN;
  x[300] = INFINITY;
  std::vector<uint8_t> codes(384);
  std::vector<float> scales(3);
  act_quant(to_bf16(x), ActScaleFormat::kUe8m0, codes, scales);
  EXPECT_EQ(scales[0], reference_ue8m0_scale(0.25f));
  EXPECT_TRUE(std::isnan(scales[1]));
  EXPECT_TRUE(std::isnan(scales[2]));
  EXPECT_TRUE(std::all_of(codes.begin() + 128, codes.end(), [](uint8_t c) { return c == 0x7F; }));
  EXPECT_NE(codes[0], 0x7F);
}

}  // namespace act_quant_test
}  // namespace dz::formats
