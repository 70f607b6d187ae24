#include "dayzero/cli/prompt_images.h"

#include <fstream>
#include <iterator>
#include <memory>

#include "dayzero/model/vision/vision_encoder.h"

namespace dz::cli {
namespace {

constexpr std::string_view kMediaPad = "<|media_pad|>";

}  // namespace

Result<std::vector<runtime::ImageUpload>> load_images(const model::CausalLm& model,
                                                      std::span<const std::string> paths) {
  std::vector<runtime::ImageUpload> uploads;
  if (paths.empty()) return uploads;
  if (model.vision() == nullptr)
    return make_error(StatusCode::kInvalidArgument, "images: the model has no vision tower");
  for (const std::string& path : paths) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return make_error(StatusCode::kNotFound, "image {}: cannot open it", path);
    auto data = std::make_shared<const std::string>(std::istreambuf_iterator<char>(in),
                                                    std::istreambuf_iterator<char>());
    Result<runtime::ImageUpload> upload =
        runtime::inspect_image(std::move(data), model.vision()->processor());
    if (!upload.ok()) return upload.status().with_context("image " + path);
    uploads.push_back(std::move(*upload));
  }
  return uploads;
}

Result<std::string> text_with_images(const std::string& prompt,
                                     std::span<const runtime::ImageUpload> uploads) {
  if (uploads.empty()) return prompt;
  size_t pads = 0;
  for (size_t at = prompt.find(kMediaPad); at != std::string::npos;
       at = prompt.find(kMediaPad, at + 1))
    ++pads;
  if (pads == uploads.size()) return prompt;
  if (pads != 0)
    return make_error(StatusCode::kInvalidArgument,
                      "the prompt holds {} {} for {} images: one each, or none", pads, kMediaPad,
                      uploads.size());
  std::string text;
  for (const runtime::ImageUpload& upload : uploads)
    text += model::k3_image_prompt(upload.width, upload.height);
  return text + prompt;
}

Status place_images(const model::CausalLm& model, std::span<const runtime::ImageUpload> uploads,
                    runtime::GenerationRequest& request) {
  if (uploads.empty()) return Status::ok_status();
  DZ_ASSIGN_OR_RETURN(request.images, runtime::expand_image_placeholders(
                                          request.prompt_token_ids,
                                          model.vision()->placeholder_token_id(), uploads));
  return Status::ok_status();
}

}  // namespace dz::cli
