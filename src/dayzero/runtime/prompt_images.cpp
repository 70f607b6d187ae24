#include "dayzero/runtime/prompt_images.h"

#include <algorithm>

#include "dayzero/model/vision/image_processor.h"

namespace dz::runtime {

Result<ImageUpload> inspect_image(std::shared_ptr<const std::string> data,
                                  const model::ImageProcessorConfig& processor,
                                  const formats::ImageLimits& limits) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(data->data());
  DZ_ASSIGN_OR_RETURN(formats::DecodedImage image,
                      formats::decode_image(std::span(bytes, data->size()), limits));
  DZ_ASSIGN_OR_RETURN(model::ResizePlan plan,
                      model::plan_resize(image.width, image.height, processor));
  return ImageUpload{
      .width = image.width,
      .height = image.height,
      .num_tokens = plan.num_tokens,
      .hash = cache::image_content_hash(image.width, image.height, image.channels, image.pixels),
      .data = std::move(data)};
}

Result<std::vector<PromptImage>> expand_image_placeholders(std::vector<int32_t>& prompt,
                                                           int32_t placeholder,
                                                           std::span<const ImageUpload> uploads) {
  const auto found = static_cast<size_t>(std::count(prompt.begin(), prompt.end(), placeholder));
  if (found != uploads.size())
    return make_error(StatusCode::kInvalidArgument,
                      "the prompt holds {} image placeholders for {} images", found,
                      uploads.size());
  std::vector<int32_t> out;
  std::vector<PromptImage> images;
  size_t next = 0;
  for (const int32_t token : prompt) {
    if (token != placeholder) {
      out.push_back(token);
      continue;
    }
    const ImageUpload& upload = uploads[next++];
    images.push_back({.offset = static_cast<int64_t>(out.size()),
                      .num_tokens = upload.num_tokens,
                      .hash = upload.hash,
                      .data = upload.data});
    out.insert(out.end(), static_cast<size_t>(upload.num_tokens), placeholder);
  }
  prompt = std::move(out);
  return images;
}

}  // namespace dz::runtime
