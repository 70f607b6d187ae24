#pragma once
// The short causal depthwise convolution of KDA (docs/models.md §4.3) followed by SiLU, with its
// decode state (docs/formats.md §5.5): the last width − 1 pre-convolution rows, stored as BF16
// codes because the projections feeding the convolution are BF16-valued (docs/models.md §0), so the
// codes are exact.

#include <cstdint>

#include "dayzero/core/parallel.h"

namespace dz::kernels {

// Widest convolution supported (Kimi uses 4).
inline constexpr int64_t kMaxShortConvWidth = 8;

// y[t, c] = SiLU(Σ_j w[c, j] · xp[t + j, c]) with xp = [conv_state (width−1 rows, oldest first) ;
// x], FP32 accumulation in tap order j = 0 … width−1. x [T, channels] BF16-valued FP32; w
// [channels, width] FP32 (tap width−1 = current token); conv_state [width−1, channels] BF16 codes,
// replaced by the last width−1 rows of xp (zeros for a new sequence are the caller's job). y [T,
// channels] FP32 (not rounded). 1 ≤ width ≤ kMaxShortConvWidth. Parallel over channel blocks. SiLU
// as activations.h computes it.
void short_conv_silu(const ExecContext& ctx, const float* x, int64_t num_tokens, int64_t channels,
                     const float* w, int64_t width, uint16_t* conv_state, float* y);

namespace detail {
// Channels [c_begin, c_end) of short_conv_silu.
void short_conv_silu_avx512(const float* x, int64_t num_tokens, int64_t channels, const float* w,
                            int64_t width, uint16_t* conv_state, float* y, int64_t c_begin,
                            int64_t c_end);
}  // namespace detail

// The scalar oracle: the same with double accumulation and a double SiLU.
void short_conv_silu_ref(const ExecContext& ctx, const float* x, int64_t num_tokens,
                         int64_t channels, const float* w, int64_t width, uint16_t* conv_state,
                         float* y);

}  // namespace dz::kernels
