// AVX-512 body of short_conv.h: 16 channels per vector, the window of width − 1 rows kept in
// registers across the tokens; taps summed in the generic order (j = 0 … width − 1), with FMA.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() idiom
// (GCC bug 105593); the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>

#include "dayzero/kernels/activations_avx512.h"
#include "dayzero/kernels/bf16_avx512.h"
#include "dayzero/kernels/short_conv.h"

namespace dz::kernels::detail {

void short_conv_silu_avx512(const float* x, int64_t num_tokens, int64_t channels, const float* w,
                            int64_t width, uint16_t* conv_state, float* y, int64_t c_begin,
                            int64_t c_end) {
  const int64_t hist_rows = width - 1;
  // The window rows are a sequence's state from its last step, long evicted by then: fetching
  // them all first lets their misses overlap (a block's loads waited on them one block at a time,
  // 12 % of a 16-sequence decode step on the demo model).
  for (int64_t j = 0; j < hist_rows; ++j)
    for (int64_t c = c_begin; c < c_end; c += 32)
      _mm_prefetch(reinterpret_cast<const char*>(conv_state + j * channels + c), _MM_HINT_T0);
  for (int64_t c0 = c_begin; c0 < c_end; c0 += 16) {
    const int64_t nc = std::min<int64_t>(16, c_end - c0);
    const auto m = static_cast<__mmask16>(nc == 16 ? 0xFFFF : (1u << nc) - 1);
    __m512 taps[kMaxShortConvWidth], hist[kMaxShortConvWidth];
    // w is [channels, width]: read in order and transposed through L1 (a stride-width gather from
    // memory the step had evicted cost more than the whole convolution).
    alignas(64) float tap_rows[kMaxShortConvWidth][16] = {};
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t j = 0; j < width; ++j) tap_rows[j][c] = w[(c0 + c) * width + j];
    for (int64_t j = 0; j < width; ++j) taps[j] = _mm512_load_ps(tap_rows[j]);
    for (int64_t j = 0; j < hist_rows; ++j) {
      const __m256i codes = _mm256_maskz_loadu_epi16(m, conv_state + j * channels + c0);
      hist[j] = decode_bf16_16(codes);
    }
    for (int64_t t = 0; t < num_tokens; ++t) {
      const __m512 xt = _mm512_maskz_loadu_ps(m, x + t * channels + c0);
      __m512 acc = _mm512_setzero_ps();
      for (int64_t j = 0; j < hist_rows; ++j) acc = _mm512_fmadd_ps(taps[j], hist[j], acc);
      acc = _mm512_fmadd_ps(taps[hist_rows], xt, acc);
      _mm512_mask_storeu_ps(y + t * channels + c0, m, _mm512_mul_ps(acc, sigmoid_ps(acc)));
      for (int64_t j = 0; j + 1 < hist_rows; ++j) hist[j] = hist[j + 1];
      if (hist_rows > 0) hist[hist_rows - 1] = xt;
    }
    // The window's rows are BF16 values (the inputs are): the encode is exact.
    for (int64_t j = 0; j < hist_rows; ++j)
      _mm256_mask_storeu_epi16(conv_state + j * channels + c0, m, encode_bf16_16(hist[j]));
  }
}

}  // namespace dz::kernels::detail
