#include "dayzero/runtime/sampler.h"

#include <cmath>
#include <random>

#include <gtest/gtest.h>

namespace dz::runtime {
namespace {

std::vector<float> random_logits(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> logits(count);
  for (float& v : logits) v = dist(rng);
  return logits;
}

std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

std::vector<double> frequencies(Sampler& sampler, const std::vector<float>& logits, int draws) {
  std::vector<double> counts(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) counts[static_cast<size_t>(sampler.sample(logits))] += 1;
  for (double& c : counts) c /= draws;
  return counts;
}

TEST(Sampler, GreedyPicksTheArgmaxWithTiesToTheLowerId) {
  std::vector<float> logits = random_logits(257, 1);
  size_t best = 0;
  for (size_t i = 0; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  Sampler greedy({.temperature = 0.0f, .seed = 7});
  EXPECT_EQ(greedy.sample(logits), static_cast<int32_t>(best));
  logits[200] = logits[best];
  logits[3] = logits[best];
  EXPECT_EQ(greedy.sample(logits), 3);
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits = random_logits(64, 2);
  Sampler a({.temperature = 1.0f, .top_p = 0.9f, .seed = 42});
  Sampler b({.temperature = 1.0f, .top_p = 0.9f, .seed = 42});
  Sampler c({.temperature = 1.0f, .top_p = 0.9f, .seed = 43});
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 200; ++i) {
    ta.push_back(a.sample(logits));
    tb.push_back(b.sample(logits));
    tc.push_back(c.sample(logits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

// Frequencies over 40000 draws: the standard error of p = 0.4 is 0.0025, so 0.015 is 6 sigma.
constexpr int kDraws = 40000;
constexpr double kFreqTolerance = 0.015;

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  Sampler sampler({.temperature = 1.0f, .top_p = 1.0f, .seed = 3});
  std::vector<double> freq = frequencies(sampler, log_probs(probs), kDraws);
  for (size_t i = 0; i < probs.size(); ++i) EXPECT_NEAR(freq[i], probs[i], kFreqTolerance) << i;
}

TEST(Sampler, TemperatureSharpens) {
  // T = 0.5 squares the probabilities before renormalising: 1, 4, 9, 16 over 30.
  std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  Sampler sampler({.temperature = 0.5f, .top_p = 1.0f, .seed = 4});
  std::vector<double> freq = frequencies(sampler, log_probs(probs), kDraws);
  for (size_t i = 0; i < probs.size(); ++i)
    EXPECT_NEAR(freq[i], probs[i] * probs[i] / 0.3, kFreqTolerance) << i;
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // Sorted 0.4, 0.3, 0.2, 0.1: mass 0.4 < 0.5, then 0.7 >= 0.5 → ids 3 and 2, as 4/7 and 3/7.
  std::vector<double> probs = {0.1, 0.2, 0.3, 0.4};
  Sampler sampler({.temperature = 1.0f, .top_p = 0.5f, .seed = 5});
  std::vector<double> freq = frequencies(sampler, log_probs(probs), kDraws);
  EXPECT_EQ(freq[0], 0.0);
  EXPECT_EQ(freq[1], 0.0);
  EXPECT_NEAR(freq[2], 3.0 / 7.0, kFreqTolerance);
  EXPECT_NEAR(freq[3], 4.0 / 7.0, kFreqTolerance);
}

TEST(Sampler, TinyTopPIsGreedy) {
  std::vector<float> logits = random_logits(100, 6);
  Sampler greedy({.temperature = 0.0f});
  Sampler nucleus({.temperature = 0.8f, .top_p = 1e-6f, .seed = 9});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(nucleus.sample(logits), greedy.sample(logits));
}

TEST(Sampler, NegativeInfinityIsNeverDrawn) {
  std::vector<float> logits = random_logits(16, 7);
  for (size_t i = 0; i < logits.size(); i += 2) logits[i] = -INFINITY;
  Sampler sampler({.temperature = 1.5f, .top_p = 1.0f, .seed = 11});
  for (int i = 0; i < 2000; ++i) EXPECT_EQ(sampler.sample(logits) % 2, 1);
}

TEST(Sampler, ValidationNamesTheField) {
  EXPECT_EQ(validate_sampling_params({.temperature = -0.5f}).message(),
            "temperature must be a finite number >= 0, got -0.5");
  EXPECT_EQ(validate_sampling_params({.temperature = 1.0f, .top_p = 0.0f}).message(),
            "top_p must be in (0, 1], got 0");
  EXPECT_EQ(validate_sampling_params({.temperature = 1.0f, .top_p = 1.5f}).message(),
            "top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(validate_sampling_params({.temperature = NAN}).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(validate_sampling_params({.temperature = 0.7f, .top_p = 0.95f}).ok());
}

}  // namespace
}  // namespace dz::runtime
