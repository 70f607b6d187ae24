#include "dayzero/formats/json_text.h"

namespace dz::formats {

namespace {
constexpr size_t kMaxShownChars = 60;
}  // namespace

std::string_view json_kind(const nlohmann::json& value) {
  using Type = nlohmann::json::value_t;
  switch (value.type()) {
    case Type::object:
      return "an object";
    case Type::array:
      return "an array";
    case Type::string:
      return "a string";
    case Type::boolean:
      return "a boolean";
    case Type::null:
      return "null";
    default:
      return "a number";
  }
}

std::string json_excerpt(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > kMaxShownChars) text = text.substr(0, kMaxShownChars) + "...";
  return text;
}

std::string json_scalar_or_kind(const nlohmann::json& value) {
  if (value.is_structured()) return std::string(json_kind(value));
  return json_excerpt(value);
}

}  // namespace dz::formats
