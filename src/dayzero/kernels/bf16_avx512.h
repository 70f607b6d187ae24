#pragma once
// BF16 encode and decode of 16 values in a register, for the AVX-512 kernels. Include only from
// *_avx512.cpp files.
#include <immintrin.h>

namespace dz::kernels::detail {

// formats::encode_bf16 of 16 values (round to nearest even, overflow to ±Inf, subnormals kept —
// VCVTNEPS2BF16 would flush them —, NaN → 0x7FC0).
inline __m256i encode_bf16_16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7FC0)));
}

inline __m512 decode_bf16_16(__m256i bf16) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bf16), 16));
}

// formats::round_to_bf16 of 16 values.
inline __m512 round_bf16_16(__m512 x) {
  return decode_bf16_16(encode_bf16_16(x));
}

}  // namespace dz::kernels::detail
