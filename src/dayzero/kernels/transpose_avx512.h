#pragma once
// A 16 × 16 transpose of 32-bit elements in registers, for the AVX-512 kernels that turn rows into
// the column pairs AMX and VDPBF16PS operands want. Include only from *_avx512.cpp files.
#include <immintrin.h>

#include <cstdint>

namespace dz::kernels::detail {

// dst[j][i] = src[i][j] for a 16 × 16 block of floats (strides in floats): 64 in-register
// shuffles instead of 16 scatters or gathers.
inline void transpose16(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m512 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * src_stride);
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // r[4q + m], per 128-bit block b: column 4b + m of rows 4q … 4q + 3.
#pragma GCC unroll 4
  for (int q4 = 0; q4 < 16; q4 += 4) {
    const __m512d a = _mm512_castps_pd(t[q4]), b = _mm512_castps_pd(t[q4 + 1]);
    const __m512d c = _mm512_castps_pd(t[q4 + 2]), d = _mm512_castps_pd(t[q4 + 3]);
    r[q4] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[q4 + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[q4 + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[q4 + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m) {
    const __m512 v0 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x88);
    const __m512 v1 = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xDD);
    const __m512 w0 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x88);
    const __m512 w1 = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xDD);
    _mm512_storeu_ps(dst + m * dst_stride, _mm512_shuffle_f32x4(v0, w0, 0x88));
    _mm512_storeu_ps(dst + (4 + m) * dst_stride, _mm512_shuffle_f32x4(v1, w1, 0x88));
    _mm512_storeu_ps(dst + (8 + m) * dst_stride, _mm512_shuffle_f32x4(v0, w0, 0xDD));
    _mm512_storeu_ps(dst + (12 + m) * dst_stride, _mm512_shuffle_f32x4(v1, w1, 0xDD));
  }
}

}  // namespace dz::kernels::detail
