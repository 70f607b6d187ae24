#include "dayzero/serve/openai/json_fields.h"

#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "dayzero/runtime/utf8_stream.h"

namespace dz::serve::openai {
namespace {

// Thrown from the parser callback to stop at the first too-deep value.
struct TooDeep {
  size_t depth;
};

}  // namespace

std::string_view json_type_phrase(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "an array";
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "a boolean";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "an integer";
    case nlohmann::json::value_t::number_float:
      return "a number";
    default:
      return "binary data";
  }
}

std::optional<int64_t> json_to_int64(const nlohmann::json& value) {
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  if (value.is_number_unsigned()) {
    const auto u = value.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(u);
  }
  if (value.is_number_float()) {
    const double d = value.get<double>();
    // 2^63 is exactly representable; anything at or above it does not fit.
    if (!std::isfinite(d) || d != std::floor(d) || d < -9223372036854775808.0 ||
        d >= 9223372036854775808.0)
      return std::nullopt;
    return static_cast<int64_t>(d);
  }
  return std::nullopt;
}

std::variant<nlohmann::json, ApiError> parse_json_object(std::string_view body, int max_depth) {
  nlohmann::json value;
  try {
    // The callback sees the depth of every value; the DOM parser itself is iterative, but copying
    // or dumping a value recurses, so a hostile body must not nest arbitrarily deep.
    const auto check_depth = [max_depth](int depth, nlohmann::json::parse_event_t,
                                         nlohmann::json&) {
      if (depth > max_depth) throw TooDeep{static_cast<size_t>(depth)};
      return true;
    };
    value = nlohmann::json::parse(body.begin(), body.end(), check_depth);
  } catch (const TooDeep&) {
    return ApiError::invalid_json(
        fmt::format("The request body nests JSON deeper than {} levels.", max_depth));
  } catch (const nlohmann::json::parse_error& e) {
    // The parser quotes the bytes it last read, which may be invalid UTF-8: the message must
    // still serialise.
    return ApiError::invalid_json(fmt::format("The request body is not valid JSON (at byte {}): {}",
                                              e.byte, runtime::replace_invalid_utf8(e.what())));
  } catch (const nlohmann::json::exception& e) {
    // e.g. out_of_range 406 for a number too large for a double.
    return ApiError::invalid_json(fmt::format("The request body is not valid JSON: {}",
                                              runtime::replace_invalid_utf8(e.what())));
  }
  if (!value.is_object())
    return ApiError::invalid_json(
        fmt::format("The request body must be a JSON object, got {}.", json_type_phrase(value)));
  return value;
}

FieldReader::FieldReader(const nlohmann::json& object, std::string prefix)
    : object_(object), prefix_(std::move(prefix)) {}

std::string FieldReader::param(std::string_view field) const {
  return prefix_ + std::string(field);
}

const nlohmann::json* FieldReader::find(std::string_view key) const {
  const auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

void FieldReader::fail(std::string_view field, std::string message) {
  if (!error_) error_ = ApiError::invalid_value(param(field), std::move(message));
}

void FieldReader::adopt(std::optional<ApiError> error) {
  if (!error_) error_ = std::move(error);
}

void FieldReader::fail_type(std::string_view field, const nlohmann::json& value,
                            std::string_view expected) {
  fail(field,
       fmt::format("{}: expected {}, got {}", param(field), expected, json_type_phrase(value)));
}

bool FieldReader::read_bool(std::string_view key, bool& out) {
  const nlohmann::json* value = ok() ? find(key) : nullptr;
  if (value == nullptr) return false;
  if (!value->is_boolean()) {
    fail_type(key, *value, "a boolean");
    return false;
  }
  out = value->get<bool>();
  return true;
}

bool FieldReader::read_string(std::string_view key, std::string& out) {
  const nlohmann::json* value = ok() ? find(key) : nullptr;
  if (value == nullptr) return false;
  if (!value->is_string()) {
    fail_type(key, *value, "a string");
    return false;
  }
  out = value->get_ref<const std::string&>();
  return true;
}

bool FieldReader::read_string(std::string_view key, std::optional<std::string>& out) {
  std::string text;
  if (!read_string(key, text)) return false;
  out = std::move(text);
  return true;
}

bool FieldReader::read_int(std::string_view key, int64_t& out, int64_t min_value,
                           int64_t max_value) {
  const nlohmann::json* value = ok() ? find(key) : nullptr;
  if (value == nullptr) return false;
  const std::optional<int64_t> v = json_to_int64(*value);
  if (!v) {
    if (value->is_number())
      fail(key, fmt::format("{}: expected an integer in [{}, {}], got {}", param(key), min_value,
                            max_value, value->dump()));
    else
      fail_type(key, *value, "an integer");
    return false;
  }
  if (*v < min_value || *v > max_value) {
    fail(key, fmt::format("{} must be in [{}, {}], got {}", param(key), min_value, max_value, *v));
    return false;
  }
  out = *v;
  return true;
}

bool FieldReader::read_int(std::string_view key, int32_t& out, int32_t min_value,
                           int32_t max_value) {
  int64_t v = 0;
  if (!read_int(key, v, min_value, max_value)) return false;
  out = static_cast<int32_t>(v);
  return true;
}

bool FieldReader::read_float(std::string_view key, float& out) {
  const nlohmann::json* value = ok() ? find(key) : nullptr;
  if (value == nullptr) return false;
  if (!value->is_number()) {
    fail_type(key, *value, "a number");
    return false;
  }
  const double d = value->get<double>();
  if (!std::isfinite(d) || std::fabs(d) > static_cast<double>(std::numeric_limits<float>::max())) {
    fail(key, fmt::format("{} must be a finite number, got {}", param(key), value->dump()));
    return false;
  }
  out = static_cast<float>(d);
  return true;
}

}  // namespace dz::serve::openai
