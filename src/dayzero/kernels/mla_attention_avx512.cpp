// AVX-512 inner loops of the MLA attention kernels (mla_attention_vec.h). FP32 FMAs; the dot
// products run four rows at once so that x is loaded once per four rows.
// GCC 12 warns inside its own headers that _mm512_undefined_ps() is uninitialized when
// _mm512_reduce_add_ps inlines; the value is never read.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "dayzero/kernels/exp_avx512.h"
#include "dayzero/kernels/mla_attention_vec.h"
#include "dayzero/kernels/unroll.h"

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

// The sums of a[0..15], each added in _mm512_reduce_add_ps's order (lanes i + i+8, then i + i+4,
// then 0 + 2 and 1 + 3, then those two), sixteen at once: lane 4q + k of the result is the sum of
// a[4q + k]. The shuffles only pair lanes; every addition is one reduce_add makes.
inline __m512 reduce16(const __m512 (&a)[16]) {
  __m512 b[8], c[4], d[2];
  DZ_UNROLL(8)
  for (int m = 0; m < 8; ++m)  // blocks: [s1(a2m) lo, hi, s1(a2m+1) lo, hi], s1 = lo8 + hi8
    b[m] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * m], a[2 * m + 1], 0xEE));
  DZ_UNROLL(4)
  for (int n = 0; n < 4; ++n)  // block j: s2(a4n+j) = s1 lo4 + hi4
    c[n] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * n], b[2 * n + 1], 0x88),
                         _mm512_shuffle_f32x4(b[2 * n], b[2 * n + 1], 0xDD));
  DZ_UNROLL(2)
  for (int p = 0; p < 2; ++p)  // block j: s2[0] + s2[2], s2[1] + s2[3] of a8p+j, then of a8p+4+j
    d[p] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  // Block j: the sums of a[j], a[4 + j], a[8 + j], a[12 + j]; then lane 4q + k ← a[4q + k].
  const __m512 e = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(
      _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), e);
}

// Four queries by four rows per step: 16 accumulators, each row and query chunk loaded once.
void dot_rows_x4_avx512(const float* const x[4], const float* rows, int64_t row_stride,
                        int64_t num_rows, int64_t dim, float* const out[4]) {
  int64_t k = 0;
  for (; k + 4 <= num_rows; k += 4) {
    __m512 a[16];
    DZ_UNROLL(16)
    for (int i = 0; i < 16; ++i) a[i] = _mm512_setzero_ps();
    for (int64_t c = 0; c < dim; c += 16) {
      const __mmask16 m = tail_mask(dim - c);
      __m512 xv[4], rv[4];
      DZ_UNROLL(4)
      for (int q = 0; q < 4; ++q) xv[q] = _mm512_maskz_loadu_ps(m, x[q] + c);
      DZ_UNROLL(4)
      for (int j = 0; j < 4; ++j) rv[j] = _mm512_maskz_loadu_ps(m, rows + (k + j) * row_stride + c);
      DZ_UNROLL(4)
      for (int q = 0; q < 4; ++q) {
        DZ_UNROLL(4)
        for (int j = 0; j < 4; ++j) a[4 * q + j] = _mm512_fmadd_ps(xv[q], rv[j], a[4 * q + j]);
      }
    }
    alignas(64) float sums[16];
    _mm512_store_ps(sums, reduce16(a));
    for (int q = 0; q < 4; ++q) std::memcpy(out[q] + k, sums + 4 * q, 4 * sizeof(float));
  }
  if (k < num_rows)
    for (int q = 0; q < 4; ++q)
      dot_rows_avx512(x[q], rows + k * row_stride, row_stride, num_rows - k, dim, out[q] + k);
}

// Columns in chunks of 64 for four queries (16 accumulators), each row chunk loaded once; every
// accumulator takes the rows in order, as accumulate_rows_avx512 does.
void accumulate_rows_x4_avx512(const float* const p[4], const float* rows, int64_t row_stride,
                               int64_t num_rows, int64_t dim, float* const acc[4]) {
  constexpr int64_t kChunk = 64;
  int64_t c0 = 0;
  for (; c0 + kChunk <= dim; c0 += kChunk) {
    __m512 a[4][4];
    DZ_UNROLL(4)
    for (int q = 0; q < 4; ++q) {
      DZ_UNROLL(4)
      for (int j = 0; j < 4; ++j) a[q][j] = _mm512_loadu_ps(acc[q] + c0 + 16 * j);
    }
    for (int64_t k = 0; k < num_rows; ++k) {
      const float* r = rows + k * row_stride + c0;
      __m512 rv[4];
      DZ_UNROLL(4)
      for (int j = 0; j < 4; ++j) rv[j] = _mm512_loadu_ps(r + 16 * j);
      DZ_UNROLL(4)
      for (int q = 0; q < 4; ++q) {
        const __m512 pk = _mm512_set1_ps(p[q][k]);
        DZ_UNROLL(4)
        for (int j = 0; j < 4; ++j) a[q][j] = _mm512_fmadd_ps(pk, rv[j], a[q][j]);
      }
    }
    DZ_UNROLL(4)
    for (int q = 0; q < 4; ++q) {
      DZ_UNROLL(4)
      for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc[q] + c0 + 16 * j, a[q][j]);
    }
  }
  for (int64_t c = c0; c < dim; c += 16) {
    const __mmask16 m = tail_mask(dim - c);
    for (int q = 0; q < 4; ++q) {
      __m512 a = _mm512_maskz_loadu_ps(m, acc[q] + c);
      for (int64_t k = 0; k < num_rows; ++k)
        a = _mm512_fmadd_ps(_mm512_set1_ps(p[q][k]),
                            _mm512_maskz_loadu_ps(m, rows + k * row_stride + c), a);
      _mm512_mask_storeu_ps(acc[q] + c, m, a);
    }
  }
}

bool prefill_weights_avx512(float* scores, const float* rope, const float* allowed, int64_t n,
                            float scale, float& m, float& l, float* acc, int64_t dim) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 vmax = neg_inf;
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 valid = tail_mask(n - k);
    const __mmask16 kept = _mm512_mask_cmp_ps_mask(valid, _mm512_maskz_loadu_ps(valid, allowed + k),
                                                   _mm512_setzero_ps(), _CMP_NEQ_UQ);
    // (s + rope) · scale as two roundings, like the portable variant (no FMA).
    const __m512 s = _mm512_mask_mul_ps(neg_inf, kept,
                                        _mm512_add_ps(_mm512_maskz_loadu_ps(valid, scores + k),
                                                      _mm512_maskz_loadu_ps(valid, rope + k)),
                                        vscale);
    _mm512_mask_storeu_ps(scores + k, valid, s);
    vmax = _mm512_max_ps(vmax, s);
  }
  const float tile_max = _mm512_reduce_max_ps(vmax);
  if (tile_max == -std::numeric_limits<float>::infinity()) {
    for (int64_t k = 0; k < n; k += 16)
      _mm512_mask_storeu_ps(scores + k, tail_mask(n - k), _mm512_setzero_ps());
    return false;
  }
  const float m_new = m > tile_max ? m : tile_max;
  const float correction = std::exp(m - m_new);  // 0 on the first tile (m = −inf)
  if (correction != 1.0f) {
    const __m512 c = _mm512_set1_ps(correction);
    for (int64_t j = 0; j < dim; j += 16) {
      const __mmask16 valid = tail_mask(dim - j);
      _mm512_mask_storeu_ps(acc + j, valid,
                            _mm512_mul_ps(_mm512_maskz_loadu_ps(valid, acc + j), c));
    }
  }
  const __m512 shift = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 valid = tail_mask(n - k);
    const __m512 s = _mm512_maskz_loadu_ps(valid, scores + k);
    // A masked key's −inf gives exactly 0 (exp_ps clamps it to e^−104, under half the smallest
    // subnormal); lanes past n add nothing.
    const __m512 p = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(s, shift)));
    _mm512_mask_storeu_ps(scores + k, valid, p);
    sum = _mm512_add_ps(sum, p);
  }
  l = l * correction + _mm512_reduce_add_ps(sum);
  m = m_new;
  return true;
}

}  // namespace

MlaVecOps mla_vec_ops_avx512() {
  return {.name = "avx512",
          .dot_rows = dot_rows_avx512,
          .accumulate_rows = accumulate_rows_avx512,
          .dot_rows_x4 = dot_rows_x4_avx512,
          .accumulate_rows_x4 = accumulate_rows_x4_avx512,
          .prefill_weights = prefill_weights_avx512};
}

}  // namespace dz::kernels::detail
