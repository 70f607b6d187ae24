#include "dayzero/model/registry.h"

#include <array>

#include <fmt/ranges.h>

#include "dayzero/model/arch/deepseek_v32.h"
#include "dayzero/model/arch/glm5_next.h"
#include "dayzero/model/arch/kimi_linear.h"

namespace dz::model {
namespace {

constexpr std::array kRecipes = {
    RecipeEntry{.model_type = "deepseek_v32",
                .parse = parse_deepseek_v32,
                .chat_encoding = ChatEncoding::kDeepseekV32},
    RecipeEntry{.model_type = "kimi_linear", .parse = parse_kimi_linear},
    RecipeEntry{.model_type = "kimi_k3",
                .text_model_type = "kimi_linear",
                .tensor_prefix = "language_model.",
                .parse = parse_kimi_k3},
    // dayzero's own hybrid: Kimi's KDA/FFN/AttnRes with DeepSeek-V3.2 RoPE MLA + DSA indexer
    // (docs/recipe_dayzero_hybrid.md).
    RecipeEntry{.model_type = "dayzero_hybrid", .parse = parse_dayzero_hybrid},
    // Analysed (dayzero analyze), not run: its mHC hyper-connections and pooled-block indexer
    // are not built.
    RecipeEntry{.model_type = "glm5_next",
                .text_model_type = "glm5_next_text",
                .refusal = "GLM-5.3-Flash is recognised but not supported: its mHC "
                           "hyper-connections and pooled-block indexer are not built yet "
                           "(docs/models.md §3.7, §7.4; `dayzero analyze` reads its config)",
                .analyze_only = parse_glm5_next_for_analysis},
};

}  // namespace

std::span<const RecipeEntry> recipe_table() {
  return kRecipes;
}

std::vector<std::string_view> supported_model_types() {
  std::vector<std::string_view> out;
  for (const auto& entry : kRecipes)
    if (entry.parse != nullptr) out.push_back(entry.model_type);
  return out;
}

namespace {

Result<const RecipeEntry*> find_entry(const formats::ConfigObject& root) {
  DZ_ASSIGN_OR_RETURN(std::string model_type, root.required_string("model_type"));
  for (const auto& candidate : kRecipes)
    if (candidate.model_type == model_type) return &candidate;
  return Status(StatusCode::kUnsupported,
                root.field_error("model_type",
                                 fmt::format("unknown model_type \"{}\" (supported: {})",
                                             model_type, fmt::join(supported_model_types(), ", ")))
                    .message());
}

Result<RecipeInput> recipe_input(const RecipeEntry& entry, const formats::ConfigObject& root) {
  RecipeInput input{.root = root,
                    .text = root,
                    .model_type = std::string(entry.model_type),
                    .tensor_prefix = std::string(entry.tensor_prefix)};
  if (!entry.text_model_type.empty()) {
    DZ_ASSIGN_OR_RETURN(input.text, root.required_object("text_config"));
    DZ_ASSIGN_OR_RETURN(std::string text_type, input.text.required_string("model_type"));
    if (text_type != entry.text_model_type)
      return input.text.field_error(
          "model_type", fmt::format("expected \"{}\" inside a {} config, found \"{}\"",
                                    entry.text_model_type, entry.model_type, text_type));
  }
  return input;
}

}  // namespace

Result<std::unique_ptr<Architecture>> parse_model_config(const formats::ConfigObject& root) {
  DZ_ASSIGN_OR_RETURN(const RecipeEntry* entry, find_entry(root));
  if (entry->parse == nullptr)
    return Status(StatusCode::kUnsupported,
                  root.field_error("model_type", entry->refusal).message());
  DZ_ASSIGN_OR_RETURN(RecipeInput input, recipe_input(*entry, root));
  return entry->parse(input);
}

Result<AnalysisTarget> parse_model_config_for_analysis(const formats::ConfigObject& root) {
  DZ_ASSIGN_OR_RETURN(const RecipeEntry* entry, find_entry(root));
  RecipeParser parse = entry->parse != nullptr ? entry->parse : entry->analyze_only;
  if (parse == nullptr)
    return Status(StatusCode::kUnsupported,
                  root.field_error("model_type", entry->refusal).message());
  DZ_ASSIGN_OR_RETURN(RecipeInput input, recipe_input(*entry, root));
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<Architecture> arch, parse(input));
  return AnalysisTarget{.arch = std::move(arch),
                        .refusal = entry->parse != nullptr ? "" : std::string(entry->refusal)};
}

Result<std::unique_ptr<Architecture>> parse_model_config_text(std::string_view text,
                                                              std::string_view file_name) {
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject root, formats::ConfigObject::parse(text, file_name));
  return parse_model_config(root);
}

Result<std::unique_ptr<Architecture>> load_model_config(const std::string& dir) {
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject root,
                      formats::ConfigObject::load(dir + "/config.json"));
  return parse_model_config(root);
}

ChatEncoding chat_encoding_of(const std::string& dir) {
  Result<formats::ConfigObject> root = formats::ConfigObject::load(dir + "/config.json");
  if (!root.ok()) return ChatEncoding::kTemplate;
  Result<std::string> model_type = root->required_string("model_type");
  if (!model_type.ok()) return ChatEncoding::kTemplate;
  for (const auto& entry : kRecipes)
    if (entry.model_type == *model_type) return entry.chat_encoding;
  return ChatEncoding::kTemplate;
}

}  // namespace dz::model
