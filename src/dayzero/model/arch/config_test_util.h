#pragma once
// Test helpers shared by the recipe and registry tests: the published full-size configs
// (tests/data/configs/*.json, values from docs/models.md §7) and the error a mutated copy produces.

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "dayzero/model/registry.h"

namespace dz::model::testing {

inline nlohmann::json real_config(const std::string& name) {
  std::ifstream in(std::string(DZ_SOURCE_DIR) + "/tests/data/configs/" + name + ".json");
  EXPECT_TRUE(in.good()) << name;
  std::stringstream text;
  text << in.rdbuf();
  return nlohmann::json::parse(text.str());
}

inline std::unique_ptr<Architecture> parse_ok(const nlohmann::json& config) {
  auto arch = parse_model_config_text(config.dump(), "config.json");
  EXPECT_TRUE(arch.ok()) << arch.status().to_string();
  return arch.ok() ? std::move(arch).value() : nullptr;
}

// The error message of parsing `config`, or "" when it parses.
inline std::string parse_error(const nlohmann::json& config) {
  auto arch = parse_model_config_text(config.dump(), "config.json");
  return arch.ok() ? "" : arch.status().message();
}

// How the table's tensor `name` splits across ranks ("missing", and a failure, when absent).
inline std::string_view split_of(const TensorTable& table, const std::string& name) {
  const TensorSpec* spec = table.find(name);
  EXPECT_NE(spec, nullptr) << name;
  return spec != nullptr ? split_name(spec->split) : std::string_view("missing");
}

}  // namespace dz::model::testing
