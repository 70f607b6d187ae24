#include "dayzero/model/vision/vision_encoder.h"

namespace dz::model {

Result<ProcessedImage> VisionEncoder::process(std::span<const uint8_t> bytes,
                                              const formats::ImageLimits& limits) const {
  DZ_ASSIGN_OR_RETURN(formats::DecodedImage image, formats::decode_image(bytes, limits));
  DZ_ASSIGN_OR_RETURN(ResizePlan plan, plan_resize(image.width, image.height, processor_));
  return preprocess_image(image, plan, processor_);
}

}  // namespace dz::model
