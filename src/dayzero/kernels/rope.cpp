#include "dayzero/kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "dayzero/core/check.h"

namespace dz::kernels {

RopeFrequencies plain_rope_frequencies(int64_t rope_dim, double theta) {
  DZ_CHECK(rope_dim > 0 && rope_dim % 2 == 0, "rope_dim {}", rope_dim);
  RopeFrequencies freqs;
  freqs.rope_dim = rope_dim;
  for (int64_t i = 0; i < rope_dim / 2; ++i)
    freqs.inv_freq.push_back(static_cast<float>(
        1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(rope_dim))));
  return freqs;
}

double yarn_mscale(double factor, double mscale) {
  return factor <= 1.0 ? 1.0 : 0.1 * mscale * std::log(factor) + 1.0;
}

RopeFrequencies yarn_rope_frequencies(int64_t rope_dim, double theta, const YarnParams& yarn) {
  RopeFrequencies freqs = plain_rope_frequencies(rope_dim, theta);
  const double d = static_cast<double>(rope_dim);
  auto correction_dim = [&](double num_rotations) {
    return d *
           std::log(static_cast<double>(yarn.original_max_position_embeddings) /
                    (2 * std::numbers::pi * num_rotations)) /
           (2 * std::log(theta));
  };
  double low = std::max(std::floor(correction_dim(yarn.beta_fast)), 0.0);
  double high = std::min(std::ceil(correction_dim(yarn.beta_slow)), d - 1);
  if (low == high) high += 0.001;
  for (int64_t i = 0; i < rope_dim / 2; ++i) {
    double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    double f = freqs.inv_freq[static_cast<size_t>(i)];
    freqs.inv_freq[static_cast<size_t>(i)] =
        static_cast<float>(f * (1 - ramp) + f / yarn.factor * ramp);
  }
  freqs.magnitude = static_cast<float>(yarn_mscale(yarn.factor, yarn.mscale) /
                                       yarn_mscale(yarn.factor, yarn.mscale_all_dim));
  return freqs;
}

void apply_rope(const ExecContext& ctx, const RopeFrequencies& freqs, RopeLayout layout,
                std::span<const int32_t> positions, float* x, int64_t token_stride,
                int64_t num_heads, int64_t head_stride) {
  const int64_t half = freqs.rope_dim / 2;
  parallel_for(ctx, static_cast<int64_t>(positions.size()), 8, [&](int64_t begin, int64_t end) {
    std::vector<float> cos_a(static_cast<size_t>(half)), sin_a(static_cast<size_t>(half));
    for (int64_t t = begin; t < end; ++t) {
      const float pos = static_cast<float>(positions[static_cast<size_t>(t)]);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = pos * freqs.inv_freq[static_cast<size_t>(i)];  // FP32, as the reference
        cos_a[static_cast<size_t>(i)] = std::cos(angle) * freqs.magnitude;
        sin_a[static_cast<size_t>(i)] = std::sin(angle) * freqs.magnitude;
      }
      for (int64_t h = 0; h < num_heads; ++h) {
        float* v = x + t * token_stride + h * head_stride;
        for (int64_t i = 0; i < half; ++i) {
          const int64_t a = layout == RopeLayout::kInterleaved ? 2 * i : i;
          const int64_t b = layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + half;
          const float c = cos_a[static_cast<size_t>(i)], s = sin_a[static_cast<size_t>(i)];
          const float xa = v[a], xb = v[b];
          v[a] = xa * c - xb * s;
          v[b] = xa * s + xb * c;
        }
      }
    }
  });
}

}  // namespace dz::kernels
