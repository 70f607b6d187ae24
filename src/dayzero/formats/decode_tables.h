#pragma once
// FP32 decode tables for the 8-bit and 4-bit formats, generated at compile time from the value
// formulas of docs/formats.md §1.2 (m · 2^-9, (8+m) · 2^(e−10), ...), not from bit tricks. They are
// the reference decoders (§6.8); codecs.h has the integer-only form, and a test checks that both
// agree on every code.
//
// NaN codes decode to the quiet NaN 0x7FC00000 carrying the code's sign bit (0xFFC00000 for
// negative).

#include <array>
#include <cstdint>
#include <limits>

namespace dz::formats {

namespace detail {

// 2^k, exact in double for the range used here (k in [-149, 128]).
constexpr double exact_pow2(int k) {
  double value = 1.0;
  for (; k > 0; --k) value *= 2.0;
  for (; k < 0; ++k) value *= 0.5;
  return value;
}

constexpr float with_sign(bool negative, double magnitude) {
  const float value = static_cast<float>(magnitude);
  return negative ? -value : value;
}

constexpr float kQuietNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// s.eeee.mmm, bias 7, no Inf, NaN only at S.1111.111.
constexpr std::array<float, 256> make_e4m3_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const bool negative = (code & 0x80) != 0;
    const int e = (code >> 3) & 0xF;
    const int m = code & 0x7;
    double magnitude = e == 0 ? m * exact_pow2(-9) : (8 + m) * exact_pow2(e - 10);
    table[code] =
        (e == 15 && m == 7) ? (negative ? -kQuietNan : kQuietNan) : with_sign(negative, magnitude);
  }
  return table;
}

// s.eeeee.mm, bias 15, IEEE specials at e = 31.
constexpr std::array<float, 256> make_e5m2_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 256; ++code) {
    const bool negative = (code & 0x80) != 0;
    const int e = (code >> 2) & 0x1F;
    const int m = code & 0x3;
    if (e == 31) {
      const float special = m == 0 ? kInf : kQuietNan;
      table[code] = negative ? -special : special;
      continue;
    }
    table[code] = with_sign(negative, e == 0 ? m * exact_pow2(-16) : (4 + m) * exact_pow2(e - 17));
  }
  return table;
}

// Unsigned exponent: 2^(k−127), code 0 = 2^-127 (an FP32 subnormal), 0xFF = NaN.
constexpr std::array<float, 256> make_e8m0_table() {
  std::array<float, 256> table{};
  for (int code = 0; code < 255; ++code) table[code] = static_cast<float>(exact_pow2(code - 127));
  table[255] = kQuietNan;
  return table;
}

// s.ee.m, bias 1, no specials: {0, 0.5, 1, 1.5, 2, 3, 4, 6} and negatives (code 8 is −0).
constexpr std::array<float, 16> make_e2m1_table() {
  std::array<float, 16> table{};
  for (int code = 0; code < 16; ++code) {
    const int e = (code >> 1) & 0x3;
    const int m = code & 0x1;
    table[code] = with_sign((code & 0x8) != 0, e == 0 ? m * 0.5 : (2 + m) * exact_pow2(e - 2));
  }
  return table;
}

}  // namespace detail

inline constexpr std::array<float, 256> kE4m3Values = detail::make_e4m3_table();
inline constexpr std::array<float, 256> kE5m2Values = detail::make_e5m2_table();
inline constexpr std::array<float, 256> kE8m0Values = detail::make_e8m0_table();
inline constexpr std::array<float, 16> kE2m1Values = detail::make_e2m1_table();

inline float decode_e4m3(uint8_t code) {
  return kE4m3Values[code];
}
inline float decode_e5m2(uint8_t code) {
  return kE5m2Values[code];
}
inline float decode_e8m0(uint8_t code) {
  return kE8m0Values[code];
}
// Only the low four bits are read, so a packed byte can be passed after masking or shifting.
inline float decode_e2m1(uint8_t code) {
  return kE2m1Values[code & 0xF];
}

}  // namespace dz::formats
