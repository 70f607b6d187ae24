#pragma once
// Rotary position embedding, docs/models.md §1.2–1.3: per-pair inverse frequencies (plain or YaRN),
// angles as an FP32 product p·f_i with FP32 cos/sin (as the reference: a double angle drifts by
// ~1e-2 rad at 160K), and the two pair layouts.

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/parallel.h"

namespace dz::kernels {

enum class RopeLayout {
  kInterleaved,  // pairs (x[2i], x[2i+1]): DeepSeek MLA
  kRotateHalf,   // pairs (x[j], x[j + d/2]): the DSA indexer (docs/models.md §3.5)
};

struct YarnParams {
  double factor = 1.0;                              // s
  int64_t original_max_position_embeddings = 4096;  // L0
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;
};

struct RopeFrequencies {
  int64_t rope_dim = 0;         // d_r, even
  std::vector<float> inv_freq;  // [rope_dim / 2], f'_i
  float magnitude = 1.0f;       // cos/sin factor M(s, mscale) / M(s, mscale_all_dim)
};

RopeFrequencies plain_rope_frequencies(int64_t rope_dim, double theta);
RopeFrequencies yarn_rope_frequencies(int64_t rope_dim, double theta, const YarnParams& yarn);
// M(s, m) = 0.1·m·ln(s) + 1 for s > 1, else 1; the softmax scale correction is M(s,
// mscale_all_dim)².
double yarn_mscale(double factor, double mscale);

// Rotates, in place, the rope_dim values starting at x + t·token_stride + h·head_stride for every
// token t < positions.size() and head h < num_heads, at angle positions[t] · inv_freq[i].
void apply_rope(const ExecContext& ctx, const RopeFrequencies& freqs, RopeLayout layout,
                std::span<const int32_t> positions, float* x, int64_t token_stride,
                int64_t num_heads, int64_t head_stride);

}  // namespace dz::kernels
