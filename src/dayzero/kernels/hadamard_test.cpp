// Walsh–Hadamard reference (docs/models.md §1.4). FP32 butterflies against an FP64 dense product.
#include "dayzero/kernels/hadamard.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

namespace dz::kernels {
namespace hadamard_test {

TEST(Hadamard, MatchesTheDenseSylvesterMatrix) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int64_t n : {1, 2, 4, 8, 32, 128, 256}) {
    const int64_t num_rows = 3;
    std::vector<float> x(num_rows * n);
    for (auto& v : x) v = normal(rng);
    std::vector<float> y = x;
    hadamard_ref(y, n);
    for (int64_t r = 0; r < num_rows; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        double expected = 0.0, magnitude = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const double sign = std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -1.0 : 1.0;
          expected += sign * x[r * n + j];
          magnitude += std::fabs(x[r * n + j]);
        }
        expected /= std::sqrt(static_cast<double>(n));
        // log2(n) FP32 roundings plus the scale: relative to Σ|x| / sqrt(n), 2^-20 is ample.
        ASSERT_NEAR(y[r * n + i], expected,
                    0x1p-20 * magnitude / std::sqrt(static_cast<double>(n)) + 1e-30)
            << "n " << n << " row " << r << " i " << i;
      }
    }
  }
}

// hadamard() runs the AVX-512 body where the CPU has it: bit for bit the reference.
TEST(Hadamard, EqualsTheReferenceBitForBit) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int64_t n : {64, 128}) {
    std::vector<float> x(static_cast<size_t>(5 * n));
    for (auto& v : x) v = normal(rng);
    std::vector<float> want = x;
    hadamard_ref(want, n);
    hadamard(x, n);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(x[i]), std::bit_cast<uint32_t>(want[i])) << n << " " << i;
  }
}

TEST(Hadamard, IsItsOwnInverse) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n = 128;
  std::vector<float> x(4 * n);
  for (auto& v : x) v = normal(rng);
  std::vector<float> y = x;
  hadamard_ref(y, n);
  hadamard_ref(y, n);
  for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(y[i], x[i], 1e-5f * (1.0f + std::fabs(x[i])));
}

TEST(Hadamard, UnitVectorSpreadsToOneOverSqrtN) {
  for (int64_t n : {2, 16, 128}) {
    std::vector<float> e0(n, 0.0f);
    e0[0] = 1.0f;
    hadamard_ref(e0, n);
    const auto expected = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
    for (float v : e0) ASSERT_EQ(v, expected) << n;
  }
}

}  // namespace hadamard_test
}  // namespace dz::kernels
