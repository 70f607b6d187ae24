#pragma once
// Turns one row of logits into a token with the whole parameter table of docs/serving.md §3, in its
// fixed order on the FP32 logits:
//   raw log-softmax (kept for logprobs) → logit_bias → min_tokens mask (EOS and stop ids) →
//   repetition penalty (prompt + output), then presence/frequency (output) → temperature (or the
//   greedy exit below 1e-5) → top-k → top-p → min-p → renormalise → draw.
// The draw uses one Philox uniform keyed by (seed, choice index, output position) and walks the
// inverse CDF in token-id order over the kept tokens, so a token depends only on (seed, choice,
// position, logits, history) and never on batch composition or on earlier calls.

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::runtime {

inline constexpr float kGreedyTemperature = 1e-5f;  // below: argmax
inline constexpr int32_t kMaxTopLogprobs = 20;      // OpenAI chat's cap
inline constexpr float kMaxLogitBias = 100.0f;

struct SamplingParams {
  float temperature = 0.0f;         // < 1e-5: greedy
  float top_p = 1.0f;               // (0, 1]: smallest set of most probable tokens with this mass
  int32_t top_k = 0;                // <= 0: off (-1 accepted, as vLLM)
  float min_p = 0.0f;               // [0, 1]: keep p >= min_p * p_max; 0: off
  float repetition_penalty = 1.0f;  // > 0; 1: off; over prompt + output
  float presence_penalty = 0.0f;    // [-2, 2]; over output
  float frequency_penalty = 0.0f;   // [-2, 2]; over output
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // token id → bias in [-100, 100]
  uint64_t seed = 0;
  int64_t min_tokens = 0;  // EOS and stop ids masked while fewer tokens were generated
  std::vector<int32_t> stop_token_ids = {};
  bool ignore_eos = false;   // EOS neither stops nor is masked by min_tokens
  bool logprobs = false;     // return the chosen token's raw log-prob
  int32_t top_logprobs = 0;  // [0, 20]: also the most likely tokens of the raw distribution
  std::vector<std::string> stop = {};  // stop strings (stop_strings.h)
  bool include_stop_str_in_output = false;
};

// kInvalidArgument naming the field for any value outside the ranges above (vLLM's). vocab_size > 0
// also checks that logit_bias and stop_token_ids ids are in [0, vocab_size).
Status validate_sampling_params(const SamplingParams& params, int64_t vocab_size = 0);

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;                    // raw log-softmax of the chosen token (if asked)
  std::vector<TokenLogprob> top_logprobs;  // most likely first, ties to the lower id
};

class Sampler {
 public:
  // params must validate; eos_token_ids are the checkpoint's (generation_config.json).
  Sampler(const SamplingParams& params, std::span<const int32_t> eos_token_ids = {},
          uint32_t choice_index = 0);

  // position: the number of tokens generated before this one (0 for the first). prompt_ids and
  // output_ids (the generated ones) feed the penalties; they may be empty when no penalty is set.
  SampleResult sample(std::span<const float> logits, int64_t position,
                      std::span<const int32_t> prompt_ids = {},
                      std::span<const int32_t> output_ids = {});

  // The logits after logit_bias, the min_tokens mask and the penalties (before temperature): what
  // sample() draws from; valid until the next call.
  std::span<const float> process(std::span<const float> logits, int64_t position,
                                 std::span<const int32_t> prompt_ids = {},
                                 std::span<const int32_t> output_ids = {});

  // Whether token ends the completion with finish reason "stop": a stop id, or EOS unless
  // ignore_eos.
  bool is_stop_token(int32_t token) const;

  const SamplingParams& params() const { return params_; }

 private:
  void apply_penalties(std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids);
  int32_t draw(int64_t position);

  SamplingParams params_;
  std::vector<int32_t> stop_ids_;  // stop ids, plus EOS unless ignore_eos; sorted
  uint32_t choice_index_;
  // Scratch reused across calls.
  std::vector<float> logits_;
  std::vector<double> probs_;
  std::vector<int32_t> order_;
  std::vector<uint8_t> kept_;
  std::vector<int32_t> counts_;
};

}  // namespace dz::runtime
