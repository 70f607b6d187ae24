#pragma once
// Row normalizations, docs/models.md §1.1. FP32 in, FP32 out, FP32 accumulation; callers round to
// BF16 where the model stores activations (formats::round_to_bf16). With AVX-512 the sums of
// squares are 64 partial sums added at the end (a serial sum of a 256-wide row was ~1 % of a
// decode step per norm kind); the order depends on the row only, never on the row count.

#include <cstdint>

#include "dayzero/core/parallel.h"

namespace dz::kernels {

// y[r, :] = weight ⊙ x[r, :] · (mean(x[r, :]²) + eps)^(−1/2). x and y are [num_rows, dim] with row
// strides x_stride/y_stride (elements); y may alias x.
void rms_norm(const ExecContext& ctx, const float* x, int64_t x_stride, const float* weight,
              float* y, int64_t y_stride, int64_t num_rows, int64_t dim, float eps);

// x[r, :] ← x[r, :] / sqrt(Σ x[r, :]² + eps) in place, rows of dim contiguous (KDA's q and k).
void l2_normalize(const ExecContext& ctx, float* x, int64_t num_rows, int64_t dim, float eps);

namespace detail {
// Σ x[i]² for i < n.
float sum_squares_avx512(const float* x, int64_t n);
}  // namespace detail

// y = weight ⊙ (x − μ)/sqrt(σ² + eps) + bias, μ and σ² the mean and biased variance of the row.
void layer_norm(const ExecContext& ctx, const float* x, int64_t x_stride, const float* weight,
                const float* bias, float* y, int64_t y_stride, int64_t num_rows, int64_t dim,
                float eps);

// Rounds every value to the nearest BF16 (RNE), in place: activations are stored as BF16 between
// blocks (docs/models.md §0), kept in FP32 buffers so that kernels read one type.
void round_to_bf16(float* x, int64_t num_elems);

}  // namespace dz::kernels
