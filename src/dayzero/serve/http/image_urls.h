#pragma once
// An image content part's URL to the image file's bytes (docs/serving.md §5.6): `data:` URLs
// (base64) always; `http(s)` URLs only for hosts named in --allowed-media-domains (vLLM's
// spelling), fetched with a size limit, short timeouts and no redirects; anything else is refused.
// Every refusal is a 400 naming the field and what is wrong.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "dayzero/serve/openai/api_error.h"

namespace dz::serve::http {

struct MediaOptions {
  std::vector<std::string> allowed_domains;  // host names; empty: no remote fetching at all
  int64_t max_image_bytes = int64_t{64} << 20;
  double fetch_timeout_s = 10.0;  // connect and read, each
};

std::variant<std::shared_ptr<const std::string>, openai::ApiError> load_image_url(
    std::string_view url, const std::string& param, const MediaOptions& options);

}  // namespace dz::serve::http
