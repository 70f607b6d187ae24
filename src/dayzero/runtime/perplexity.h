#pragma once
// The arithmetic of `dayzero perplexity` (llama-perplexity style), apart from the model: how a
// token stream splits into evaluation windows, and the negative log-likelihood of targets under
// logits.

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::runtime {

// One evaluation window: tokens [begin, begin + num_tokens) of the stream.
struct TokenWindow {
  int64_t begin = 0;
  int64_t num_tokens = 0;

  bool operator==(const TokenWindow&) const = default;
};

// Consecutive, non-overlapping windows of exactly `context` tokens from the start of a stream of
// `num_tokens`; a shorter tail is dropped. max_windows > 0 keeps only the first max_windows.
// kInvalidArgument when context < 1, or when the stream is shorter than one window (the message
// names both counts).
Result<std::vector<TokenWindow>> split_windows(int64_t num_tokens, int64_t context,
                                               int64_t max_windows = 0);

// −log softmax(logits)[target] for one row logits [vocab], in double throughout (max-shifted
// log-sum-exp). target must be in [0, vocab).
double token_nll(std::span<const float> logits, int32_t target);

// Σ_r token_nll(logits[r], targets[r]) over rows of logits [targets.size(), vocab].
double sum_nll(std::span<const float> logits, int64_t vocab, std::span<const int32_t> targets);

// The totals a perplexity run reports: exp(mean NLL) in nats.
struct PerplexitySummary {
  int64_t num_windows = 0;
  int64_t num_predicted = 0;
  double nll_sum = 0;
  double mean_nll() const { return num_predicted > 0 ? nll_sum / double(num_predicted) : 0.0; }
  double perplexity() const;
};

}  // namespace dz::runtime
