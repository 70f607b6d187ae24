#include "dayzero/runtime/ngram_proposer.h"

#include <algorithm>

namespace dz::runtime {

Status validate_ngram_config(const NgramConfig& c) {
  if (c.min_n < 1)
    return make_error(StatusCode::kInvalidArgument, "prompt_lookup_min: {} (want >= 1)", c.min_n);
  if (c.max_n < c.min_n)
    return make_error(StatusCode::kInvalidArgument,
                      "prompt_lookup_max: {} (want >= prompt_lookup_min {})", c.max_n, c.min_n);
  if (c.num_speculative_tokens < 1)
    return make_error(StatusCode::kInvalidArgument, "num_speculative_tokens: {} (want >= 1)",
                      c.num_speculative_tokens);
  return Status::ok_status();
}

std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, const NgramConfig& config) {
  const auto len = static_cast<int64_t>(tokens.size());
  const int64_t max_n = std::min<int64_t>(config.max_n, len - 1);
  int64_t best_n = 0, best_end = -1;  // the match ends at best_end (its last token)
  // Candidate ends from the most recent back: a later one wins ties, a longer one always.
  for (int64_t end = len - 2; end >= 0 && best_n < max_n; --end) {
    int64_t n = 0;
    while (n < max_n && n <= end &&
           tokens[static_cast<size_t>(end - n)] == tokens[static_cast<size_t>(len - 1 - n)])
      ++n;
    if (n > best_n) {
      best_n = n;
      best_end = end;
    }
  }
  if (best_n < config.min_n) return {};
  const int64_t first = best_end + 1;
  const int64_t count = std::min<int64_t>(config.num_speculative_tokens, len - first);
  return {tokens.begin() + first, tokens.begin() + first + count};
}

}  // namespace dz::runtime
