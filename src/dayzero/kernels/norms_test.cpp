#include "dayzero/kernels/norms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"

namespace dz::kernels {
namespace norms_test {

// FP32 kernels against FP64 references on fresh random rows (odd widths, strided rows):
// relative RMS error < 1e-5 (docs/models.md §8.1, fp32 kernels).
double relative_rms(const std::vector<float>& got, const std::vector<double>& want) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    error += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(error / norm);
}

TEST(Norms, RmsNormAndLayerNormMatchFp64) {
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal(0.3f, 2.0f);
  for (int64_t dim : {1, 7, 128, 513}) {
    const int64_t num_rows = 5, stride = dim + 3;
    std::vector<float> x(num_rows * stride), weight(dim), bias(dim);
    for (float& v : x) v = normal(rng);
    for (float& v : weight) v = 1 + 0.1f * normal(rng);
    for (float& v : bias) v = normal(rng);
    std::vector<float> rms(num_rows * dim), ln(num_rows * dim);
    rms_norm(ExecContext{.num_threads = 2}, x.data(), stride, weight.data(), rms.data(), dim,
             num_rows, dim, 1e-6f);
    layer_norm(ExecContext{.num_threads = 2}, x.data(), stride, weight.data(), bias.data(),
               ln.data(), dim, num_rows, dim, 1e-6f);
    std::vector<double> rms_ref(rms.size()), ln_ref(ln.size());
    for (int64_t r = 0; r < num_rows; ++r) {
      const float* row = x.data() + r * stride;
      double squares = 0, mean = 0, variance = 0;
      for (int64_t i = 0; i < dim; ++i) squares += double{row[i]} * row[i], mean += row[i];
      mean /= static_cast<double>(dim);
      for (int64_t i = 0; i < dim; ++i) variance += (row[i] - mean) * (row[i] - mean);
      variance /= static_cast<double>(dim);
      for (int64_t i = 0; i < dim; ++i) {
        rms_ref[r * dim + i] =
            weight[i] * row[i] / std::sqrt(squares / static_cast<double>(dim) + 1e-6);
        ln_ref[r * dim + i] = weight[i] * (row[i] - mean) / std::sqrt(variance + 1e-6) + bias[i];
      }
    }
    EXPECT_LT(relative_rms(rms, rms_ref), 1e-5) << dim;
    if (dim > 1) {
      EXPECT_LT(relative_rms(ln, ln_ref), 1e-5) << dim;
    }
  }
}

TEST(Norms, L2NormalizeMatchesFp64) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.3f, 2.0f);
  for (int64_t dim : {1, 7, 64, 128, 513}) {
    const int64_t num_rows = 9;
    std::vector<float> x(static_cast<size_t>(num_rows * dim));
    for (float& v : x) v = normal(rng);
    std::vector<float> y = x;
    l2_normalize(ExecContext{.num_threads = 2}, y.data(), num_rows, dim, 1e-6f);
    std::vector<double> want(x.size());
    for (int64_t r = 0; r < num_rows; ++r) {
      double squares = 0;
      for (int64_t i = 0; i < dim; ++i) squares += double{x[r * dim + i]} * x[r * dim + i];
      for (int64_t i = 0; i < dim; ++i)
        want[r * dim + i] = x[r * dim + i] / std::sqrt(squares + 1e-6);
    }
    EXPECT_LT(relative_rms(y, want), 1e-6) << dim;
  }
}

TEST(Norms, RoundToBf16MatchesTheCodec) {
  std::mt19937 rng(std::random_device{}());
  std::vector<float> x(1000);
  for (float& v : x)
    v = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng),
                   static_cast<int>(rng() % 40) - 20);
  std::vector<float> rounded = x;
  round_to_bf16(rounded.data(), static_cast<int64_t>(rounded.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(rounded[i], formats::round_to_bf16(x[i]));
}

}  // namespace norms_test
}  // namespace dz::kernels
