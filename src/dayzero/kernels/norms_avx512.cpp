// AVX-512 body of norms.h: sums of squares in 4 × 16 lanes.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "dayzero/kernels/norms.h"

namespace dz::kernels::detail {

float sum_squares_avx512(const float* x, int64_t n) {
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                   _mm512_setzero_ps()};
  int64_t i = 0;
  for (; i + 64 <= n; i += 64)
    for (int a = 0; a < 4; ++a) {
      const __m512 v = _mm512_loadu_ps(x + i + 16 * a);
      acc[a] = _mm512_fmadd_ps(v, v, acc[a]);
    }
  for (int a = 0; i < n; i += 16, a = (a + 1) % 4) {
    const auto m = static_cast<__mmask16>(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    acc[a] = _mm512_fmadd_ps(v, v, acc[a]);
  }
  return _mm512_reduce_add_ps(
      _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
}

}  // namespace dz::kernels::detail
