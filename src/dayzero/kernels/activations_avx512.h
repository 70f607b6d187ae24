#pragma once
// Vector σ and BF16 rounding for the AVX-512 kernels. Include only from *_avx512.cpp files.
#include <immintrin.h>

#include "dayzero/kernels/exp_avx512.h"

namespace dz::kernels::detail {

// σ(x) = 1 / (1 + e^−x) for x ≥ 0 and e^x / (1 + e^x) below, from t = e^−|x| (exp_ps wants x ≤ 0),
// so neither side overflows.
inline __m512 sigmoid_ps(__m512 x) {
  const __m512 t = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(x)));
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 numerator =
      _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), one, t);
  return _mm512_div_ps(numerator, _mm512_add_ps(one, t));
}

// formats::round_to_bf16 of 16 values (RNE, overflow to ±Inf); a NaN stays a NaN.
inline __m512 round_bf16_ps(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_and_si512(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))),
                       _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(rounded), nan, x);
}

}  // namespace dz::kernels::detail
