// Image files from the network (docs/vision.md §1): decode_image must refuse or decode any bytes
// without a crash, a leak or undefined behaviour, and what it decodes must go through K3's plan and
// preprocessing. Limits small enough that a declared size cannot exhaust the fuzzer's memory.

#include <cstddef>
#include <cstdint>
#include <span>

#include "dayzero/formats/image_decode.h"
#include "dayzero/model/vision/image_processor.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const dz::formats::ImageLimits limits{
      .max_file_bytes = 1 << 20, .max_side = 2048, .max_pixels = 1 << 20, .min_side = 14};
  dz::Result<dz::formats::DecodedImage> image =
      dz::formats::decode_image(std::span(data, size), limits);
  if (!image.ok()) return 0;
  dz::model::ImageProcessorConfig config;
  config.in_patch_limit = 256;
  config.patch_limit_on_one_side = 32;
  config.transparent_background = dz::model::ImageProcessorConfig::Chessboard{};
  dz::Result<dz::model::ResizePlan> plan =
      dz::model::plan_resize(image->width, image->height, config);
  if (!plan.ok()) return 0;
  const dz::model::ProcessedImage processed = dz::model::preprocess_image(*image, *plan, config);
  return processed.num_tokens == plan->num_tokens ? 0 : 1;
}
