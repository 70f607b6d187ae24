// AVX-512 bodies of activations.h: 16 elements per step, the tail masked.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() idiom
// (GCC bug 105593); the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "dayzero/kernels/activations.h"
#include "dayzero/kernels/activations_avx512.h"
#include "dayzero/kernels/bf16_avx512.h"

namespace dz::kernels::detail {
namespace {

__mmask16 tail_mask(int64_t num_left) {
  return num_left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << num_left) - 1);
}

}  // namespace

void silu_product_bf16_avx512(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 g = round_bf16_16(_mm512_maskz_loadu_ps(m, gate + i));
    const __m512 u = round_bf16_16(_mm512_maskz_loadu_ps(m, up + i));
    _mm512_mask_storeu_ps(gate + i, m,
                          round_bf16_16(_mm512_mul_ps(_mm512_mul_ps(g, sigmoid_ps(g)), u)));
  }
}

void sigmoid_product_bf16_avx512(float* y, const float* z, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 s = sigmoid_ps(_mm512_maskz_loadu_ps(m, z + i));
    _mm512_mask_storeu_ps(y + i, m,
                          round_bf16_16(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, y + i), s)));
  }
}

void scaled_sigmoid_avx512(float* g, const float* bias, int64_t n, float decay, float scale) {
  const __m512 decay_v = _mm512_set1_ps(decay), scale_v = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 f =
        _mm512_add_ps(_mm512_maskz_loadu_ps(m, g + i), _mm512_maskz_loadu_ps(m, bias + i));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(scale_v, sigmoid_ps(_mm512_mul_ps(decay_v, f))));
  }
}

}  // namespace dz::kernels::detail
