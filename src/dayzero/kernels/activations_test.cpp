#include "dayzero/kernels/activations.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"

namespace dz::kernels {
namespace {

// Each kernel against the FP64 formula on fresh random values spanning the saturated ends of σ
// (|x| up to 100), at lengths with masked tails. Absolute slack 1e-33: the portable σ stops at
// e^−87 (fast_math.h), so σ(−100) is 1.6e-38, not 3.7e-44. FP32 results: within 1e-6 relative (a
// few ulp of e^x and the divide). BF16 results: the FP64 value before the last rounding is v, so
// the kernel's FP32 value lies within 1e-6 of it and its rounding is bf16(v) or the neighbour on
// the other side of a rounding boundary: |got − v| ≤ 2^−8·|v| (half a BF16 ulp, plus the slack).
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

struct Inputs {
  std::vector<float> a, b;
};

Inputs random_inputs(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> wide(-100.0f, 100.0f);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  Inputs in{std::vector<float>(static_cast<size_t>(n)), std::vector<float>(static_cast<size_t>(n))};
  for (int64_t i = 0; i < n; ++i) {
    in.a[static_cast<size_t>(i)] = i % 7 == 0 ? wide(rng) : normal(rng);
    in.b[static_cast<size_t>(i)] = normal(rng);
  }
  return in;
}

void expect_bf16_of(float got, double v, int64_t i) {
  ASSERT_EQ(got, formats::round_to_bf16(got)) << "element " << i << " is not a BF16 value";
  ASSERT_LE(std::fabs(got - v), std::ldexp(std::fabs(v), -8) + 1e-33) << "element " << i;
}

TEST(Activations, MatchTheFp64Formulas) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const int64_t n : {1, 15, 16, 17, 256, 1000}) {
    SCOPED_TRACE(n);
    const Inputs in = random_inputs(rng, n);
    std::vector<float> gate = in.a;
    silu_product_bf16(gate.data(), in.b.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double g = formats::round_to_bf16(in.a[static_cast<size_t>(i)]);
      const double u = formats::round_to_bf16(in.b[static_cast<size_t>(i)]);
      expect_bf16_of(gate[static_cast<size_t>(i)], g * sigmoid(g) * u, i);
    }
    std::vector<float> y = in.b;
    sigmoid_product_bf16(y.data(), in.a.data(), n);
    for (int64_t i = 0; i < n; ++i)
      expect_bf16_of(y[static_cast<size_t>(i)],
                     double{in.b[static_cast<size_t>(i)]} * sigmoid(in.a[static_cast<size_t>(i)]),
                     i);
    std::vector<float> g = in.a;
    const float decay = 0.7f, scale = -5.0f;
    scaled_sigmoid(g.data(), in.b.data(), n, decay, scale);
    for (int64_t i = 0; i < n; ++i) {
      const auto f =
          static_cast<double>(in.a[static_cast<size_t>(i)] + in.b[static_cast<size_t>(i)]);
      const double want = scale * sigmoid(static_cast<double>(decay * static_cast<float>(f)));
      ASSERT_NEAR(g[static_cast<size_t>(i)], want, 1e-6 * std::fabs(want) + 1e-33) << i;
    }
  }
}

// Far out on both sides σ is 1 or below 1e-30, never a NaN or an Inf from e^x overflowing.
TEST(Activations, SaturateWithoutNaN) {
  std::vector<float> gate = {1e4f, -1e4f, 88.0f, -88.0f}, up = {2.0f, 2.0f, 1.0f, 1.0f};
  silu_product_bf16(gate.data(), up.data(), 4);
  EXPECT_EQ(gate[0], formats::round_to_bf16(2e4f));
  EXPECT_LT(std::fabs(gate[1]), 1e-30f);
  EXPECT_EQ(gate[2], 88.0f);
  EXPECT_LT(std::fabs(gate[3]), 1e-30f);
  std::vector<float> y = {3.0f, 3.0f}, z = {1e30f, -1e30f};
  sigmoid_product_bf16(y.data(), z.data(), 2);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_LT(std::fabs(y[1]), 1e-30f);
}

}  // namespace
}  // namespace dz::kernels
