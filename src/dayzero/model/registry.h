#pragma once
// The one table that maps model_type (and the nested text_config.model_type) to a recipe
// (docs/style.md §2). No other file switches on the architecture.

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/model/architecture.h"

namespace dz::model {

// How chat messages become a prompt: the checkpoint's Jinja template, or DeepSeek-V3.2's fixed
// encoder (its release ships Python, not a template).
enum class ChatEncoding : unsigned char { kTemplate, kDeepseekV32 };

using RecipeParser = Result<std::unique_ptr<Architecture>> (*)(const RecipeInput& input);

struct RecipeEntry {
  std::string_view model_type = {};       // top-level model_type
  std::string_view text_model_type = {};  // required text_config.model_type, "" when not nested
  std::string_view tensor_prefix = {};    // prefix of every tensor name
  RecipeParser parse = nullptr;           // nullptr: recognised but refused with `refusal`
  std::string_view refusal = {};
  // A refused model_type's reading for `dayzero analyze` only (no loader): its sizes, layers and
  // tensor table as far as they are known, and Architecture::missing() naming what is not built.
  RecipeParser analyze_only = nullptr;
  ChatEncoding chat_encoding = ChatEncoding::kTemplate;
};

std::span<const RecipeEntry> recipe_table();
// model_types the engine runs, in table order: deepseek_v32, kimi_linear, kimi_k3.
std::vector<std::string_view> supported_model_types();

// Picks the recipe from model_type and parses the config with it.
Result<std::unique_ptr<Architecture>> parse_model_config(const formats::ConfigObject& root);
Result<std::unique_ptr<Architecture>> parse_model_config_text(std::string_view text,
                                                              std::string_view file_name);
// What `dayzero analyze` reads a config with: the recipe, or a refused model_type's analysis-only
// reading together with the refusal.
struct AnalysisTarget {
  std::unique_ptr<Architecture> arch;
  std::string refusal;  // empty: the engine runs this model
};
Result<AnalysisTarget> parse_model_config_for_analysis(const formats::ConfigObject& root);

// Reads DIR/config.json.
Result<std::unique_ptr<Architecture>> load_model_config(const std::string& dir);
// The chat encoding of DIR's model_type; kTemplate when config.json is unreadable or the type
// unknown (loading the model reports that).
ChatEncoding chat_encoding_of(const std::string& dir);

}  // namespace dz::model
