#include "dayzero/kernels/norms.h"

#include <cmath>

#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/linear_kernels.h"

namespace dz::kernels {

namespace {

float sum_squares(const float* x, int64_t n) {
  if (cpu_features().avx512) return detail::sum_squares_avx512(x, n);
  float sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += x[i] * x[i];
  return sum;
}

}  // namespace

void rms_norm(const ExecContext& ctx, const float* x, int64_t x_stride, const float* weight,
              float* y, int64_t y_stride, int64_t num_rows, int64_t dim, float eps) {
  parallel_for(ctx, num_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = x + r * x_stride;
      float* out = y + r * y_stride;
      const float sum_squares = kernels::sum_squares(in, dim);
      float inv_rms = 1.0f / std::sqrt(sum_squares / static_cast<float>(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) out[i] = weight[i] * (in[i] * inv_rms);
    }
  });
}

void l2_normalize(const ExecContext& ctx, float* x, int64_t num_rows, int64_t dim, float eps) {
  parallel_for(ctx, num_rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = x + r * dim;
      const float norm = std::sqrt(sum_squares(row, dim) + eps);
      for (int64_t i = 0; i < dim; ++i) row[i] /= norm;
    }
  });
}

void layer_norm(const ExecContext& ctx, const float* x, int64_t x_stride, const float* weight,
                const float* bias, float* y, int64_t y_stride, int64_t num_rows, int64_t dim,
                float eps) {
  parallel_for(ctx, num_rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* in = x + r * x_stride;
      float* out = y + r * y_stride;
      float mean = 0;
      for (int64_t i = 0; i < dim; ++i) mean += in[i];
      mean /= static_cast<float>(dim);
      float variance = 0;
      for (int64_t i = 0; i < dim; ++i) variance += (in[i] - mean) * (in[i] - mean);
      variance /= static_cast<float>(dim);
      float inv_std = 1.0f / std::sqrt(variance + eps);
      for (int64_t i = 0; i < dim; ++i) out[i] = weight[i] * ((in[i] - mean) * inv_std) + bias[i];
    }
  });
}

void round_to_bf16(float* x, int64_t num_elems) {
  // The AVX-512 loop rounds exactly as formats::round_to_bf16 (RNE, NaN → the quiet NaN); the
  // scalar codec call per element was ~5 % of a batch-64 decode step (docs/performance.md, issue
  // 8).
  if (cpu_features().avx512) {
    detail::round_to_bf16_avx512(x, num_elems, nullptr, x);
    return;
  }
  for (int64_t i = 0; i < num_elems; ++i) x[i] = formats::round_to_bf16(x[i]);
}

}  // namespace dz::kernels
