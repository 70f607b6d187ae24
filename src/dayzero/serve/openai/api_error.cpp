#include "dayzero/serve/openai/api_error.h"

#include <utility>

#include <fmt/format.h>

namespace dz::serve::openai {
namespace {

ApiError make(int http_status, std::string type, std::string message,
              std::optional<std::string> param, std::optional<std::string> code) {
  return ApiError{.http_status = http_status,
                  .type = std::move(type),
                  .message = std::move(message),
                  .param = std::move(param),
                  .code = std::move(code)};
}

}  // namespace

nlohmann::json ApiError::to_json() const {
  nlohmann::json error = {
      {"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (param) error["param"] = *param;
  if (code) error["code"] = *code;
  return {{"error", std::move(error)}};
}

ApiError ApiError::invalid_value(std::string param, std::string message) {
  return make(400, "invalid_request_error", std::move(message), std::move(param), "invalid_value");
}

ApiError ApiError::invalid_json(std::string message) {
  return make(400, "invalid_request_error", std::move(message), std::nullopt, "invalid_value");
}

ApiError ApiError::context_length_exceeded(std::string param, std::string message) {
  return make(400, "invalid_request_error", std::move(message), std::move(param),
              "context_length_exceeded");
}

ApiError ApiError::model_not_found(std::string_view model) {
  return make(404, "invalid_request_error", fmt::format("The model `{}` does not exist.", model),
              "model", "model_not_found");
}

ApiError ApiError::body_too_large(int64_t num_body_bytes, int64_t max_body_bytes) {
  return make(413, "invalid_request_error",
              fmt::format("The request body is {} bytes, above the limit of {} bytes.",
                          num_body_bytes, max_body_bytes),
              std::nullopt, std::nullopt);
}

ApiError ApiError::not_found(std::string message) {
  return make(404, "invalid_request_error", std::move(message), std::nullopt, "not_found");
}

ApiError ApiError::unauthorized() {
  return make(401, "authentication_error",
              "Missing or invalid API key: send it as `Authorization: Bearer <key>`.", std::nullopt,
              "invalid_api_key");
}

ApiError ApiError::overloaded(std::string message) {
  return make(503, "server_overloaded", std::move(message), std::nullopt, std::nullopt);
}

ApiError ApiError::service_unavailable(std::string message) {
  return make(503, "service_unavailable", std::move(message), std::nullopt, std::nullopt);
}

ApiError ApiError::internal(std::string message) {
  return make(500, "internal_error", std::move(message), std::nullopt, std::nullopt);
}

ApiError ApiError::from_status(const Status& status, std::string_view param) {
  switch (status.code()) {
    case StatusCode::kInvalidArgument: {
      ApiError error = invalid_value(std::string(param), status.message());
      if (param.empty()) error.param.reset();
      return error;
    }
    case StatusCode::kResourceExhausted:
      return overloaded(status.message());
    default:
      return internal(status.message());
  }
}

}  // namespace dz::serve::openai
