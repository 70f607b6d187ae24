#pragma once
// Vector σ for the AVX-512 kernels. Include only from *_avx512.cpp files.
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

}  // namespace dz::kernels::detail
