#include "dayzero/kernels/rope.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <random>
#include <vector>

namespace dz::kernels {
namespace rope_test {

// DeepSeek-V3.2's YaRN (docs/models.md §1.3): d_r 64, θ 10000, factor 40, L0 4096, β 32/1. The ramp
// runs from pair 10 (unchanged at and below) to pair 23 (divided by 40 at and above).
TEST(YarnRopeFrequencies, MatchTheDeepSeekConstants) {
  YarnParams yarn{.factor = 40,
                  .original_max_position_embeddings = 4096,
                  .beta_fast = 32,
                  .beta_slow = 1,
                  .mscale = 1.0,
                  .mscale_all_dim = 1.0};
  RopeFrequencies plain = plain_rope_frequencies(64, 10000.0);
  RopeFrequencies scaled = yarn_rope_frequencies(64, 10000.0, yarn);
  ASSERT_EQ(scaled.inv_freq.size(), 32u);
  for (size_t i = 0; i <= 10; ++i) EXPECT_EQ(scaled.inv_freq[i], plain.inv_freq[i]) << i;
  for (size_t i = 23; i < 32; ++i)
    EXPECT_NEAR(scaled.inv_freq[i], plain.inv_freq[i] / 40.0f, 1e-7f * plain.inv_freq[i]) << i;
  for (size_t i = 11; i < 23; ++i) {
    EXPECT_LT(scaled.inv_freq[i], plain.inv_freq[i]) << i;
    EXPECT_GT(scaled.inv_freq[i], plain.inv_freq[i] / 40.0f) << i;
  }
  EXPECT_EQ(scaled.magnitude, 1.0f);  // M(s, 1) / M(s, 1)
  // softmax scale correction M(40, 1)² for d_n + d_r = 192: 0.135234 (docs/models.md §1.3).
  double scale = std::pow(192.0, -0.5) * std::pow(yarn_mscale(40, 1.0), 2);
  EXPECT_NEAR(scale, 0.135234, 5e-7);
  EXPECT_EQ(yarn_mscale(1.0, 1.0), 1.0);
}

// Both layouts against the formulas of docs/models.md §1.2 evaluated independently, on random
// inputs, with positions up to 160K where FP32 angles matter.
TEST(ApplyRope, BothLayoutsMatchTheFormulas) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  const int64_t rope_dim = 16, num_heads = 3, head_stride = 20, token_stride = 70;
  RopeFrequencies freqs = plain_rope_frequencies(rope_dim, 10000.0);
  freqs.magnitude = 1.25f;
  std::vector<int32_t> positions = {0, 1, 17, 4095, 163839};
  for (RopeLayout layout : {RopeLayout::kInterleaved, RopeLayout::kRotateHalf}) {
    std::vector<float> x(positions.size() * token_stride);
    for (float& v : x) v = normal(rng);
    std::vector<float> original = x;
    apply_rope(ExecContext{.num_threads = 2}, freqs, layout, positions, x.data(), token_stride,
               num_heads, head_stride);
    for (size_t t = 0; t < positions.size(); ++t)
      for (int64_t h = 0; h < num_heads; ++h) {
        const float* in = original.data() + t * token_stride + h * head_stride;
        const float* out = x.data() + t * token_stride + h * head_stride;
        for (int64_t i = 0; i < rope_dim / 2; ++i) {
          float angle = static_cast<float>(positions[t]) * freqs.inv_freq[static_cast<size_t>(i)];
          double c = std::cos(angle) * 1.25, s = std::sin(angle) * 1.25;
          int64_t a = layout == RopeLayout::kInterleaved ? 2 * i : i;
          int64_t b = layout == RopeLayout::kInterleaved ? 2 * i + 1 : i + rope_dim / 2;
          EXPECT_NEAR(out[a], in[a] * c - in[b] * s, 1e-5) << t << " " << h << " " << i;
          EXPECT_NEAR(out[b], in[a] * s + in[b] * c, 1e-5) << t << " " << h << " " << i;
        }
        // Values past the rope slice are untouched.
        for (int64_t i = rope_dim; i < head_stride; ++i) EXPECT_EQ(out[i], in[i]);
      }
  }
}

TEST(ApplyRope, LayoutsDiffer) {
  RopeFrequencies freqs = plain_rope_frequencies(8, 10000.0);
  std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8}, b = a;
  std::vector<int32_t> positions = {5};
  apply_rope(ExecContext{}, freqs, RopeLayout::kInterleaved, positions, a.data(), 8, 1, 8);
  apply_rope(ExecContext{}, freqs, RopeLayout::kRotateHalf, positions, b.data(), 8, 1, 8);
  EXPECT_NE(a, b);
}

}  // namespace rope_test
}  // namespace dz::kernels
