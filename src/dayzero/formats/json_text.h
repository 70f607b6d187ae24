#pragma once
// How JSON values appear in error messages, shared by the safetensors, checkpoint-index and config
// parsers so that every "expected X, found Y" reads the same.

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace dz::formats {

// "an object", "an array", "a string", "a boolean", "null" or "a number".
std::string_view json_kind(const nlohmann::json& value);

// The value as JSON, cut after 60 characters; invalid UTF-8 is replaced instead of throwing.
std::string json_excerpt(const nlohmann::json& value);

// Containers by kind only ("an object"), scalars as JSON: for messages about single fields.
std::string json_scalar_or_kind(const nlohmann::json& value);

}  // namespace dz::formats
