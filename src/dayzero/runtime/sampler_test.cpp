#include "dayzero/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include <gtest/gtest.h>

namespace dz::runtime {
namespace sampler_test {

std::vector<float> random_logits(size_t count, uint32_t seed, float stddev = 2.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> logits(count);
  for (float& v : logits) v = dist(rng);
  return logits;
}

std::vector<float> log_probs(const std::vector<double>& probs) {
  std::vector<float> logits;
  for (double p : probs) logits.push_back(static_cast<float>(std::log(p)));
  return logits;
}

int32_t reference_argmax(const std::vector<float>& logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// An independent FP64 statement of temperature → top-k → top-p → min-p → renormalise.
std::vector<double> reference_probs(const std::vector<float>& logits, double temperature, int top_k,
                                    double top_p, double min_p) {
  const size_t n = logits.size();
  std::vector<double> p(n);
  double max_x = -INFINITY;
  for (float l : logits) max_x = std::max(max_x, l / temperature);
  for (size_t i = 0; i < n; ++i) p[i] = std::exp(logits[i] / temperature - max_x);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  if (top_k > 0)
    for (size_t r = static_cast<size_t>(top_k); r < n; ++r) p[order[r]] = 0;
  double total = std::accumulate(p.begin(), p.end(), 0.0);
  double mass = 0;
  bool reached = false;
  for (size_t r = 0; r < n; ++r) {
    if (reached) p[order[r]] = 0;
    mass += p[order[r]] / total;
    if (mass >= top_p) reached = true;
  }
  const double p_max = p[order[0]];
  for (double& v : p)
    if (v < min_p * p_max) v = 0;
  total = std::accumulate(p.begin(), p.end(), 0.0);
  for (double& v : p) v /= total;
  return p;
}

struct DrawStats {
  std::vector<double> counts;
  int num_draws = 0;
};

// Draws at output position 0 for seeds [0, num_draws): a fixed, reproducible seed range.
DrawStats draw_over_seeds(SamplingParams params, const std::vector<float>& logits, int num_draws,
                          std::span<const int32_t> output_ids = {}) {
  DrawStats stats{std::vector<double>(logits.size(), 0.0), num_draws};
  for (int s = 0; s < num_draws; ++s) {
    params.seed = static_cast<uint64_t>(s) * 0x9E3779B97F4A7C15ull;
    Sampler sampler(params);
    const auto position = static_cast<int64_t>(output_ids.size());
    stats.counts[static_cast<size_t>(sampler.sample(logits, position, {}, output_ids).token)] += 1;
  }
  return stats;
}

// Pearson chi-square of the draws against expected; tokens with probability 0 must never appear.
// The bound df + 6 sqrt(2 df) is about six standard deviations of the statistic.
void expect_follows(const DrawStats& stats, const std::vector<double>& expected) {
  double chi2 = 0;
  int df = -1;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(stats.counts[i], 0) << "token " << i << " is outside the kept set";
      continue;
    }
    const double e = expected[i] * stats.num_draws;
    chi2 += (stats.counts[i] - e) * (stats.counts[i] - e) / e;
    ++df;
  }
  if (df <= 0) return;
  EXPECT_LT(chi2, df + 6 * std::sqrt(2.0 * df)) << "df " << df;
}

constexpr int kDraws = 20000;

TEST(Sampler, GreedyPicksTheArgmaxWithTiesToTheLowerIdWhateverTheSeed) {
  std::vector<float> logits = random_logits(257, 1);
  const int32_t best = reference_argmax(logits);
  for (uint64_t seed : {0ull, 7ull, 123456789ull})
    for (float t : {0.0f, 9e-6f}) {
      Sampler greedy({.temperature = t, .seed = seed});
      EXPECT_EQ(greedy.sample(logits, 5).token, best);
    }
  logits[200] = logits[static_cast<size_t>(best)];
  logits[3] = logits[static_cast<size_t>(best)];
  Sampler greedy({.temperature = 0.0f});
  EXPECT_EQ(greedy.sample(logits, 0).token, 3);
}

TEST(Sampler, ADrawDependsOnlyOnSeedChoicePositionAndLogits) {
  const std::vector<float> logits = random_logits(64, 2);
  const std::vector<float> other = random_logits(64, 3);
  const SamplingParams params{.temperature = 1.0f, .top_p = 0.9f, .seed = 42};
  Sampler a(params);
  std::vector<int32_t> forward;
  for (int64_t pos = 0; pos < 200; ++pos) forward.push_back(a.sample(logits, pos).token);
  // Another sampler visits the positions backwards with unrelated calls in between.
  Sampler b(params);
  for (int64_t pos = 199; pos >= 0; --pos) {
    b.sample(other, pos + 7);
    EXPECT_EQ(b.sample(logits, pos).token, forward[static_cast<size_t>(pos)]) << pos;
  }
  std::vector<int32_t> other_seed, other_choice;
  Sampler c({.temperature = 1.0f, .top_p = 0.9f, .seed = 43});
  Sampler d(params, {}, /*choice_index=*/1);
  for (int64_t pos = 0; pos < 200; ++pos) {
    other_seed.push_back(c.sample(logits, pos).token);
    other_choice.push_back(d.sample(logits, pos).token);
  }
  EXPECT_NE(forward, other_seed);
  EXPECT_NE(forward, other_choice);
}

TEST(Sampler, TemperatureOneFollowsTheSoftmax) {
  const std::vector<float> logits = random_logits(12, 4, 1.0f);
  expect_follows(draw_over_seeds({.temperature = 1.0f}, logits, kDraws),
                 reference_probs(logits, 1.0, 0, 1.0, 0.0));
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  const std::vector<float> logits = random_logits(12, 5, 1.0f);
  for (float t : {0.5f, 1.7f})
    expect_follows(draw_over_seeds({.temperature = t}, logits, kDraws),
                   reference_probs(logits, t, 0, 1.0, 0.0));
}

TEST(Sampler, TopKKeepsTheKMostLikely) {
  const std::vector<float> logits = random_logits(40, 6, 1.0f);
  for (int k : {1, 5, 40, 100})
    expect_follows(draw_over_seeds({.temperature = 1.0f, .top_k = k}, logits, kDraws),
                   reference_probs(logits, 1.0, k, 1.0, 0.0));
  expect_follows(draw_over_seeds({.temperature = 1.0f, .top_k = -1}, logits, kDraws),
                 reference_probs(logits, 1.0, 0, 1.0, 0.0));
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  // Sorted 0.4, 0.3, 0.2, 0.1: mass 0.4 < 0.5, then 0.7 >= 0.5 → ids 3 and 2, as 4/7 and 3/7.
  const std::vector<float> small = log_probs({0.1, 0.2, 0.3, 0.4});
  expect_follows(draw_over_seeds({.temperature = 1.0f, .top_p = 0.5f}, small, kDraws),
                 {0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0});
  const std::vector<float> logits = random_logits(40, 7, 1.0f);
  for (float p : {0.3f, 0.8f, 0.95f})
    expect_follows(draw_over_seeds({.temperature = 0.8f, .top_p = p}, logits, kDraws),
                   reference_probs(logits, 0.8, 0, p, 0.0));
}

// A flat distribution over 2000 tokens: the nucleus holds over a thousand, past the first sorted
// prefix of the sampler. Draws must stay in the reference nucleus and reach beyond rank 256; the
// counts are compared in 16 bins of consecutive token ids.
TEST(Sampler, LargeNucleusOverAWideVocabulary) {
  const std::vector<float> logits = random_logits(2000, 16, 0.3f);
  const std::vector<double> expected = reference_probs(logits, 1.0, 0, 0.9, 0.0);
  const DrawStats stats = draw_over_seeds({.temperature = 1.0f, .top_p = 0.9f}, logits, 4000);
  std::vector<double> sorted_probs = expected;
  std::sort(sorted_probs.begin(), sorted_probs.end(), std::greater<>());
  const double rank_256_prob = sorted_probs[256];
  bool beyond_256 = false;
  DrawStats binned{std::vector<double>(16, 0.0), stats.num_draws};
  std::vector<double> binned_expected(16, 0.0);
  for (size_t i = 0; i < logits.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(stats.counts[i], 0) << i;
    }
    if (stats.counts[i] > 0 && expected[i] < rank_256_prob) beyond_256 = true;
    binned.counts[i * 16 / logits.size()] += stats.counts[i];
    binned_expected[i * 16 / logits.size()] += expected[i];
  }
  EXPECT_TRUE(beyond_256);
  expect_follows(binned, binned_expected);
}

TEST(Sampler, MinPKeepsTokensNearTheMostLikely) {
  const std::vector<float> logits = random_logits(40, 8, 1.0f);
  for (float m : {0.05f, 0.3f})
    expect_follows(draw_over_seeds({.temperature = 1.2f, .min_p = m}, logits, kDraws),
                   reference_probs(logits, 1.2, 0, 1.0, m));
}

TEST(Sampler, FiltersCombineAndKeepAtLeastOneToken) {
  const std::vector<float> logits = random_logits(40, 9, 1.0f);
  expect_follows(draw_over_seeds({.temperature = 0.9f, .top_p = 0.9f, .top_k = 10, .min_p = 0.1f},
                                 logits, kDraws),
                 reference_probs(logits, 0.9, 10, 0.9, 0.1));
  const int32_t best = reference_argmax(logits);
  for (const SamplingParams& params : {SamplingParams{.temperature = 0.8f, .top_p = 1e-6f},
                                       SamplingParams{.temperature = 0.8f, .min_p = 1.0f},
                                       SamplingParams{.temperature = 0.8f, .top_k = 1}}) {
    for (uint64_t seed = 0; seed < 50; ++seed) {
      SamplingParams seeded = params;
      seeded.seed = seed;
      Sampler sampler(seeded);
      EXPECT_EQ(sampler.sample(logits, 0).token, best);
    }
  }
}

// The fixed order: top-k before top-p. Probabilities 0.1, 0.2, 0.3, 0.4 with top_k = 2 leave
// 3/7 and 4/7, and top_p = 0.5 then keeps only id 3; top-p first would keep ids 2 and 3.
TEST(Sampler, TopKComesBeforeTopP) {
  const std::vector<float> logits = log_probs({0.1, 0.2, 0.3, 0.4});
  expect_follows(draw_over_seeds({.temperature = 1.0f, .top_p = 0.5f, .top_k = 2}, logits, 2000),
                 {0.0, 0.0, 0.0, 1.0});
}

// The fixed order: penalties before temperature. Logits (1.0, 0.6), token 0 generated once with
// presence 0.5, T = 0.5: softmax((0.5, 0.6) / 0.5) gives p0 = 0.4502; penalising after the
// temperature would give softmax(1.5, 1.2), p0 = 0.5744.
TEST(Sampler, PenaltiesComeBeforeTemperature) {
  const std::vector<float> logits = {1.0f, 0.6f};
  const std::vector<int32_t> output = {0};
  const double p0 = 1.0 / (1.0 + std::exp(0.2));
  expect_follows(
      draw_over_seeds({.temperature = 0.5f, .presence_penalty = 0.5f}, logits, kDraws, output),
      {p0, 1.0 - p0});
}

TEST(Sampler, LogitBiasAdds) {
  const std::vector<float> logits = random_logits(30, 10);
  Sampler sampler({.temperature = 1.0f, .logit_bias = {{4, 2.5f}, {7, -100.0f}}});
  std::span<const float> processed = sampler.process(logits, 0);
  for (size_t i = 0; i < logits.size(); ++i) {
    const float expected = logits[i] + (i == 4 ? 2.5f : i == 7 ? -100.0f : 0.0f);
    EXPECT_EQ(processed[i], expected) << i;
  }
  Sampler forced({.temperature = 0.0f, .logit_bias = {{11, 100.0f}}});
  EXPECT_EQ(forced.sample(logits, 0).token, 11);
}

TEST(Sampler, MinTokensMasksEosAndStopIdsUntilReached) {
  const std::vector<float> logits = random_logits(30, 11);
  const std::vector<int32_t> eos = {2, 9};
  Sampler sampler({.temperature = 1.0f, .min_tokens = 3, .stop_token_ids = {5}}, eos);
  for (int64_t pos = 0; pos < 5; ++pos) {
    std::span<const float> processed = sampler.process(logits, pos);
    for (size_t i = 0; i < logits.size(); ++i) {
      const bool masked = pos < 3 && (i == 2 || i == 9 || i == 5);
      if (masked)
        EXPECT_EQ(processed[i], -INFINITY) << pos << " " << i;
      else
        EXPECT_EQ(processed[i], logits[i]) << pos << " " << i;
    }
  }
  // A +100 bias on EOS does not escape the mask: bias comes first.
  Sampler biased({.temperature = 0.0f, .logit_bias = {{2, 100.0f}}, .min_tokens = 1}, eos);
  EXPECT_NE(biased.sample(logits, 0).token, 2);
  EXPECT_EQ(biased.sample(logits, 1).token, 2);
  EXPECT_TRUE(sampler.is_stop_token(2));
  EXPECT_TRUE(sampler.is_stop_token(5));
  EXPECT_FALSE(sampler.is_stop_token(3));
  // ignore_eos: EOS neither stops nor is masked; stop ids still are.
  Sampler ignoring(
      {.temperature = 1.0f, .min_tokens = 3, .stop_token_ids = {5}, .ignore_eos = true}, eos);
  std::span<const float> processed = ignoring.process(logits, 0);
  EXPECT_EQ(processed[2], logits[2]);
  EXPECT_EQ(processed[5], -INFINITY);
  EXPECT_FALSE(ignoring.is_stop_token(2));
  EXPECT_TRUE(ignoring.is_stop_token(5));
}

TEST(Sampler, RepetitionPenaltyFollowsHfOverPromptAndOutput) {
  std::vector<float> logits = random_logits(30, 12);
  logits[3] = 1.5f;
  logits[8] = -0.75f;
  const std::vector<int32_t> prompt = {3, 3, 8, 12};
  const std::vector<int32_t> output = {20, 3, 20};
  Sampler sampler({.temperature = 1.0f, .repetition_penalty = 1.3f});
  std::span<const float> processed = sampler.process(logits, 3, prompt, output);
  for (size_t i = 0; i < logits.size(); ++i) {
    const bool seen = i == 3 || i == 8 || i == 12 || i == 20;  // once each, however often seen
    const float expected = !seen ? logits[i] : logits[i] > 0 ? logits[i] / 1.3f : logits[i] * 1.3f;
    EXPECT_EQ(processed[i], expected) << i;
  }
  EXPECT_EQ(processed[3], 1.5f / 1.3f);
  EXPECT_EQ(processed[8], -0.75f * 1.3f);
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountOutputTokensOnly) {
  const std::vector<float> logits = random_logits(30, 13);
  const std::vector<int32_t> prompt = {1, 2, 4};
  const std::vector<int32_t> output = {4, 6, 4, 4, 9};
  Sampler sampler({.temperature = 1.0f, .presence_penalty = 0.5f, .frequency_penalty = -0.25f});
  std::span<const float> processed = sampler.process(logits, 5, prompt, output);
  for (size_t i = 0; i < logits.size(); ++i) {
    const auto count = static_cast<float>(std::count(output.begin(), output.end(), i));
    const float expected = count == 0 ? logits[i] : logits[i] - (0.5f + -0.25f * count);
    EXPECT_EQ(processed[i], expected) << i;
  }
}

// The fixed order among the logit steps, each case chosen so another order differs:
// bias before repetition: (-2 + 3) / 2 = 0.5, not -2 * 2 + 3 = -1;
// repetition before presence: 2 / 2 - 1 = 0, not (2 - 1) / 2 = 0.5.
TEST(Sampler, LogitStepsRunInTheFixedOrder) {
  const std::vector<float> logits = {-2.0f, 2.0f, 0.25f};
  Sampler sampler({.temperature = 1.0f,
                   .repetition_penalty = 2.0f,
                   .presence_penalty = 1.0f,
                   .logit_bias = {{0, 3.0f}}});
  const std::vector<int32_t> prompt = {0};
  const std::vector<int32_t> output = {1};
  std::span<const float> processed = sampler.process(logits, 1, prompt, output);
  EXPECT_EQ(processed[0], 0.5f);
  EXPECT_EQ(processed[1], 0.0f);
  EXPECT_EQ(processed[2], 0.25f);
}

TEST(Sampler, LogprobsAreTheRawLogSoftmax) {
  const std::vector<float> logits = random_logits(1000, 14);
  double max_logit = -INFINITY, sum = 0;
  for (float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
  for (float l : logits) sum += std::exp(l - max_logit);
  auto reference = [&](int32_t id) {
    return logits[static_cast<size_t>(id)] - max_logit - std::log(sum);
  };
  std::vector<int32_t> by_prob(logits.size());
  std::iota(by_prob.begin(), by_prob.end(), 0);
  std::stable_sort(by_prob.begin(), by_prob.end(), [&](int32_t a, int32_t b) {
    return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)];
  });
  // Temperature, filters, bias and penalties change the draw, never the reported distribution.
  Sampler sampler({.temperature = 0.7f,
                   .top_p = 0.9f,
                   .top_k = 50,
                   .repetition_penalty = 1.2f,
                   .logit_bias = {{17, 5.0f}},
                   .seed = 3,
                   .logprobs = true,
                   .top_logprobs = 5});
  const std::vector<int32_t> prompt = {by_prob[0], 17};
  constexpr double kTolerance = 2e-6;  // FP32 rounding of values around -10
  for (int64_t pos = 0; pos < 20; ++pos) {
    SampleResult r = sampler.sample(logits, pos, prompt);
    EXPECT_NEAR(r.logprob, reference(r.token), kTolerance);
    ASSERT_EQ(r.top_logprobs.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(r.top_logprobs[i].token, by_prob[i]);
      EXPECT_NEAR(r.top_logprobs[i].logprob, reference(by_prob[i]), kTolerance);
    }
  }
  Sampler greedy({.temperature = 0.0f, .logprobs = true});
  SampleResult g = greedy.sample(logits, 0);
  EXPECT_EQ(g.token, by_prob[0]);
  EXPECT_NEAR(g.logprob, reference(by_prob[0]), kTolerance);
  EXPECT_TRUE(g.top_logprobs.empty());
}

TEST(Sampler, NegativeInfinityIsNeverDrawn) {
  std::vector<float> logits = random_logits(16, 15);
  for (size_t i = 0; i < logits.size(); i += 2) logits[i] = -INFINITY;
  Sampler sampler({.temperature = 1.5f, .seed = 11});
  for (int64_t pos = 0; pos < 2000; ++pos) EXPECT_EQ(sampler.sample(logits, pos).token % 2, 1);
}

TEST(Sampler, ValidationNamesTheField) {
  auto message = [](const SamplingParams& p, int64_t vocab = 0) {
    return validate_sampling_params(p, vocab).message();
  };
  EXPECT_EQ(message({.temperature = -0.5f}), "temperature must be a finite number >= 0, got -0.5");
  EXPECT_EQ(validate_sampling_params({.temperature = NAN}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(message({.top_p = 0.0f}), "top_p must be in (0, 1], got 0");
  EXPECT_EQ(message({.top_p = 1.5f}), "top_p must be in (0, 1], got 1.5");
  EXPECT_EQ(message({.top_k = -2}), "top_k must be -1 or 0 (off) or a positive count, got -2");
  EXPECT_EQ(message({.min_p = 1.5f}), "min_p must be in [0, 1], got 1.5");
  EXPECT_EQ(message({.min_p = NAN}), "min_p must be in [0, 1], got nan");
  EXPECT_EQ(message({.repetition_penalty = 0.0f}),
            "repetition_penalty must be a finite number > 0, got 0");
  EXPECT_EQ(message({.presence_penalty = 2.5f}), "presence_penalty must be in [-2, 2], got 2.5");
  EXPECT_EQ(message({.frequency_penalty = -3.0f}), "frequency_penalty must be in [-2, 2], got -3");
  EXPECT_EQ(message({.logit_bias = {{3, 101.0f}}}),
            "logit_bias of token 3 must be in [-100, 100], got 101");
  EXPECT_EQ(message({.logit_bias = {{-1, 1.0f}}}),
            "logit_bias: token id -1 is outside the vocabulary [0, vocab_size)");
  EXPECT_EQ(message({.logit_bias = {{50, 1.0f}}}, 50),
            "logit_bias: token id 50 is outside the vocabulary [0, 50)");
  EXPECT_EQ(message({.min_tokens = -1}), "min_tokens must be >= 0, got -1");
  EXPECT_EQ(message({.stop_token_ids = {7, 64}}, 64),
            "stop_token_ids: token id 64 is outside the vocabulary [0, 64)");
  EXPECT_EQ(message({.top_logprobs = 21}), "top_logprobs must be in [0, 20], got 21");
  EXPECT_EQ(message({.stop = {"a", ""}}), "stop: stop strings must not be empty");
  EXPECT_TRUE(validate_sampling_params({.temperature = 0.7f,
                                        .top_p = 0.95f,
                                        .top_k = 40,
                                        .min_p = 0.05f,
                                        .repetition_penalty = 1.1f,
                                        .presence_penalty = -2.0f,
                                        .frequency_penalty = 2.0f,
                                        .logit_bias = {{0, -100.0f}, {49, 100.0f}},
                                        .min_tokens = 4,
                                        .stop_token_ids = {49},
                                        .top_logprobs = 20,
                                        .stop = {"\n\n"}},
                                       50)
                  .ok());
}

}  // namespace sampler_test
}  // namespace dz::runtime
