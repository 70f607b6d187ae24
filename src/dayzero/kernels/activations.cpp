#include "dayzero/kernels/activations.h"

#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/fast_math.h"

namespace dz::kernels {

void silu_product_bf16(float* gate, const float* up, int64_t n) {
  if (cpu_features().avx512) return detail::silu_product_bf16_avx512(gate, up, n);
  for (int64_t i = 0; i < n; ++i)
    gate[i] = round_bf16_inline(silu_fast(round_bf16_inline(gate[i])) * round_bf16_inline(up[i]));
}

void sigmoid_product_bf16(float* y, const float* z, int64_t n) {
  if (cpu_features().avx512) return detail::sigmoid_product_bf16_avx512(y, z, n);
  for (int64_t i = 0; i < n; ++i) y[i] = round_bf16_inline(y[i] * sigmoid_fast(z[i]));
}

void scaled_sigmoid(float* g, const float* bias, int64_t n, float decay, float scale) {
  if (cpu_features().avx512) return detail::scaled_sigmoid_avx512(g, bias, n, decay, scale);
  for (int64_t i = 0; i < n; ++i) g[i] = scale * sigmoid_fast(decay * (g[i] + bias[i]));
}

}  // namespace dz::kernels
