#pragma once
// Images to the vision tower's input as Kimi-K3's published processor makes it (docs/vision.md §2):
// the resize plan (in_patch_limit, patch_limit_on_one_side, and K3's loop that lowers the limit
// until the tokens fit), Pillow's resampling (bicubic; nearest for palette images, as Pillow
// forces), transparent pixels composited onto the chessboard after the resize, zero padding on
// the right and bottom to multiples of 28, (x/255 − mean)/std, and 14 × 14 patches.

#include <cstdint>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/formats/image_decode.h"
#include "dayzero/model/vision/vision_config.h"

namespace dz::model {

struct ResizePlan {
  int64_t new_width = 0;
  int64_t new_height = 0;
  int64_t pad_width = 0;   // zeros on the right
  int64_t pad_height = 0;  // and at the bottom
  int64_t num_tokens = 0;  // after the 2 × 2 merge
};

// The processor's plan for an image of width × height (K3's loop included).
Result<ResizePlan> plan_resize(int64_t width, int64_t height, const ImageProcessorConfig& config);

struct ProcessedImage {
  int64_t width = 0;  // as uploaded: the prompt names this size
  int64_t height = 0;
  int64_t grid_height = 0;  // patches down and across (before merging)
  int64_t grid_width = 0;
  int64_t num_tokens = 0;           // grid_height · grid_width / 4
  std::vector<float> pixel_values;  // [grid_height · grid_width, 3 · p · p], (c, y, x) in a patch

  int64_t num_patches() const { return grid_height * grid_width; }
};

ProcessedImage preprocess_image(const formats::DecodedImage& image, const ResizePlan& plan,
                                const ImageProcessorConfig& config);

// "<|media_begin|>image {W}x{H}<|media_content|><|media_pad|><|media_end|>": K3's text for one
// image, whose single pad the engine widens to the image's tokens.
std::string k3_image_prompt(int64_t width, int64_t height);

}  // namespace dz::model
