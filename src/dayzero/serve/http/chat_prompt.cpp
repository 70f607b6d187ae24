#include "dayzero/serve/http/chat_prompt.h"

#include <memory>
#include <string>

#include <fmt/format.h>

#include "dayzero/model/vision/image_processor.h"
#include "dayzero/runtime/prompt_images.h"

namespace dz::serve::http {

using openai::ApiError;

std::variant<ChatPrompt, ApiError> build_chat_prompt(const ServingModel& m,
                                                     const openai::ChatRequest& request,
                                                     const MediaOptions& media) {
  openai::ChatRequest with_images = request;  // the messages with their image texts
  std::vector<runtime::ImageUpload> uploads;
  for (openai::ChatMessage& message : with_images.messages) {
    std::vector<std::string> texts;
    for (const openai::ChatImagePart& part : message.images) {
      if (!m.image_input)
        return ApiError::invalid_value(part.param,
                                       "images are not supported by this model (it "
                                       "has no vision tower)");
      auto bytes = load_image_url(part.url, part.param, media);
      if (auto* error = std::get_if<ApiError>(&bytes)) return std::move(*error);
      formats::ImageLimits limits;
      limits.max_file_bytes = media.max_image_bytes;
      Result<runtime::ImageUpload> upload =
          runtime::inspect_image(std::move(std::get<std::shared_ptr<const std::string>>(bytes)),
                                 m.image_input->processor, limits);
      if (!upload.ok())
        return ApiError::invalid_value(
            part.param, fmt::format("{}: {}", part.param, upload.status().message()));
      texts.push_back(model::k3_image_prompt(upload->width, upload->height));
      uploads.push_back(std::move(*upload));
    }
    // Last first, so that the earlier offsets stay valid.
    for (size_t i = message.images.size(); i-- > 0;)
      message.content->insert(message.images[i].offset, texts[i]);
  }
  auto text = render_chat(m, with_images);
  if (auto* error = std::get_if<ApiError>(&text)) return std::move(*error);
  auto ids = encode_prompt(m, std::get<std::string>(text), /*chat=*/true, "messages");
  if (auto* error = std::get_if<ApiError>(&ids)) return std::move(*error);
  ChatPrompt prompt{.token_ids = std::move(std::get<std::vector<int32_t>>(ids)), .images = {}};
  if (uploads.empty()) return prompt;
  Result<std::vector<runtime::PromptImage>> images = runtime::expand_image_placeholders(
      prompt.token_ids, m.image_input->placeholder_token_id, uploads);
  if (!images.ok()) return ApiError::invalid_value("messages", images.status().message());
  prompt.images = std::move(*images);
  return prompt;
}

}  // namespace dz::serve::http
