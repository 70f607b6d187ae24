#pragma once
// What a frontend needs to accept images for a checkpoint without loading its weights
// (docs/vision.md §4): the image processor's settings and the placeholder token the prompt holds
// one of per image. The model loader reads the processor's settings through the same function.

#include <cstdint>
#include <optional>
#include <string>

#include "dayzero/core/status.h"
#include "dayzero/model/vision/vision_config.h"

namespace dz::model {

struct ImageInputConfig {
  ImageProcessorConfig processor;
  int32_t placeholder_token_id = 0;  // config.json media_placeholder_token_id
};

// preprocessor_config.json of `model_dir`, which must exist beside a vision tower; its patch size
// must be the tower's.
Result<ImageProcessorConfig> load_image_processor_config(const std::string& model_dir,
                                                         int64_t tower_patch_size);

// nullopt when config.json has no top-level vision_config (a text-only model).
Result<std::optional<ImageInputConfig>> load_image_input_config(const std::string& model_dir);

}  // namespace dz::model
