// Had_128 on 8 zmm: stages h = 1, 2, 4, 8 inside each register (lane l pairs with lane l ^ h: the
// lower lane keeps a + b, the upper one a − b, the very operations of hadamard_ref), stages h = 16,
// 32, 64 between registers; then the one multiply by fl32(1/sqrt(128)).
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cmath>

#include "dayzero/kernels/hadamard.h"

namespace dz::kernels::detail {

void hadamard128_avx512(std::span<float> x) {
  const auto inv_sqrt_n = _mm512_set1_ps(static_cast<float>(1.0 / std::sqrt(128.0)));
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i partner[4];
  __mmask16 upper[4];
  for (int s = 0; s < 4; ++s) {
    const __m512i h = _mm512_set1_epi32(1 << s);
    partner[s] = _mm512_xor_si512(lanes, h);
    upper[s] = _mm512_test_epi32_mask(lanes, h);
  }
  for (size_t row = 0; row < x.size(); row += 128) {
    float* r = x.data() + row;
    __m512 v[8];
    for (int i = 0; i < 8; ++i) v[i] = _mm512_loadu_ps(r + 16 * i);
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i < 8; ++i) {
        const __m512 p = _mm512_permutexvar_ps(partner[s], v[i]);
        // Lower lane: v + p = a + b; upper lane: p − v = a − b.
        v[i] = _mm512_mask_blend_ps(upper[s], _mm512_add_ps(v[i], p), _mm512_sub_ps(p, v[i]));
      }
    for (int h = 1; h < 8; h *= 2)
      for (int i = 0; i < 8; ++i)
        if ((i & h) == 0) {
          const __m512 a = v[i], b = v[i + h];
          v[i] = _mm512_add_ps(a, b);
          v[i + h] = _mm512_sub_ps(a, b);
        }
    for (int i = 0; i < 8; ++i) _mm512_storeu_ps(r + 16 * i, _mm512_mul_ps(v[i], inv_sqrt_n));
  }
}

}  // namespace dz::kernels::detail
