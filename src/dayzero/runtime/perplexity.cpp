#include "dayzero/runtime/perplexity.h"

#include <algorithm>
#include <cmath>

#include "dayzero/core/check.h"

namespace dz::runtime {

Result<std::vector<TokenWindow>> split_windows(int64_t num_tokens, int64_t context,
                                               int64_t max_windows) {
  if (context < 1)
    return make_error(StatusCode::kInvalidArgument, "the window size must be >= 1, got {}",
                      context);
  int64_t count = num_tokens / context;
  if (count == 0)
    return make_error(StatusCode::kInvalidArgument,
                      "{} tokens are fewer than one window of {} tokens", num_tokens, context);
  if (max_windows > 0) count = std::min(count, max_windows);
  std::vector<TokenWindow> windows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    windows[static_cast<size_t>(i)] = {.begin = i * context, .num_tokens = context};
  return windows;
}

double token_nll(std::span<const float> logits, int32_t target) {
  DZ_CHECK(target >= 0 && static_cast<size_t>(target) < logits.size());
  double max_logit = -INFINITY;
  for (float x : logits) max_logit = std::max(max_logit, double(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - max_logit);
  // −log(e^(x_t − m) / Σ e^(x − m)) = log Σ e^(x − m) − (x_t − m).
  return std::log(sum) - (double(logits[static_cast<size_t>(target)]) - max_logit);
}

double sum_nll(std::span<const float> logits, int64_t vocab, std::span<const int32_t> targets) {
  DZ_CHECK(vocab > 0 && logits.size() == targets.size() * static_cast<size_t>(vocab));
  double total = 0;
  for (size_t r = 0; r < targets.size(); ++r)
    total += token_nll(logits.subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
                       targets[r]);
  return total;
}

double PerplexitySummary::perplexity() const {
  return std::exp(mean_nll());
}

}  // namespace dz::runtime
