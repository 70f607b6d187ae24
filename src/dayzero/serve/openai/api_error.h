#pragma once
// OpenAI's error body and the HTTP status that goes with it (docs/serving.md §5.4):
//   {"error": {"message": text, "type": kind, "param": field or null, "code": string or null}}
// Request parsing returns an ApiError instead of a value; the server sends it as the response body
// (or, once a stream has begun, as one SSE event).

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "dayzero/core/status.h"

namespace dz::serve::openai {

struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message = {};
  std::optional<std::string> param =
      {};  // the offending field ("temperature", "messages[2].content")
  std::optional<std::string> code = {};

  // {"error": {...}} with null for an absent param or code.
  nlohmann::json to_json() const;

  // 400 invalid_request_error, code invalid_value: a field of the wrong type or out of range.
  static ApiError invalid_value(std::string param, std::string message);
  // 400 invalid_request_error, code invalid_value, no param: a body that is not JSON (the
  // message carries the parser's byte position) or not an object.
  static ApiError invalid_json(std::string message);
  // 400 invalid_request_error, code context_length_exceeded: prompt + max_tokens past the
  // context. param: "messages" (chat) or "prompt" (completions).
  static ApiError context_length_exceeded(std::string param, std::string message);
  // 404 invalid_request_error, code model_not_found, param "model".
  static ApiError model_not_found(std::string_view model);
  // 413 invalid_request_error: the body (or an image) is above the server's limit.
  static ApiError body_too_large(int64_t num_body_bytes, int64_t max_body_bytes);
  // 404 invalid_request_error, code not_found: an unknown path.
  static ApiError not_found(std::string message);
  // 401 authentication_error, code invalid_api_key: missing or wrong Bearer key.
  static ApiError unauthorized();
  // 503 server_overloaded: the engine's queue is full (the server adds Retry-After).
  static ApiError overloaded(std::string message);
  // 503 service_unavailable: model loading, or the worker group's restart budget is spent.
  static ApiError service_unavailable(std::string message);
  // 500 internal_error: the engine failed this request; other requests go on.
  static ApiError internal(std::string message);

  // The error for a Status from below serve/: kInvalidArgument → invalid_value (with `param`,
  // which may be empty for none), kResourceExhausted → overloaded, anything else → internal.
  static ApiError from_status(const Status& status, std::string_view param = {});
};

}  // namespace dz::serve::openai
