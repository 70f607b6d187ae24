#pragma once
// Elementwise activations of the blocks, on FP32 rows: σ and SiLU by fast_math.h's e^x in the
// portable code and by exp_avx512.h's in the AVX-512 one (both within 2e-7 relative of the exact
// value, far below the BF16 rounding that follows). Each element is computed alone, so a row of
// several tokens gives every token what a one-token row gives it.

#include <cstdint>

namespace dz::kernels {

// gate[i] ← bf16(SiLU(bf16(gate[i])) · bf16(up[i])) for i < n: the gated MLP's product.
void silu_product_bf16(float* gate, const float* up, int64_t n);

// y[i] ← bf16(y[i] · σ(z[i])) for i < n: an output gate.
void sigmoid_product_bf16(float* y, const float* z, int64_t n);

// g[i] ← scale · σ(decay · (g[i] + bias[i])) for i < n: Kimi-K3's bounded KDA gate.
void scaled_sigmoid(float* g, const float* bias, int64_t n, float decay, float scale);

namespace detail {
void silu_product_bf16_avx512(float* gate, const float* up, int64_t n);
void sigmoid_product_bf16_avx512(float* y, const float* z, int64_t n);
void scaled_sigmoid_avx512(float* g, const float* bias, int64_t n, float decay, float scale);
}  // namespace detail

}  // namespace dz::kernels
