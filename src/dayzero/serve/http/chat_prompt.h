#pragma once
// A chat request to the engine's prompt (docs/serving.md §5.6): each image part's URL loaded and
// the image inspected (decoded within the limits, its token count planned, its pixels hashed), the
// model's image text put at the part's place in its message, the template rendered, the text
// tokenized and each image's placeholder widened to its token count. Used by chat completions and
// /tokenize alike, so both count the same tokens.

#include <cstdint>
#include <variant>
#include <vector>

#include "dayzero/runtime/engine_types.h"
#include "dayzero/serve/http/image_urls.h"
#include "dayzero/serve/http/serving_model.h"
#include "dayzero/serve/openai/api_error.h"
#include "dayzero/serve/openai/chat_request.h"

namespace dz::serve::http {

struct ChatPrompt {
  std::vector<int32_t> token_ids;
  std::vector<runtime::PromptImage> images;  // over the placeholder tokens, in prompt order
};

// 400 naming the field for a bad URL or image, images sent to a model without a vision tower,
// or a prompt whose placeholders do not match its images (the text itself held the placeholder).
std::variant<ChatPrompt, openai::ApiError> build_chat_prompt(const ServingModel& m,
                                                             const openai::ChatRequest& request,
                                                             const MediaOptions& media);

}  // namespace dz::serve::http
