#pragma once
// Typed reads of request fields with OpenAI-style errors, shared by the chat and completions
// parsers. A FieldReader keeps the first error it meets and ignores every read after it, so a
// parser reads all its fields in a row and checks once. Absent and null fields leave the output
// untouched: clients send null for "not given" (OpenAI's own SDKs omit the key instead).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include <nlohmann/json.hpp>

#include "dayzero/serve/openai/api_error.h"

namespace dz::serve::openai {

// "a string", "an array", "a number", ... for error messages.
std::string_view json_type_phrase(const nlohmann::json& value);

// The integer value of an integer or an integral float (5.0, as pydantic's lax mode accepts);
// nullopt for anything else or a value outside int64.
std::optional<int64_t> json_to_int64(const nlohmann::json& value);

// Parses `body` into an object. Errors: not JSON (the message has the parser's byte position),
// nesting deeper than max_depth (copies and dumps of the value recurse), or not an object.
std::variant<nlohmann::json, ApiError> parse_json_object(std::string_view body, int max_depth);

class FieldReader {
 public:
  // `object` must be a JSON object and outlive the reader; `prefix` is put before every field
  // name in errors ("messages[2].").
  explicit FieldReader(const nlohmann::json& object, std::string prefix = {});

  // The value of `key`, or nullptr when it is absent or null.
  const nlohmann::json* find(std::string_view key) const;

  // Each returns true when the key held a value of the right type and range (stored in `out`).
  bool read_bool(std::string_view key, bool& out);
  bool read_string(std::string_view key, std::string& out);
  bool read_string(std::string_view key, std::optional<std::string>& out);
  bool read_int(std::string_view key, int64_t& out, int64_t min_value, int64_t max_value);
  bool read_int(std::string_view key, int32_t& out, int32_t min_value, int32_t max_value);
  // A finite number within float's range (narrowing a larger double is undefined behaviour).
  bool read_float(std::string_view key, float& out);

  // Records an invalid_value error for prefix + `field` (the first one wins).
  void fail(std::string_view field, std::string message);
  // An invalid_value error naming `field` for a value of the wrong type.
  void fail_type(std::string_view field, const nlohmann::json& value, std::string_view expected);

  // Keeps `error` (e.g. a nested reader's) unless an earlier error is already kept.
  void adopt(std::optional<ApiError> error);

  bool ok() const { return !error_.has_value(); }
  std::optional<ApiError> take_error() { return std::move(error_); }
  std::string param(std::string_view field) const;

 private:
  const nlohmann::json& object_;
  std::string prefix_;
  std::optional<ApiError> error_;
};

}  // namespace dz::serve::openai
