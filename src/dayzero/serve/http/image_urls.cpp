#include "dayzero/serve/http/image_urls.h"

#include <algorithm>

#include <fmt/format.h>
#include <httplib.h>

#include "dayzero/core/base64.h"

namespace dz::serve::http {
namespace {

using openai::ApiError;
using Loaded = std::variant<std::shared_ptr<const std::string>, ApiError>;

// data:[<media type>][;<parameter>...];base64,<payload>
Loaded load_data_url(std::string_view url, const std::string& param, const MediaOptions& options) {
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos)
    return ApiError::invalid_value(param, fmt::format("{}: a data URL needs a comma before its "
                                                      "data",
                                                      param));
  const std::string_view header = url.substr(5, comma - 5);
  const std::string_view payload = url.substr(comma + 1);
  if (!header.ends_with(";base64"))
    return ApiError::invalid_value(
        param,
        fmt::format("{}: only base64 data URLs are read (data:image/png;base64,...)", param));
  const std::string_view media_type = header.substr(0, header.find(';'));
  if (!media_type.empty() && !media_type.starts_with("image/"))
    return ApiError::invalid_value(
        param,
        fmt::format("{}: the data URL's type \"{}\" is not an image type", param, media_type));
  // Checked on the encoded size first: no decoding of what is too large anyway.
  if (static_cast<int64_t>(payload.size() / 4 * 3) > options.max_image_bytes + 2)
    return ApiError::invalid_value(
        param, fmt::format("{}: an image of about {} bytes; the limit is {} bytes", param,
                           payload.size() / 4 * 3, options.max_image_bytes));
  std::optional<std::string> bytes = decode_base64(payload);
  if (!bytes)
    return ApiError::invalid_value(
        param, fmt::format("{}: the data URL's payload is not valid base64", param));
  return std::make_shared<const std::string>(std::move(*bytes));
}

bool allowed(std::string_view host, const std::vector<std::string>& domains) {
  return std::any_of(domains.begin(), domains.end(),
                     [&](const std::string& domain) { return host == domain; });
}

Loaded fetch(std::string_view url, const std::string& param, const MediaOptions& options) {
  const size_t scheme_end = url.find("://") + 3;
  const size_t path_begin = std::min(url.find('/', scheme_end), url.size());
  const std::string_view authority = url.substr(scheme_end, path_begin - scheme_end);
  if (authority.find('@') != std::string_view::npos)
    return ApiError::invalid_value(
        param, fmt::format("{}: image URLs with user information are refused", param));
  const std::string_view host = authority.substr(
      0, authority.rfind(':') == std::string_view::npos ? authority.size() : authority.rfind(':'));
  if (options.allowed_domains.empty())
    return ApiError::invalid_value(
        param, fmt::format("{}: remote image URLs are not fetched; send the image as a data: URL "
                           "(data:image/png;base64,...), or start the server with "
                           "--allowed-media-domains",
                           param));
  if (!allowed(host, options.allowed_domains))
    return ApiError::invalid_value(
        param, fmt::format("{}: the host \"{}\" is not in --allowed-media-domains", param, host));
  httplib::Client client(std::string(url.substr(0, path_begin)));
  const auto timeout = std::chrono::duration<double>(options.fetch_timeout_s);
  client.set_connection_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(timeout));
  client.set_follow_location(false);  // a redirect could leave the allowed hosts
  std::string body;
  bool too_large = false;
  const std::string path = path_begin < url.size() ? std::string(url.substr(path_begin)) : "/";
  httplib::Result result = client.Get(path, [&](const char* data, size_t size) {
    body.append(data, size);
    too_large = static_cast<int64_t>(body.size()) > options.max_image_bytes;
    return !too_large;
  });
  if (too_large)
    return ApiError::invalid_value(
        param, fmt::format("{}: the image at {} is larger than the limit of {} bytes", param, url,
                           options.max_image_bytes));
  if (!result)
    return ApiError::invalid_value(param, fmt::format("{}: fetching {} failed: {}", param, url,
                                                      httplib::to_string(result.error())));
  if (result->status != 200)
    return ApiError::invalid_value(
        param, fmt::format("{}: fetching {} answered HTTP {}", param, url, result->status));
  return std::make_shared<const std::string>(std::move(body));
}

}  // namespace

Loaded load_image_url(std::string_view url, const std::string& param, const MediaOptions& options) {
  if (url.starts_with("data:")) return load_data_url(url, param, options);
  if (url.starts_with("http://") || url.starts_with("https://")) return fetch(url, param, options);
  const size_t colon = url.find(':');
  return ApiError::invalid_value(
      param,
      colon == std::string_view::npos || colon > 16
          ? fmt::format("{}: not a URL (send data:image/png;base64,...)", param)
          : fmt::format("{}: {} URLs are not read (data: URLs are)", param, url.substr(0, colon)));
}

}  // namespace dz::serve::http
