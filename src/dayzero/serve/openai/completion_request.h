#pragma once
// POST /v1/completions request (docs/serving.md §5.1–§5.2): one or more prompts, as text or token
// ids, plus the shared sampling fields.

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dayzero/serve/openai/api_error.h"
#include "dayzero/serve/openai/sampling_fields.h"

namespace dz::serve::openai {

// A text prompt (tokenized by the server) or token ids (non-empty; in the vocabulary when
// ParseLimits::vocab_size is set).
using CompletionPrompt = std::variant<std::string, std::vector<int32_t>>;

struct CompletionRequest {
  // logprobs k in 0..max_completion_logprobs sets sampling.logprobs and top_logprobs = k.
  SamplingFields fields = {};
  // "prompt": a string, a list of strings, a list of ids, or a list of id lists. Non-empty; each
  // choice's index is prompt_index * n + choice, as OpenAI numbers them.
  std::vector<CompletionPrompt> prompts = {};
  bool echo = false;  // the prompt text is prepended to each choice's text
};

// Parses and validates a completions request body. `suffix` (insertion) and `best_of` other than
// 1 give 400: dayzero does neither.
std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ParseLimits& limits);

}  // namespace dz::serve::openai
