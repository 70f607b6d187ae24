#pragma once
// E4M3 codes → their exact BF16 values, 64 at a time (docs/formats.md §6.4a), for the AVX-512
// kernels that multiply FP8 data on BF16 dot products (the FP8-block GEMV, MLA decode attention).
// Two 128-entry byte tables give the high and the low byte of |value| from the code's low 7 bits
// (VPERMI2B), the sign is ORed into the high byte and VPUNPCKL/HBW pair the bytes into words.
// Every E4M3 value, subnormals included, is a normal BF16, so the decode is exact. Include only
// from *_avx512.cpp files (compiled with AVX-512 BF16 and VBMI).
#include <immintrin.h>

#include <array>
#include <cstdint>

namespace dz::kernels::detail {

// BF16 bits of the E4M3 magnitude code c (0…127): normal codes (exponent field e ≥ 1) are
// 2^(e−7) · (1 + m/8), i.e. BF16 exponent e + 120 and mantissa m << 4; exponent-0 codes are
// m · 2^-9, normalised here (BF16's exponent range holds them as normal numbers); 0x7F is NaN.
constexpr uint16_t e4m3_magnitude_bf16(int c) {
  if (c == 0x7F) return 0x7FC0;
  const int e = c >> 3, m = c & 7;
  if (e != 0) return static_cast<uint16_t>((e + 120) << 7 | m << 4);
  if (m == 0) return 0;
  const int p = m >= 4 ? 2 : (m >= 2 ? 1 : 0);  // position of m's leading bit
  return static_cast<uint16_t>((127 - 9 + p) << 7 | (m - (1 << p)) << (7 - p));
}

struct E4m3ByteTables {
  alignas(64) std::array<uint8_t, 128> hi;
  alignas(64) std::array<uint8_t, 128> lo;
};

constexpr E4m3ByteTables make_e4m3_byte_tables() {
  E4m3ByteTables t{};
  for (int c = 0; c < 128; ++c) {
    t.hi[static_cast<size_t>(c)] = static_cast<uint8_t>(e4m3_magnitude_bf16(c) >> 8);
    t.lo[static_cast<size_t>(c)] = static_cast<uint8_t>(e4m3_magnitude_bf16(c) & 0xFF);
  }
  return t;
}

alignas(64) inline constexpr E4m3ByteTables kE4m3ByteTables = make_e4m3_byte_tables();

inline __m512bh as_bh(__m512i v) {
  return (__m512bh)v;  // same bits, BF16 lanes
}

struct E4m3Bf16Decoder {
  __m512i hi0, hi1, lo0, lo1, sign;
  E4m3Bf16Decoder()
      : hi0(_mm512_load_si512(kE4m3ByteTables.hi.data())),
        hi1(_mm512_load_si512(kE4m3ByteTables.hi.data() + 64)),
        lo0(_mm512_load_si512(kE4m3ByteTables.lo.data())),
        lo1(_mm512_load_si512(kE4m3ByteTables.lo.data() + 64)),
        sign(_mm512_set1_epi8(static_cast<char>(0x80))) {}
  // 64 codes → words: a holds codes 16L + k (k < 8) at word 8L + k of 128-bit lane L, b codes
  // 16L + 8 + k; whatever is multiplied with them is packed in the same order.
  inline void decode(__m512i codes, __m512i& a, __m512i& b) const {
    __m512i hi = _mm512_permutex2var_epi8(hi0, codes, hi1);  // index bit 7 ignored
    const __m512i lo = _mm512_permutex2var_epi8(lo0, codes, lo1);
    hi = _mm512_ternarylogic_epi32(hi, codes, sign, 0xF8);  // hi | (codes & 0x80)
    a = _mm512_unpacklo_epi8(lo, hi);
    b = _mm512_unpackhi_epi8(lo, hi);
  }
};

}  // namespace dz::kernels::detail
