#pragma once
// What a completion needs from a checkpoint folder besides weights and tokenizer: the stop ids
// (eos_token_id of config.json, text_config when nested, and generation_config.json; an int or a
// list in either), whether to prepend BOS (tokenizer_config.json add_bos_token), and the sampling
// defaults of generation_config.json.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/runtime/sampler.h"

namespace dz::runtime {

struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;  // sorted, unique
  std::optional<int32_t> bos_token_id;
  bool add_bos_token = false;
  // Sampling defaults of generation_config.json, which the server applies to requests that leave
  // the field out (vLLM's `--generation-config auto`).
  std::optional<float> temperature;
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
};

// Which sampling fields a request (or the command line) set itself.
struct SamplingFieldsGiven {
  bool temperature = false;
  bool top_p = false;
  bool top_k = false;
  bool min_p = false;
  bool repetition_penalty = false;
};

// generation_config.json's sampling defaults for the fields not given: one rule for the server
// and `dayzero generate` (vLLM's `--generation-config auto`).
void apply_generation_defaults(SamplingParams& sampling, const SamplingFieldsGiven& given,
                               const GenerationDefaults& defaults);

// Missing generation_config.json / tokenizer_config.json are fine; malformed ones are refused
// naming the file and field.
Result<GenerationDefaults> load_generation_defaults(const std::string& model_dir);

}  // namespace dz::runtime
