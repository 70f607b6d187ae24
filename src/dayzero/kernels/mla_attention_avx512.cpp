// AVX-512 inner loops of the MLA attention kernels (mla_attention_vec.h). FP32 FMAs; the dot
// products run four rows at once so that x is loaded once per four rows.
// GCC 12 warns inside its own headers that _mm512_undefined_ps() is uninitialized when
// _mm512_reduce_add_ps inlines; the value is never read.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include "dayzero/kernels/mla_attention_vec.h"

namespace dz::kernels::detail {
namespace {

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << remaining) - 1);
}

void dot_rows_avx512(const float* x, const float* rows, int64_t row_stride, int64_t num_rows,
                     int64_t dim, float* out) {
  int64_t k = 0;
  for (; k + 4 <= num_rows; k += 4) {
    const float* r0 = rows + k * row_stride;
    const float* r1 = r0 + row_stride;
    const float* r2 = r1 + row_stride;
    const float* r3 = r2 + row_stride;
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) {
      const __mmask16 m = tail_mask(dim - c);
      const __m512 xv = _mm512_maskz_loadu_ps(m, x + c);
      a0 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, r0 + c), a0);
      a1 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, r1 + c), a1);
      a2 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, r2 + c), a2);
      a3 = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(m, r3 + c), a3);
    }
    out[k] = _mm512_reduce_add_ps(a0);
    out[k + 1] = _mm512_reduce_add_ps(a1);
    out[k + 2] = _mm512_reduce_add_ps(a2);
    out[k + 3] = _mm512_reduce_add_ps(a3);
  }
  for (; k < num_rows; ++k) {
    const float* r = rows + k * row_stride;
    __m512 a = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) {
      const __mmask16 m = tail_mask(dim - c);
      a = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, x + c), _mm512_maskz_loadu_ps(m, r + c), a);
    }
    out[k] = _mm512_reduce_add_ps(a);
  }
}

// Columns in chunks of 128 held in eight registers across all rows: one load per FMA.
void accumulate_rows_avx512(const float* p, const float* rows, int64_t row_stride, int64_t num_rows,
                            int64_t dim, float* acc) {
  constexpr int64_t kChunk = 128;
  int64_t c0 = 0;
  for (; c0 + kChunk <= dim; c0 += kChunk) {
    __m512 a[8];
    for (int j = 0; j < 8; ++j) a[j] = _mm512_loadu_ps(acc + c0 + 16 * j);
    for (int64_t k = 0; k < num_rows; ++k) {
      const __m512 pk = _mm512_set1_ps(p[k]);
      const float* r = rows + k * row_stride + c0;
      for (int j = 0; j < 8; ++j) a[j] = _mm512_fmadd_ps(pk, _mm512_loadu_ps(r + 16 * j), a[j]);
    }
    for (int j = 0; j < 8; ++j) _mm512_storeu_ps(acc + c0 + 16 * j, a[j]);
  }
  for (int64_t c = c0; c < dim; c += 16) {
    const __mmask16 m = tail_mask(dim - c);
    __m512 a = _mm512_maskz_loadu_ps(m, acc + c);
    for (int64_t k = 0; k < num_rows; ++k)
      a = _mm512_fmadd_ps(_mm512_set1_ps(p[k]), _mm512_maskz_loadu_ps(m, rows + k * row_stride + c),
                          a);
    _mm512_mask_storeu_ps(acc + c, m, a);
  }
}

}  // namespace

MlaVecOps mla_vec_ops_avx512() {
  return {.name = "avx512", .dot_rows = dot_rows_avx512, .accumulate_rows = accumulate_rows_avx512};
}

}  // namespace dz::kernels::detail
