// MX block quantization (docs/formats.md §2.4). Exact codecs: all checks are bit or value equality.
#include "dayzero/formats/mx_block.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"

namespace dz::formats {
namespace mx_block_test {

constexpr MxElem kElems[] = {MxElem::kE2M1, MxElem::kE4M3, MxElem::kE5M2};
constexpr MxScaleRule kRules[] = {
    MxScaleRule::kFloorLog2Amax, MxScaleRule::kCeilLog2AmaxOverMaxElem,
    MxScaleRule::kCeilLog2AmaxMinusEmax, MxScaleRule::kFloorLog2AmaxRoundedAt1p75};
int num_codes(MxElem elem) {
  return elem == MxElem::kE2M1 ? 16 : 256;
}

// The rules of §2.2 straight from their formulas, in FP64 with ilogb/ldexp (exact for FP32 inputs).
int formula_exponent(double amax, MxElem elem, MxScaleRule rule) {
  const int emax = mx_elem_emax(elem);
  const double max_elem = mx_elem_max(elem);
  int k = 0;
  if (amax == 0.0) return -127;
  const int floor_log2 = std::ilogb(amax);
  switch (rule) {
    case MxScaleRule::kFloorLog2Amax:
      k = floor_log2 - emax;
      break;
    case MxScaleRule::kCeilLog2AmaxOverMaxElem:  // smallest k with max_elem · 2^k >= amax
      k = floor_log2 - emax - 2;
      while (std::ldexp(max_elem, k) < amax) ++k;
      break;
    case MxScaleRule::kCeilLog2AmaxMinusEmax:  // smallest c with 2^c >= amax, minus emax
      k = floor_log2 + (std::ldexp(1.0, floor_log2) == amax ? 0 : 1) - emax;
      break;
    case MxScaleRule::kFloorLog2AmaxRoundedAt1p75: {
      const double significand = std::ldexp(amax, -floor_log2);  // in [1, 2)
      k = floor_log2 + (significand >= 1.75 ? 1 : 0) - emax;
      break;
    }
  }
  return std::max(k, -127);
}

// Amax values at and one ulp either side of every power of two and of every rule boundary
// (max_elem · 2^j for RCEIL: 6, 448 and 57344 are 1.5 · 2^2, 1.75 · 2^8 and 1.75 · 2^15; 1.75 · 2^j
// for EVEN), over the whole FP32 range.
std::vector<float> boundary_amaxes() {
  std::vector<float> points;
  for (int j = -149; j <= 127; ++j) {
    for (double mult : {1.0, 1.5, 1.75}) {
      const double v = std::ldexp(mult, j);
      if (v > 3.4028234663852886e38 || v < std::ldexp(1.0, -149)) continue;
      const auto f = static_cast<float>(v);
      if (static_cast<double>(f) != v) continue;
      for (float p : {std::nextafter(f, 0.0f), f, std::nextafter(f, INFINITY)})
        if (std::isfinite(p)) points.push_back(p);
    }
  }
  points.push_back(0.0f);
  return points;
}

TEST(MxBlock, SharedExponentMatchesEveryRuleFormulaAtBoundaries) {
  const std::vector<float> amaxes = boundary_amaxes();
  ASSERT_GT(amaxes.size(), 2000u);
  for (MxElem elem : kElems) {
    for (MxScaleRule rule : kRules) {
      for (float amax : amaxes) {
        ASSERT_EQ(mx_shared_exponent(amax, elem, rule),
                  formula_exponent(static_cast<double>(amax), elem, rule))
            << "elem " << static_cast<int>(elem) << " rule " << static_cast<int>(rule) << " amax "
            << std::hexfloat << amax;
      }
    }
  }
}

TEST(MxBlock, RceilEqualsTritonFp32RecipeWhereTheQuotientIsNormal) {
  // Triton ROUND_UP: r = fl32(amax / max_elem), add 0x007FFFFF to its bits, keep the exponent
  // field.
  for (MxElem elem : kElems) {
    for (float amax : boundary_amaxes()) {
      const float r = amax / mx_elem_max(elem);
      if (!std::isnormal(r)) continue;
      const int recipe = static_cast<int>((std::bit_cast<uint32_t>(r) + 0x007FFFFFu) >> 23) - 127;
      ASSERT_EQ(mx_shared_exponent(amax, elem, MxScaleRule::kCeilLog2AmaxOverMaxElem), recipe)
          << std::hexfloat << amax;
    }
  }
}

TEST(MxBlock, NamedRuleExamples) {
  // E2M1, amax 5: FLOOR and EVEN k = 0; RCEIL k = 0 (5/6 <= 1); CEIL-emax k = 1 (wastes a binade).
  EXPECT_EQ(mx_shared_exponent(5.0f, MxElem::kE2M1, MxScaleRule::kFloorLog2Amax), 0);
  EXPECT_EQ(mx_shared_exponent(5.0f, MxElem::kE2M1, MxScaleRule::kCeilLog2AmaxOverMaxElem), 0);
  EXPECT_EQ(mx_shared_exponent(5.0f, MxElem::kE2M1, MxScaleRule::kCeilLog2AmaxMinusEmax), 1);
  EXPECT_EQ(mx_shared_exponent(5.0f, MxElem::kE2M1, MxScaleRule::kFloorLog2AmaxRoundedAt1p75), 0);
  // amax 7 (significand 1.75): EVEN rounds p up to 8, FLOOR keeps k = 0 and clips 7 to 6.
  EXPECT_EQ(mx_shared_exponent(7.0f, MxElem::kE2M1, MxScaleRule::kFloorLog2AmaxRoundedAt1p75), 1);
  EXPECT_EQ(mx_shared_exponent(6.5f, MxElem::kE2M1, MxScaleRule::kFloorLog2AmaxRoundedAt1p75), 0);
  EXPECT_EQ(mx_shared_exponent(7.0f, MxElem::kE2M1, MxScaleRule::kFloorLog2Amax), 0);
  std::vector<float> block(32, 0.5f);
  block[3] = 7.0f;
  std::vector<uint8_t> codes(32), scales(1);
  quantize_mx(block, MxElem::kE2M1, MxScaleRule::kFloorLog2Amax, codes, scales);
  EXPECT_EQ(scales[0], 127);
  EXPECT_EQ(codes[3], 0x7);  // 7 saturates to 6
  // E4M3: amax 500 under FLOOR is k = 0 and clips to 448; RCEIL gives k = 1.
  EXPECT_EQ(mx_shared_exponent(500.0f, MxElem::kE4M3, MxScaleRule::kFloorLog2Amax), 0);
  EXPECT_EQ(mx_shared_exponent(500.0f, MxElem::kE4M3, MxScaleRule::kCeilLog2AmaxOverMaxElem), 1);
  EXPECT_EQ(mx_shared_exponent(448.0f, MxElem::kE4M3, MxScaleRule::kCeilLog2AmaxOverMaxElem), 0);
  // All-zero blocks get code 0 and zero elements; tiny amax clamps at −127.
  std::fill(block.begin(), block.end(), 0.0f);
  for (MxScaleRule rule : kRules) {
    quantize_mx(block, MxElem::kE4M3, rule, codes, scales);
    EXPECT_EQ(scales[0], 0);
    EXPECT_TRUE(std::all_of(codes.begin(), codes.end(), [](uint8_t c) { return c == 0; }));
    EXPECT_EQ(mx_shared_exponent(0x1p-149f, MxElem::kE2M1, rule), -127);
  }
}

TEST(MxBlock, EveryScaleTimesEveryElementDecodesExactly) {
  for (MxElem elem : kElems) {
    for (int scale = 0; scale < 255; ++scale) {
      for (int code = 0; code < num_codes(elem); ++code) {
        const float element = decode_mx_elem(static_cast<uint8_t>(code), elem);
        if (!std::isfinite(element)) continue;
        std::vector<uint8_t> codes(32, static_cast<uint8_t>(code));
        std::vector<uint8_t> scales{static_cast<uint8_t>(scale)};
        std::vector<float> out(32);
        dequantize_mx(codes, scales, elem, out);
        // The exact product in FP64, rounded once (only overflow to Inf can round).
        const auto expected =
            static_cast<float>(static_cast<double>(element) * std::ldexp(1.0, scale - 127));
        ASSERT_EQ(std::bit_cast<uint32_t>(out[31]), std::bit_cast<uint32_t>(expected))
            << scale << " " << code;
      }
    }
  }
}

TEST(MxBlock, RandomBlocksRoundEachElementToTheNearestCode) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> magnitude(-40, 40);
  constexpr int kNumBlocks = 24;
  std::vector<float> x(kNumBlocks * kMxBlockElems);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(normal(rng), magnitude(rng) / 8 + static_cast<int>(i / 32) - 12);
  for (MxElem elem : kElems) {
    for (MxScaleRule rule : kRules) {
      std::vector<uint8_t> codes(x.size()), scales(kNumBlocks);
      quantize_mx(x, elem, rule, codes, scales);
      for (int b = 0; b < kNumBlocks; ++b) {
        float amax = 0.0f;
        for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
        const int k = formula_exponent(amax, elem, rule);
        ASSERT_EQ(scales[b], k + 127);
        for (int i = 0; i < 32; ++i) {
          // y = x / 2^k must land on the nearest representable element (saturating at max_elem).
          const double y = std::clamp(std::ldexp(static_cast<double>(x[b * 32 + i]), -k),
                                      -static_cast<double>(mx_elem_max(elem)),
                                      static_cast<double>(mx_elem_max(elem)));
          const uint8_t code = codes[b * 32 + i];
          const double error = std::fabs(y - decode_mx_elem(code, elem));
          for (int other = 0; other < num_codes(elem); ++other) {
            const float v = decode_mx_elem(static_cast<uint8_t>(other), elem);
            if (std::isfinite(v)) {
              ASSERT_LE(error, std::fabs(y - v)) << b << " " << i;
            }
          }
        }
      }
    }
  }
}

TEST(MxBlock, NanOrInfMakesTheWholeBlockNan) {
  std::vector<float> x(64, 1.0f);
  x[5] = NAN;
  x[40] = -INFINITY;
  std::vector<uint8_t> codes(64), scales(2);
  std::vector<float> out(64);
  for (MxElem elem : kElems) {
    quantize_mx(std::span<const float>(x).first(32), elem, MxScaleRule::kCeilLog2AmaxOverMaxElem,
                std::span(codes).first(32), std::span(scales).first(1));
    quantize_mx(std::span<const float>(x).last(32), elem, MxScaleRule::kCeilLog2AmaxOverMaxElem,
                std::span(codes).last(32), std::span(scales).last(1));
    EXPECT_EQ(scales[0], 0xFF);
    EXPECT_EQ(scales[1], 0xFF);
    dequantize_mx(codes, scales, elem, out);
    EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); }));
  }
}

TEST(MxBlock, PackFp4PutsEvenElementsInTheLowNibble) {
  const std::vector<uint8_t> codes = {0x1, 0xA, 0xF, 0x0, 0x7, 0x8};
  std::vector<uint8_t> packed(3);
  pack_fp4(codes, packed);
  EXPECT_EQ(packed, (std::vector<uint8_t>{0xA1, 0x0F, 0x87}));
}

}  // namespace mx_block_test
}  // namespace dz::formats
