#pragma once
// Turns one row of logits into a token (serving.md, sampling): greedy at temperature 0, otherwise
// temperature-scaled softmax restricted to the top-p nucleus, drawn from a seeded RNG that the
// sampler owns (style.md §16: no global RNG), so that a seed reproduces a completion.

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::runtime {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float top_p = 1.0f;        // (0, 1]: smallest set of most probable tokens with this mass
  uint64_t seed = 0;
};

// kInvalidArgument naming the field for a negative or non-finite temperature or top_p outside
// (0, 1].
Status validate_sampling_params(const SamplingParams& params);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // params must validate

  // Greedy: the largest logit, ties to the lower id. Otherwise p = softmax(logits / T) in FP64;
  // tokens sorted by p descending (ties to the lower id) are kept until their mass reaches top_p
  // (at least one), renormalised, and one is drawn with a uniform from the sampler's RNG.
  int32_t sample(std::span<const float> logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<int32_t> order_;  // reused across calls
  std::vector<double> probs_;
};

}  // namespace dz::runtime
