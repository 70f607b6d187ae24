// Exhaustive tests of the scalar codecs (docs/formats.md §1.5). Everything here is exact:
// comparisons are bit equality, never a tolerance. The encoder oracle is a brute-force search for
// the nearest grid value (ties to the even code) over all finite codes, independent of the
// bit-level encoders.
#include "dayzero/formats/codecs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace dz::formats {
namespace codecs_test {

uint32_t bits(float x) {
  return std::bit_cast<uint32_t>(x);
}
float from_bits(uint32_t b) {
  return std::bit_cast<float>(b);
}
double pow2(int k) {
  return std::ldexp(1.0, k);
}

// Positive finite grid of a format: values ascending (0 first) with their codes.
struct Grid {
  std::vector<double> values;
  std::vector<uint32_t> codes;
  int sign_shift;  // position of the sign bit in the code
};

Grid make_grid(int num_codes, int sign_shift, const std::function<double(uint32_t)>& value_of,
               const std::function<bool(uint32_t)>& is_finite) {
  Grid grid{.values = {}, .codes = {}, .sign_shift = sign_shift};
  for (uint32_t code = 0; code < static_cast<uint32_t>(num_codes) >> 1; ++code) {
    if (!is_finite(code)) continue;
    grid.values.push_back(value_of(code));
    grid.codes.push_back(code);
  }
  EXPECT_TRUE(std::is_sorted(grid.values.begin(), grid.values.end()));
  return grid;
}

// Formula values of §1.2, computed with ldexp (not the constexpr tables).
double small_float_value(uint32_t code, int mant_bits, int bias) {
  const uint32_t e = code >> mant_bits;
  const uint32_t m = code & ((1u << mant_bits) - 1);
  return e == 0 ? std::ldexp(m, 1 - bias - mant_bits)
                : std::ldexp((1u << mant_bits) + m, static_cast<int>(e) - bias - mant_bits);
}

const Grid& e4m3_grid() {
  static const Grid grid = make_grid(
      256, 7, [](uint32_t c) { return small_float_value(c, 3, 7); },
      [](uint32_t c) { return c != 0x7F; });
  return grid;
}
const Grid& e5m2_grid() {
  static const Grid grid = make_grid(
      256, 7, [](uint32_t c) { return small_float_value(c, 2, 15); },
      [](uint32_t c) { return c < 0x7C; });
  return grid;
}
const Grid& e2m1_grid() {
  static const Grid grid = make_grid(
      16, 3, [](uint32_t c) { return small_float_value(c, 1, 1); }, [](uint32_t) { return true; });
  return grid;
}
const Grid& fp16_grid() {
  static const Grid grid = make_grid(
      65536, 15, [](uint32_t c) { return small_float_value(c, 10, 15); },
      [](uint32_t c) { return c < 0x7C00; });
  return grid;
}
const Grid& bf16_grid() {
  static const Grid grid = make_grid(
      65536, 15, [](uint32_t c) { return small_float_value(c, 7, 127); },
      [](uint32_t c) { return c < 0x7F80; });
  return grid;
}

// Nearest grid code to |x| (finite, <= the grid max), ties to the even code.
uint32_t nearest_code(const Grid& grid, double ax) {
  const auto hi_it = std::lower_bound(grid.values.begin(), grid.values.end(), ax);
  const auto hi = static_cast<size_t>(hi_it - grid.values.begin());
  if (hi == grid.values.size()) return grid.codes.back();
  if (grid.values[hi] == ax || hi == 0) return grid.codes[hi];
  const double d_lo = ax - grid.values[hi - 1];
  const double d_hi = grid.values[hi] - ax;
  if (d_lo != d_hi) return d_lo < d_hi ? grid.codes[hi - 1] : grid.codes[hi];
  return (grid.codes[hi - 1] & 1) == 0 ? grid.codes[hi - 1] : grid.codes[hi];
}

// The oracle: `above` is the code for |x| >= `threshold` (saturation or overflow), `nan` for NaN.
uint32_t reference_encode(const Grid& grid, float x, double threshold, uint32_t above, uint32_t nan,
                          bool nan_keeps_sign = true) {
  const uint32_t sign = (bits(x) >> 31) << grid.sign_shift;
  if (std::isnan(x)) return nan | (nan_keeps_sign ? sign : 0);
  const double ax = std::fabs(static_cast<double>(x));
  if (ax >= threshold) return above | sign;
  return nearest_code(grid, ax) | sign;
}

// Every encoder with its oracle, for sweeps.
struct EncoderCase {
  const char* name;
  std::function<uint32_t(float)> encode;
  std::function<uint32_t(float)> reference;
};

std::vector<EncoderCase> all_encoders() {
  return {
      {"bf16", [](float x) { return encode_bf16(x); },
       [](float x) {
         return reference_encode(bf16_grid(), x, std::ldexp(1.0 + 255.0 / 256.0, 127), 0x7F80,
                                 0x7FC0, false);
       }},
      {"fp16", [](float x) { return encode_fp16(x); },
       [](float x) { return reference_encode(fp16_grid(), x, 65520.0, 0x7C00, 0x7E00); }},
      {"e4m3_sat", [](float x) { return encode_e4m3(x, Fp8Overflow::kSaturate); },
       [](float x) { return reference_encode(e4m3_grid(), x, 448.0, 0x7E, 0x7F); }},
      {"e4m3_sat_inline", [](float x) { return encode_e4m3_saturating(x); },
       [](float x) { return reference_encode(e4m3_grid(), x, 448.0, 0x7E, 0x7F); }},
      {"e4m3_nonsat", [](float x) { return encode_e4m3(x, Fp8Overflow::kNonSaturating); },
       [](float x) {
         // > 464 is NaN; 464 itself is the tie that RNE sends to 448.
         return reference_encode(e4m3_grid(), x, std::nextafter(464.0, 1e9), 0x7F, 0x7F);
       }},
      {"e5m2_sat", [](float x) { return encode_e5m2(x, Fp8Overflow::kSaturate); },
       [](float x) { return reference_encode(e5m2_grid(), x, 57344.0, 0x7B, 0x7F); }},
      {"e5m2_ieee", [](float x) { return encode_e5m2(x, Fp8Overflow::kNonSaturating); },
       [](float x) { return reference_encode(e5m2_grid(), x, 61440.0, 0x7C, 0x7F); }},
      {"e2m1", [](float x) { return encode_e2m1(x); },
       [](float x) { return reference_encode(e2m1_grid(), x, 6.0, 0x7, 0x7); }},
  };
}

TEST(Codecs, TableAndIntegerDecodersAgreeWithFormulasOnEveryCode) {
  for (uint32_t code = 0; code < 256; ++code) {
    const auto c = static_cast<uint8_t>(code);
    const bool negative = (code & 0x80) != 0;
    SCOPED_TRACE(code);
    // Tables and integer forms agree bit for bit, NaN included (sign kept, quiet 0x7FC00000).
    EXPECT_EQ(bits(decode_e4m3(c)), bits(decode_e4m3_int(c)));
    EXPECT_EQ(bits(decode_e5m2(c)), bits(decode_e5m2_int(c)));
    EXPECT_EQ(bits(decode_e8m0(c)), bits(decode_e8m0_int(c)));
    // Against the ldexp formulas of §1.2.
    if ((code & 0x7F) == 0x7F) {
      EXPECT_EQ(bits(decode_e4m3(c)), negative ? 0xFFC00000u : 0x7FC00000u);
    } else {
      const double v = small_float_value(code & 0x7F, 3, 7);
      EXPECT_EQ(decode_e4m3(c), static_cast<float>(negative ? -v : v));
      EXPECT_EQ(std::signbit(decode_e4m3(c)), negative);
    }
    const uint32_t e5 = (code >> 2) & 0x1F;
    if (e5 == 31) {
      EXPECT_EQ(bits(decode_e5m2(c)),
                (negative ? 0x80000000u : 0u) | ((code & 3) ? 0x7FC00000u : 0x7F800000u));
    } else {
      const double v = small_float_value(code & 0x7F, 2, 15);
      EXPECT_EQ(decode_e5m2(c), static_cast<float>(negative ? -v : v));
      EXPECT_EQ(std::signbit(decode_e5m2(c)), negative);
    }
    if (code == 0xFF) {
      EXPECT_TRUE(std::isnan(decode_e8m0(c)));
    } else {
      EXPECT_EQ(static_cast<double>(decode_e8m0(c)), pow2(static_cast<int>(code) - 127));
    }
  }
  for (uint32_t code = 0; code < 16; ++code) {
    const auto c = static_cast<uint8_t>(code);
    EXPECT_EQ(bits(decode_e2m1(c)), bits(decode_e2m1_int(c)));
    const double v = small_float_value(code & 7, 1, 1);
    EXPECT_EQ(decode_e2m1(c), static_cast<float>(code & 8 ? -v : v));
    EXPECT_EQ(std::signbit(decode_e2m1(c)), (code & 8) != 0);
  }
  for (uint32_t code = 0; code < 65536; ++code) {
    const auto c = static_cast<uint16_t>(code);
    const bool negative = (code & 0x8000) != 0;
    EXPECT_EQ(bits(decode_bf16(c)), code << 16);
    if (((code >> 10) & 0x1F) == 31) {
      EXPECT_EQ(bits(decode_fp16(c)),
                (negative ? 0x80000000u : 0u) | ((code & 0x3FF) ? 0x7FC00000u : 0x7F800000u));
      continue;
    }
    const double v = small_float_value(code & 0x7FFF, 10, 15);
    ASSERT_EQ(bits(decode_fp16(c)), bits(static_cast<float>(negative ? -v : v))) << code;
  }
}

TEST(Codecs, DecodeMatchesTheValueTablesOfTheSpec) {
  // §1.3 landmarks.
  EXPECT_EQ(decode_e4m3(0x01), 0x1p-9f);
  EXPECT_EQ(decode_e4m3(0x08), 0x1p-6f);
  EXPECT_EQ(decode_e4m3(0x10), 0.03125f);
  EXPECT_EQ(decode_e4m3(0x17), 0.05859375f);
  EXPECT_EQ(decode_e4m3(0x3F), 1.875f);
  EXPECT_EQ(decode_e4m3(0x78), 256.0f);
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(bits(decode_e4m3(0x80)), 0x80000000u);  // −0
  EXPECT_EQ(decode_e5m2(0x01), 0x1p-16f);
  EXPECT_EQ(decode_e5m2(0x03), 0x3p-16f);
  EXPECT_EQ(decode_e5m2(0x04), 0x1p-14f);
  EXPECT_EQ(decode_e5m2(0x3C), 1.0f);
  EXPECT_EQ(decode_e5m2(0x7B), 57344.0f);
  EXPECT_EQ(decode_e5m2(0x7C), INFINITY);
  EXPECT_EQ(bits(decode_e8m0(0)), 0x00400000u);
  EXPECT_EQ(decode_e8m0(127), 1.0f);
  EXPECT_EQ(decode_e8m0(254), 0x1p127f);
  const float e2m1_values[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  const uint16_t e2m1_fp16[8] = {0x0000, 0x3800, 0x3C00, 0x3E00, 0x4000, 0x4200, 0x4400, 0x4600};
  const uint16_t e2m1_bf16[8] = {0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0};
  for (uint8_t c = 0; c < 8; ++c) {
    EXPECT_EQ(decode_e2m1(c), e2m1_values[c]);
    EXPECT_EQ(decode_e2m1(c + 8), -e2m1_values[c]);
    EXPECT_EQ(encode_fp16(decode_e2m1(c)), e2m1_fp16[c]);
    EXPECT_EQ(encode_bf16(decode_e2m1(c)), e2m1_bf16[c]);
    EXPECT_EQ(encode_bf16(decode_e2m1(c + 8)), e2m1_bf16[c] | 0x8000);
  }
  // Finite-code counts: E4M3 254, E5M2 248 (both including ±0).
  int num_e4m3 = 0, num_e5m2 = 0;
  for (int c = 0; c < 256; ++c) {
    num_e4m3 += std::isfinite(decode_e4m3(static_cast<uint8_t>(c)));
    num_e5m2 += std::isfinite(decode_e5m2(static_cast<uint8_t>(c)));
  }
  EXPECT_EQ(num_e4m3, 254);
  EXPECT_EQ(num_e5m2, 248);
}

TEST(Codecs, EncodeOfDecodeIsIdentityOnEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    const auto code = static_cast<uint8_t>(c);
    if (std::isfinite(decode_e4m3(code))) {
      EXPECT_EQ(encode_e4m3(decode_e4m3(code), Fp8Overflow::kSaturate), code);
      EXPECT_EQ(encode_e4m3(decode_e4m3(code), Fp8Overflow::kNonSaturating), code);
    }
    if (std::isfinite(decode_e5m2(code))) {
      EXPECT_EQ(encode_e5m2(decode_e5m2(code), Fp8Overflow::kSaturate), code);
      EXPECT_EQ(encode_e5m2(decode_e5m2(code), Fp8Overflow::kNonSaturating), code);
    }
    if (c < 255) {
      EXPECT_EQ(encode_e8m0(c - 127), code);
    }
  }
  for (uint8_t c = 0; c < 16; ++c) EXPECT_EQ(encode_e2m1(decode_e2m1(c)), c);
  for (uint32_t c = 0; c < 65536; ++c) {
    const auto code = static_cast<uint16_t>(c);
    if (std::isfinite(decode_fp16(code))) {
      ASSERT_EQ(encode_fp16(decode_fp16(code)), code);
    }
    if (!std::isnan(decode_bf16(code))) {
      ASSERT_EQ(encode_bf16(decode_bf16(code)), code);
    }
  }
  // E5M2 ±Inf survive the IEEE encoder.
  EXPECT_EQ(encode_e5m2(INFINITY, Fp8Overflow::kNonSaturating), 0x7C);
  EXPECT_EQ(encode_e5m2(-INFINITY, Fp8Overflow::kNonSaturating), 0xFC);
}

TEST(Codecs, EveryEncoderMatchesTheOracleOnAllBf16Inputs) {
  for (const EncoderCase& encoder : all_encoders()) {
    SCOPED_TRACE(encoder.name);
    for (uint32_t code = 0; code < 65536; ++code) {
      const float x = from_bits(code << 16);
      ASSERT_EQ(encoder.encode(x), encoder.reference(x)) << "bf16 input 0x" << std::hex << code;
    }
  }
}

TEST(Codecs, EveryEncoderMatchesTheOracleOnRandomFp32Inputs) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any_bits;
  // Half the draws are fully random bit patterns, half lie in the range where the formats live
  // (|x| in [2^-30, 2^17)), where the rounding work is.
  std::uniform_real_distribution<double> exponent(-30.0, 17.0);
  for (const EncoderCase& encoder : all_encoders()) {
    SCOPED_TRACE(encoder.name);
    for (int i = 0; i < 20000; ++i) {
      float x = from_bits(any_bits(rng));
      if (i % 2)
        x = static_cast<float>(std::exp2(exponent(rng))) * (any_bits(rng) & 1 ? -1.f : 1.f);
      ASSERT_EQ(encoder.encode(x), encoder.reference(x)) << "input bits 0x" << std::hex << bits(x);
    }
  }
}

TEST(Codecs, NamedTiesAndBoundaries) {
  const auto sat = Fp8Overflow::kSaturate;
  const auto nonsat = Fp8Overflow::kNonSaturating;
  // E4M3 top: 464 ties between 448 and the missing 480; RNE picks 448 (even mantissa).
  EXPECT_EQ(encode_e4m3(448.0f, nonsat), 0x7E);
  EXPECT_EQ(encode_e4m3(464.0f, nonsat), 0x7E);
  EXPECT_EQ(encode_e4m3(std::nextafter(464.0f, 1e9f), nonsat), 0x7F);
  EXPECT_EQ(encode_e4m3(-std::nextafter(464.0f, 1e9f), nonsat), 0xFF);
  EXPECT_EQ(encode_e4m3(std::nextafter(464.0f, 1e9f), sat), 0x7E);
  EXPECT_EQ(encode_e4m3(1e30f, sat), 0x7E);
  EXPECT_EQ(encode_e4m3(INFINITY, sat), 0x7E);
  EXPECT_EQ(encode_e4m3(-INFINITY, sat), 0xFE);
  EXPECT_EQ(encode_e4m3(INFINITY, nonsat), 0x7F);
  EXPECT_EQ(encode_e4m3(NAN, sat), 0x7F);
  EXPECT_EQ(encode_e4m3(-NAN, sat), 0xFF);
  // E4M3 bottom: 2^-10 is half the smallest subnormal: ties to 0; one ulp above rounds up.
  EXPECT_EQ(encode_e4m3(0x1p-10f), 0x00);
  EXPECT_EQ(encode_e4m3(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(encode_e4m3(0x3p-10f), 0x02);   // 1.5 · 2^-9: tie between codes 1 and 2, even wins
  EXPECT_EQ(encode_e4m3(-0x1p-11f), 0x80);  // rounds to zero, keeps the sign
  EXPECT_EQ(encode_e4m3(0xFp-10f), 0x08);   // 7.5 · 2^-9 ties into the smallest normal
  EXPECT_EQ(encode_e4m3(1.0625f), 0x38);    // 1 + 1/16 ties to 1.0
  EXPECT_EQ(encode_e4m3(1.1875f), 0x3A);    // 1.125 + 1/16 ties to 1.25
  EXPECT_EQ(encode_e4m3(15.5f), 0x58);  // ties between 15 (0x57) and 16 (0x58, carry): even wins
  EXPECT_EQ(encode_e4m3(15.5f), encode_e4m3(16.0f));
  // E5M2 top: 61440 is the tie between 57344 and the next binade (Inf under IEEE).
  EXPECT_EQ(encode_e5m2(std::nextafter(61440.0f, 0.0f), nonsat), 0x7B);
  EXPECT_EQ(encode_e5m2(61440.0f, nonsat), 0x7C);
  EXPECT_EQ(encode_e5m2(-61440.0f, nonsat), 0xFC);
  EXPECT_EQ(encode_e5m2(61440.0f, sat), 0x7B);
  EXPECT_EQ(encode_e5m2(INFINITY, sat), 0x7B);
  EXPECT_EQ(encode_e5m2(NAN, sat), 0x7F);
  EXPECT_EQ(encode_e5m2(0x1p-17f), 0x00);
  EXPECT_EQ(encode_e5m2(std::nextafter(0x1p-17f, 1.0f)), 0x01);
  // Encoding E5M2 directly differs from FP32 → FP16 → E5M2 near ties: 1 + 2^-3 + 2^-12 rounds to
  // 1.25 directly, but FP16 first rounds it to 1.125 exactly, a tie that goes to 1.0.
  const float near_tie = 1.0f + 0x1p-3f + 0x1p-12f;
  EXPECT_EQ(encode_e5m2(near_tie), 0x3D);
  EXPECT_EQ(encode_e5m2(decode_fp16(encode_fp16(near_tie))), 0x3C);
  // FP16: 65520 is the tie to Inf.
  EXPECT_EQ(encode_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(encode_fp16(std::nextafter(65520.0f, 0.0f)), 0x7BFF);
  EXPECT_EQ(encode_fp16(65520.0f), 0x7C00);
  EXPECT_EQ(encode_fp16(0x1p-25f), 0x0000);
  EXPECT_EQ(encode_fp16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  // E2M1 tie row of §1.4, RNE: 0.25→0, 0.75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4, >6→6.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 7.0f};
  const float rne[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f, 6.0f};
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(decode_e2m1(encode_e2m1(ties[i])), rne[i]) << ties[i];
    EXPECT_EQ(decode_e2m1(encode_e2m1(-ties[i])), -rne[i]) << ties[i];
  }
  EXPECT_EQ(encode_e2m1(-0.25f), 0x8);  // −0
  EXPECT_EQ(encode_e2m1(INFINITY), 0x7);
  EXPECT_EQ(encode_e2m1(-INFINITY), 0xF);
  EXPECT_EQ(encode_e2m1(std::nextafter(0.25f, 1.0f)), 0x1);
  // E8M0 from an exponent: clamps below, code 0 is 2^-127.
  EXPECT_EQ(encode_e8m0(-127), 0);
  EXPECT_EQ(encode_e8m0(-200), 0);
  EXPECT_EQ(encode_e8m0(0), 127);
  EXPECT_EQ(encode_e8m0(127), 254);
  // BF16: NaN is canonical, overflow goes to Inf, 0x7F7F + half ulp ties to Inf (0x7F7F is odd).
  EXPECT_EQ(encode_bf16(NAN), 0x7FC0);
  EXPECT_EQ(encode_bf16(-NAN), 0x7FC0);
  EXPECT_EQ(encode_bf16(from_bits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(encode_bf16(from_bits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(encode_bf16(from_bits(0xFF7FFFFFu)), 0xFF80);
  EXPECT_EQ(encode_bf16(1.0f + 0x1p-8f), 0x3F80);  // tie, even
  EXPECT_EQ(encode_bf16(1.0f + 0x3p-8f), 0x3F82);  // tie, odd rounds up
}

TEST(Codecs, Bf16KeepsFp32SubnormalsThatVcvtneps2bf16Flushes) {
  // 2^k for k = −149 … −126: below 2^-133 (the smallest BF16 subnormal) they round to zero, 2^-134
  // being the tie that goes to even 0; from 2^-133 on they are exact BF16 subnormals, 2^-126
  // normal.
  for (int k = -149; k <= -126; ++k) {
    const float x = std::ldexp(1.0f, k);
    const auto expected = static_cast<uint16_t>(k < -133 ? 0u : 1u << (k + 133));
    EXPECT_EQ(encode_bf16(x), expected) << k;
    EXPECT_EQ(encode_bf16(-x), expected | 0x8000) << k;
  }
  EXPECT_EQ(encode_bf16(0x3p-135f), 0x0001);  // 0.75 · 2^-133 rounds up to the smallest subnormal
  EXPECT_EQ(encode_bf16(from_bits(0x007FFFFFu)), 0x0080);  // largest FP32 subnormal → 2^-126
}

TEST(CodecsDeathTest, E8m0RefusesExponentsAbove127) {
  EXPECT_DEATH(encode_e8m0(128), "E8M0 exponent 128 exceeds 127");
}

}  // namespace codecs_test
}  // namespace dz::formats
