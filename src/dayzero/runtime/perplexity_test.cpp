#include "dayzero/runtime/perplexity.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace dz::runtime {
namespace perplexity_test {

std::vector<float> random_logits(size_t count, uint32_t seed, float stddev, float offset) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(offset, stddev);
  std::vector<float> logits(count);
  for (float& v : logits) v = dist(rng);
  return logits;
}

// The textbook form, no max shift: −log(e^(x_t) / Σ e^(x)) in long double (whose exp holds
// e^11000, so logits near 1000 need no shift).
double reference_nll(std::span<const float> logits, int32_t target) {
  long double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<long double>(x));
  return static_cast<double>(
      -std::log(std::exp(static_cast<long double>(logits[static_cast<size_t>(target)])) / sum));
}

TEST(TokenNll, MatchesReferenceOnRandomLogits) {
  std::mt19937 rng(7);
  for (int64_t vocab : {2, 17, 1000, 4096}) {
    for (float offset : {0.0f, -30.0f, 900.0f}) {
      for (float stddev : {0.5f, 4.0f}) {
        const auto logits =
            random_logits(static_cast<size_t>(vocab), static_cast<uint32_t>(rng()), stddev, offset);
        std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(vocab - 1));
        for (int trial = 0; trial < 4; ++trial) {
          const int32_t target = pick(rng);
          const double expected = reference_nll(logits, target);
          const double got = token_nll(logits, target);
          EXPECT_NEAR(got, expected, 1e-9 * std::abs(expected))
              << "vocab " << vocab << " offset " << offset << " stddev " << stddev;
          EXPECT_GT(got, 0.0);
        }
      }
    }
  }
}

TEST(SumNll, IsTheSumOfRowNlls) {
  constexpr int32_t kVocab = 333;
  const int64_t vocab = kVocab;
  const size_t rows = 25;
  const auto logits = random_logits(rows * kVocab, 11, 3.0f, 1.5f);
  std::mt19937 rng(12);
  std::uniform_int_distribution<int32_t> pick(0, kVocab - 1);
  std::vector<int32_t> targets(rows);
  for (int32_t& t : targets) t = pick(rng);
  double expected = 0;
  for (size_t r = 0; r < rows; ++r)
    expected +=
        reference_nll(std::span<const float>(logits).subspan(r * kVocab, kVocab), targets[r]);
  EXPECT_NEAR(sum_nll(logits, vocab, targets), expected, 1e-9 * expected);
  EXPECT_EQ(sum_nll({}, vocab, {}), 0.0);
}

TEST(SumNll, UniformLogitsGiveLogVocab) {
  const std::vector<float> logits(2 * 50, 0.25f);
  const std::vector<int32_t> targets = {3, 49};
  EXPECT_NEAR(sum_nll(logits, 50, targets), 2 * std::log(50.0), 1e-12);
}

TEST(SplitWindows, ConsecutiveFullWindowsTailDropped) {
  auto windows = split_windows(10, 3);
  ASSERT_TRUE(windows.ok()) << windows.status().to_string();
  EXPECT_EQ(*windows, (std::vector<TokenWindow>{{0, 3}, {3, 3}, {6, 3}}));
  windows = split_windows(9, 3);
  ASSERT_TRUE(windows.ok());
  EXPECT_EQ(*windows, (std::vector<TokenWindow>{{0, 3}, {3, 3}, {6, 3}}));
  windows = split_windows(5, 5);
  ASSERT_TRUE(windows.ok());
  EXPECT_EQ(*windows, (std::vector<TokenWindow>{{0, 5}}));
}

TEST(SplitWindows, MaxWindowsKeepsTheFirst) {
  auto windows = split_windows(100, 10, 2);
  ASSERT_TRUE(windows.ok());
  EXPECT_EQ(*windows, (std::vector<TokenWindow>{{0, 10}, {10, 10}}));
  windows = split_windows(25, 10, 5);  // fewer windows than the cap
  ASSERT_TRUE(windows.ok());
  EXPECT_EQ(windows->size(), 2u);
}

TEST(SplitWindows, RefusesTooFewTokensAndBadContext) {
  auto windows = split_windows(4, 5);
  ASSERT_FALSE(windows.ok());
  EXPECT_EQ(windows.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(windows.status().message().find("4 tokens are fewer than one window of 5 tokens"),
            std::string::npos)
      << windows.status().message();
  windows = split_windows(4, 0);
  ASSERT_FALSE(windows.ok());
  EXPECT_NE(windows.status().message().find("window size must be >= 1, got 0"), std::string::npos);
}

TEST(PerplexitySummary, ExpOfMeanNll) {
  PerplexitySummary summary{.num_windows = 2, .num_predicted = 8, .nll_sum = 8 * std::log(20.0)};
  EXPECT_NEAR(summary.mean_nll(), std::log(20.0), 1e-12);
  EXPECT_NEAR(summary.perplexity(), 20.0, 1e-9);
}

}  // namespace perplexity_test
}  // namespace dz::runtime
