#pragma once
// Images given on the command line (`generate --image`, a prompts file's "images"): each file
// read and inspected, its K3 text put where the prompt has a "<|media_pad|>" or before it, and
// after tokenization the placeholders widened (runtime/prompt_images.h).

#include <span>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/runtime/prompt_images.h"

namespace dz::cli {

// Reads and inspects image files for `model` (which must have a vision tower).
Result<std::vector<runtime::ImageUpload>> load_images(const model::CausalLm& model,
                                                      std::span<const std::string> paths);

// The prompt text with the images: unchanged when it holds one "<|media_pad|>" per image, else
// (none) each image's "<|media_begin|>image WxH<|media_content|><|media_pad|><|media_end|>"
// first.
Result<std::string> text_with_images(const std::string& prompt,
                                     std::span<const runtime::ImageUpload> uploads);

// Widens the placeholders of `request.prompt_token_ids` and places the images.
Status place_images(const model::CausalLm& model, std::span<const runtime::ImageUpload> uploads,
                    runtime::GenerationRequest& request);

}  // namespace dz::cli
