#pragma once
// Prompt lookup (vLLM's speculative method "ngram", docs/serving.md §4): a sequence's drafts are
// the tokens that followed the most recent earlier occurrence of its last n tokens, for the largest
// n in [min_n, max_n] that occurs; no model work. Used by speculative decoding (issue 21).

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::runtime {

struct NgramConfig {
  int32_t min_n = 1;  // prompt_lookup_min
  int32_t max_n = 4;  // prompt_lookup_max
  int32_t num_speculative_tokens = 3;
};

// kInvalidArgument naming the field: 1 <= min_n <= max_n, num_speculative_tokens >= 1.
Status validate_ngram_config(const NgramConfig& config);

// Up to num_speculative_tokens drafts for `tokens` (prompt then output), fewer when the match is
// followed by fewer tokens, none when no suffix of length >= min_n occurs earlier. O(len · max_n).
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, const NgramConfig& config);

}  // namespace dz::runtime
