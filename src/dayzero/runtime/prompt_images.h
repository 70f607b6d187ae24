#pragma once
// Images into a prompt (docs/vision.md §4), the part a frontend does before the engine sees the
// request: each file decoded (the limits checked on its header first), its token count planned as
// the model's processor will make it, its pixels hashed; then each image's one placeholder token
// in the tokenized prompt widened to that many.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dayzero/cache/prefix_hash.h"
#include "dayzero/core/status.h"
#include "dayzero/formats/image_decode.h"
#include "dayzero/model/vision/vision_config.h"
#include "dayzero/runtime/engine_types.h"

namespace dz::runtime {

struct ImageUpload {
  int64_t width = 0;  // as uploaded (K3's prompt text names this size)
  int64_t height = 0;
  int64_t num_tokens = 0;
  cache::BlockHash hash;  // of the decoded pixels: the same picture in another file hashes alike
  std::shared_ptr<const std::string> data;
};

// kInvalidArgument / kUnsupported name what is wrong with the image.
Result<ImageUpload> inspect_image(std::shared_ptr<const std::string> data,
                                  const model::ImageProcessorConfig& processor,
                                  const formats::ImageLimits& limits = {});

// Widens the i-th `placeholder` of `prompt` into uploads[i].num_tokens copies and returns the
// images placed over them; the prompt must hold exactly one placeholder per upload.
Result<std::vector<PromptImage>> expand_image_placeholders(std::vector<int32_t>& prompt,
                                                           int32_t placeholder,
                                                           std::span<const ImageUpload> uploads);

}  // namespace dz::runtime
