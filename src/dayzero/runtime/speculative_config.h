#pragma once
// Speculative decoding's configuration (docs/serving.md §4), parsed from vLLM's
// --speculative-config JSON: {"method": "ngram" | "mtp", "num_speculative_tokens": k,
// "prompt_lookup_min": n, "prompt_lookup_max": n, "disable_by_batch_size": b}.

#include <cstdint>
#include <string_view>

#include "dayzero/core/status.h"
#include "dayzero/runtime/ngram_proposer.h"

namespace dz::runtime {

enum class SpeculativeMethod : uint8_t { kNone, kNgram, kMtp };

struct SpeculativeConfig {
  SpeculativeMethod method = SpeculativeMethod::kNone;
  // ngram.num_speculative_tokens is k for every method; min_n / max_n are n-gram only.
  NgramConfig ngram;
  // No drafts in a step whose running requests exceed this many: a large batch is compute-bound
  // on a CPU and verifying k more tokens per request costs more than it saves.
  int64_t disable_by_batch_size = 8;

  bool enabled() const { return method != SpeculativeMethod::kNone; }
  int64_t num_speculative_tokens() const { return ngram.num_speculative_tokens; }
};

// The config of the JSON text; kInvalidArgument naming the key for bad JSON, an unknown key or
// method, or a value out of range. An empty text is speculation off.
Result<SpeculativeConfig> parse_speculative_config(std::string_view json_text);

std::string_view method_name(SpeculativeMethod method);

}  // namespace dz::runtime
