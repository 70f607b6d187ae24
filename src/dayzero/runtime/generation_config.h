#pragma once
// What a completion needs from a checkpoint folder besides weights and tokenizer: the stop ids
// (eos_token_id of config.json, text_config when nested, and generation_config.json; an int or a
// list in either) and whether to prepend BOS (tokenizer_config.json add_bos_token).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::runtime {

struct GenerationDefaults {
  std::vector<int32_t> eos_token_ids;  // sorted, unique
  std::optional<int32_t> bos_token_id;
  bool add_bos_token = false;
};

// Missing generation_config.json / tokenizer_config.json are fine; malformed ones are refused
// naming the file and field.
Result<GenerationDefaults> load_generation_defaults(const std::string& model_dir);

}  // namespace dz::runtime
