#pragma once
// The JSONL input of `dayzero generate --prompts-file`: one JSON object per line, either
// {"prompt": "text"} or {"prompt_token_ids": [1, 2, 3]}, optionally "images": ["a.png", ...]
// (image files for a model with a vision tower, docs/vision.md §4), with optional per-line
// overrides of the
// command's sampling flags (max_tokens, temperature, top_p, top_k, min_p, seed, stop, priority,
// repetition_penalty, presence_penalty, frequency_penalty). Blank lines are skipped; anything
// else that is wrong (bad JSON, an unknown field, a value of the wrong type or out of range) is
// an error naming the line and the field.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/runtime/sampler.h"

namespace dz::cli {

struct PromptLine {
  int64_t line_number = 0;                // 1-based, in the file
  std::optional<std::string> prompt;      // text to tokenize, or
  std::vector<int32_t> prompt_token_ids;  // ids taken as they are (no BOS added)
  std::vector<std::string> images;        // image files, in the order of their placeholders
  runtime::SamplingParams sampling;       // the command's, with the line's overrides
  int64_t max_tokens = 16;
  int32_t priority = 0;
};

struct PromptDefaults {
  runtime::SamplingParams sampling;
  int64_t max_tokens = 16;
};

// Parses the text of a prompts file (`file_name` only names it in errors). Sampling parameters
// are checked with validate_sampling_params.
Result<std::vector<PromptLine>> parse_prompts(std::string_view text, std::string_view file_name,
                                              const PromptDefaults& defaults);
// Reads `path` and parses it.
Result<std::vector<PromptLine>> load_prompts_file(const std::string& path,
                                                  const PromptDefaults& defaults);

}  // namespace dz::cli
