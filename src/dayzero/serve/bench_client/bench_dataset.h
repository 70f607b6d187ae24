#pragma once
// The prompts and the arrival times of a `dayzero bench serve` run, from a seed:
//  - "random" (vLLM's RandomDataset): input and output lengths drawn uniformly from
//    [⌊L·(1 − r)⌋, ⌈L·(1 + r)⌉] (at least 1), prompt ids drawn uniformly from `allowed_ids`;
//  - "prefix-repetition" (vLLM's PrefixRepetitionRandomDataset): `num_prefixes` random prefixes of
//    `prefix_len` tokens, request i takes prefix i mod num_prefixes plus its own random suffix of
//    `input_len` tokens, then the order is shuffled. Every repeat of a prefix can hit the cache.
// Prompts are token ids, sent as such to /v1/completions: their length is then exact, with no
// detokenize/retokenize drift.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/serve/bench_client/bench_types.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::serve {

struct DatasetOptions {
  std::string name = "random";  // "random" or "prefix-repetition"
  int64_t num_prompts = 0;
  int64_t input_len = 0;   // random: prompt tokens; prefix-repetition: suffix tokens
  int64_t output_len = 0;  // max_tokens
  double range_ratio = 0;  // random only, in [0, 1)
  int64_t prefix_len = 0;
  int64_t num_prefixes = 1;
  uint64_t seed = 0;
};

// Fails (kInvalidArgument, naming the option) on an unknown dataset, a non-positive count or
// length, a range ratio outside [0, 1), or an empty `allowed_ids`.
Result<std::vector<BenchRequest>> make_dataset(const DatasetOptions& options,
                                               std::span<const int32_t> allowed_ids);

// The ids of [0, vocab_size) that are not special tokens of `tokenizer` (all of them when null).
std::vector<int32_t> prompt_token_ids(int32_t vocab_size, const Tokenizer* tokenizer);

// Fills prompt_text with the decoded ids (for /v1/chat/completions). Bytes that are not valid
// UTF-8 on their own are replaced with U+FFFD so the JSON body is valid.
void decode_prompts(std::vector<BenchRequest>& requests, const Tokenizer& tokenizer);

// Send times in seconds from the start, as vLLM's get_request: gaps drawn from a gamma
// distribution of shape `burstiness` and mean 1/rate (exponential, i.e. Poisson arrivals, at 1),
// cumulated and rescaled so the last arrival is at n/rate; all 0 when rate is infinite.
std::vector<double> arrival_times(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace dz::serve
