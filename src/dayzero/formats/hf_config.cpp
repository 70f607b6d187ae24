#include "dayzero/formats/hf_config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dayzero/formats/json_text.h"

namespace dz::formats {

using nlohmann::json;

namespace {

// Larger than any dimension, count or length in a real config (max_position_embeddings 1048576),
// small enough that products of three never overflow int64.
constexpr int64_t kMaxConfigInt = int64_t{1} << 24;

std::optional<int64_t> as_int(const json& value) {
  if (value.is_number_unsigned()) {
    auto v = value.get<uint64_t>();
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(v);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

}  // namespace

struct ModuleMatcher {
  std::vector<std::string> exact;
  std::vector<std::regex> patterns;  // "re:" entries
};

ConfigObject::ConfigObject(std::shared_ptr<const json> root, const json* node,
                           std::shared_ptr<const std::string> file_name, std::string path)
    : root_(std::move(root)),
      node_(node),
      file_name_(std::move(file_name)),
      path_(std::move(path)) {}

Result<ConfigObject> ConfigObject::parse(std::string_view text, std::string_view file_name) {
  auto name = std::make_shared<const std::string>(file_name);
  auto root = std::make_shared<json>();
  try {
    *root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return make_error(StatusCode::kInvalidArgument, "{}: invalid JSON: {}", file_name, e.what());
  }
  if (!root->is_object())
    return make_error(StatusCode::kInvalidArgument,
                      "{}: expected a JSON object at the top, found {}", file_name,
                      json_excerpt(*root));
  const json* node = root.get();
  return ConfigObject(std::move(root), node, std::move(name), "");
}

Result<ConfigObject> ConfigObject::load(const std::string& path) {
  std::string base = std::filesystem::path(path).filename().string();
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "{}: cannot open {}", base, path);
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return make_error(StatusCode::kIo, "{}: read failed", path);
  return parse(buffer.str(), base);
}

std::string ConfigObject::field_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

const json* ConfigObject::find(std::string_view key) const {
  auto it = node_->find(key);
  if (it == node_->end() || it->is_null()) return nullptr;
  return &*it;
}

bool ConfigObject::has(std::string_view key) const {
  return find(key) != nullptr;
}

Status ConfigObject::field_error(std::string_view key, std::string_view message) const {
  return make_error(StatusCode::kInvalidArgument, "{}: field \"{}\": {}", *file_name_,
                    field_path(key), message);
}

Status ConfigObject::type_error(std::string_view key, std::string_view expected) const {
  const json* value = find(key);
  return field_error(key, fmt::format("expected {}, found {}", expected,
                                      value ? json_excerpt(*value) : std::string("null")));
}

Result<const json*> ConfigObject::get(std::string_view key) const {
  const json* value = find(key);
  if (value == nullptr) return field_error(key, "required field is missing");
  return value;
}

Result<int64_t> ConfigObject::required_int(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  auto v = as_int(*value);
  if (!v) return type_error(key, "an integer");
  return *v;
}

Result<int64_t> ConfigObject::required_positive_int(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  auto v = as_int(*value);
  if (!v || *v <= 0) return type_error(key, "a positive integer");
  if (*v > kMaxConfigInt)
    return field_error(key, fmt::format("{} exceeds the limit {}", *v, kMaxConfigInt));
  return *v;
}

Result<int64_t> ConfigObject::required_non_negative_int(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  auto v = as_int(*value);
  if (!v || *v < 0) return type_error(key, "a non-negative integer");
  if (*v > kMaxConfigInt)
    return field_error(key, fmt::format("{} exceeds the limit {}", *v, kMaxConfigInt));
  return *v;
}

Result<std::optional<int64_t>> ConfigObject::optional_positive_int(std::string_view key) const {
  if (!has(key)) return std::optional<int64_t>();
  DZ_ASSIGN_OR_RETURN(int64_t v, required_positive_int(key));
  return std::optional<int64_t>(v);
}

Result<int64_t> ConfigObject::optional_non_negative_int(std::string_view key,
                                                        int64_t default_value) const {
  if (!has(key)) return default_value;
  return required_non_negative_int(key);
}

Result<double> ConfigObject::required_number(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  if (!value->is_number()) return type_error(key, "a number");
  return value->get<double>();
}

Result<double> ConfigObject::optional_number(std::string_view key, double default_value) const {
  if (!has(key)) return default_value;
  return required_number(key);
}

Result<std::optional<double>> ConfigObject::optional_number(std::string_view key) const {
  if (!has(key)) return std::optional<double>();
  DZ_ASSIGN_OR_RETURN(double v, required_number(key));
  return std::optional<double>(v);
}

Result<bool> ConfigObject::required_bool(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  if (!value->is_boolean()) return type_error(key, "true or false");
  return value->get<bool>();
}

Result<bool> ConfigObject::optional_bool(std::string_view key, bool default_value) const {
  if (!has(key)) return default_value;
  return required_bool(key);
}

Result<std::string> ConfigObject::required_string(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  if (!value->is_string()) return type_error(key, "a string");
  return value->get<std::string>();
}

Result<std::optional<std::string>> ConfigObject::optional_string(std::string_view key) const {
  if (!has(key)) return std::optional<std::string>();
  DZ_ASSIGN_OR_RETURN(std::string v, required_string(key));
  return std::optional<std::string>(std::move(v));
}

Result<std::vector<int64_t>> ConfigObject::required_positive_int_list(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  if (!value->is_array()) return type_error(key, "a list of positive integers");
  std::vector<int64_t> out;
  out.reserve(value->size());
  for (size_t i = 0; i < value->size(); ++i) {
    auto v = as_int((*value)[i]);
    if (!v || *v <= 0 || *v > kMaxConfigInt)
      return field_error(
          fmt::format("{}[{}]", key, i),
          fmt::format("expected a positive integer, found {}", json_excerpt((*value)[i])));
    out.push_back(*v);
  }
  return out;
}

Result<std::vector<double>> ConfigObject::optional_number_list(std::string_view key) const {
  const json* value = find(key);
  if (value == nullptr) return std::vector<double>();
  if (!value->is_array()) return type_error(key, "a list of numbers");
  std::vector<double> out;
  for (size_t i = 0; i < value->size(); ++i) {
    if (!(*value)[i].is_number())
      return field_error(fmt::format("{}[{}]", key, i),
                         fmt::format("expected a number, found {}", json_excerpt((*value)[i])));
    out.push_back((*value)[i].get<double>());
  }
  return out;
}

Result<std::vector<std::string>> ConfigObject::optional_string_list(std::string_view key) const {
  const json* value = find(key);
  if (value == nullptr) return std::vector<std::string>();
  if (!value->is_array()) return type_error(key, "a list of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < value->size(); ++i) {
    if (!(*value)[i].is_string())
      return field_error(fmt::format("{}[{}]", key, i),
                         fmt::format("expected a string, found {}", json_excerpt((*value)[i])));
    out.push_back((*value)[i].get<std::string>());
  }
  return out;
}

Result<ConfigObject> ConfigObject::required_object(std::string_view key) const {
  DZ_ASSIGN_OR_RETURN(const json* value, get(key));
  if (!value->is_object()) return type_error(key, "an object");
  return ConfigObject(root_, value, file_name_, field_path(key));
}

Result<std::optional<ConfigObject>> ConfigObject::optional_object(std::string_view key) const {
  if (!has(key)) return std::optional<ConfigObject>();
  DZ_ASSIGN_OR_RETURN(ConfigObject v, required_object(key));
  return std::optional<ConfigObject>(std::move(v));
}

std::vector<std::string> ConfigObject::keys() const {
  std::vector<std::string> out;
  for (const auto& item : node_->items()) out.push_back(item.key());
  return out;
}

Result<RopeScaling> parse_rope_scaling(const ConfigObject& obj) {
  RopeScaling rope;
  const char* type_key = obj.has("type") ? "type" : "rope_type";
  DZ_ASSIGN_OR_RETURN(rope.type, obj.required_string(type_key));
  if (rope.type != "yarn")
    return obj.field_error(
        type_key, fmt::format("unsupported rope scaling \"{}\" (supported: yarn)", rope.type));
  DZ_ASSIGN_OR_RETURN(rope.factor, obj.required_number("factor"));
  if (!(rope.factor >= 1.0)) return obj.type_error("factor", "a number >= 1");
  DZ_ASSIGN_OR_RETURN(rope.original_max_position_embeddings,
                      obj.required_positive_int("original_max_position_embeddings"));
  DZ_ASSIGN_OR_RETURN(rope.beta_fast, obj.optional_number("beta_fast", rope.beta_fast));
  DZ_ASSIGN_OR_RETURN(rope.beta_slow, obj.optional_number("beta_slow", rope.beta_slow));
  if (!(rope.beta_fast > rope.beta_slow))
    return obj.field_error("beta_fast", fmt::format("must exceed beta_slow ({} <= {})",
                                                    rope.beta_fast, rope.beta_slow));
  DZ_ASSIGN_OR_RETURN(rope.mscale, obj.optional_number("mscale", rope.mscale));
  DZ_ASSIGN_OR_RETURN(rope.mscale_all_dim, obj.optional_number("mscale_all_dim", 0.0));
  return rope;
}

namespace {

Result<std::shared_ptr<const ModuleMatcher>> compile_matcher(const ConfigObject& obj,
                                                             std::string_view key,
                                                             const std::vector<std::string>& list) {
  auto matcher = std::make_shared<ModuleMatcher>();
  for (size_t i = 0; i < list.size(); ++i) {
    std::string_view entry = list[i];
    if (!entry.starts_with("re:")) {
      matcher->exact.emplace_back(entry);
      continue;
    }
    try {
      matcher->patterns.emplace_back(std::string(entry.substr(3)), std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      return obj.field_error(fmt::format("{}[{}]", key, i),
                             fmt::format("invalid regular expression: {}", e.what()));
    }
  }
  return std::shared_ptr<const ModuleMatcher>(std::move(matcher));
}

Result<QuantizationConfig> parse_fp8(const ConfigObject& obj) {
  QuantizationConfig q;
  q.method = QuantMethod::kFp8Block;
  DZ_ASSIGN_OR_RETURN(std::string fmt_name, obj.required_string("fmt"));
  if (fmt_name != "e4m3")
    return obj.field_error(
        "fmt", fmt::format("unsupported FP8 format \"{}\" (supported: e4m3)", fmt_name));
  DZ_ASSIGN_OR_RETURN(std::string scheme, obj.required_string("activation_scheme"));
  if (scheme != "dynamic")
    return obj.field_error("activation_scheme",
                           fmt::format("unsupported \"{}\" (supported: dynamic)", scheme));
  DZ_ASSIGN_OR_RETURN(std::vector<int64_t> block,
                      obj.required_positive_int_list("weight_block_size"));
  if (block.size() != 2)
    return obj.type_error("weight_block_size", "two positive integers [rows, cols]");
  q.block_rows = block[0];
  q.block_cols = block[1];
  DZ_ASSIGN_OR_RETURN(q.scale_fmt, obj.optional_string("scale_fmt"));
  if (q.scale_fmt && *q.scale_fmt != "ue8m0")
    return obj.field_error(
        "scale_fmt", fmt::format("unsupported \"{}\" (supported: ue8m0 or absent)", *q.scale_fmt));
  return q;
}

// compressed-tensors: one config group of 4-bit float weights in groups of 32, no activation
// quantization (docs/formats.md §3.4).
Result<QuantizationConfig> parse_compressed_tensors(const ConfigObject& obj) {
  QuantizationConfig q;
  q.method = QuantMethod::kMxfp4CompressedTensors;
  DZ_ASSIGN_OR_RETURN(ConfigObject groups, obj.required_object("config_groups"));
  std::vector<std::string> names = groups.keys();
  if (names.size() != 1)
    return obj.field_error("config_groups",
                           fmt::format("expected exactly one group, found {}", names.size()));
  DZ_ASSIGN_OR_RETURN(ConfigObject group, groups.required_object(names[0]));
  DZ_ASSIGN_OR_RETURN(auto format, obj.optional_string("format"));
  if (!format) {
    DZ_ASSIGN_OR_RETURN(format, group.optional_string("format"));
  }
  if (!format || *format != "mxfp4-pack-quantized")
    return obj.type_error("format", "\"mxfp4-pack-quantized\"");
  if (group.has("input_activations"))
    return group.field_error("input_activations",
                             "activation quantization is not supported (expected null)");
  if (group.has("output_activations"))
    return group.field_error("output_activations", "output quantization is not supported");
  DZ_ASSIGN_OR_RETURN(ConfigObject weights, group.required_object("weights"));
  DZ_ASSIGN_OR_RETURN(int64_t num_bits, weights.required_positive_int("num_bits"));
  if (num_bits != 4) return weights.type_error("num_bits", "4");
  DZ_ASSIGN_OR_RETURN(q.group_size, weights.required_positive_int("group_size"));
  if (q.group_size != 32) return weights.type_error("group_size", "32");
  DZ_ASSIGN_OR_RETURN(auto type, weights.optional_string("type"));
  if (type && *type != "float") return weights.type_error("type", "\"float\"");
  if (obj.has("kv_cache_scheme"))
    return obj.field_error("kv_cache_scheme", "KV-cache quantization is not supported");
  DZ_ASSIGN_OR_RETURN(q.ignore, obj.optional_string_list("ignore"));
  DZ_ASSIGN_OR_RETURN(q.matcher, compile_matcher(obj, "ignore", q.ignore));
  return q;
}

}  // namespace

Result<QuantizationConfig> parse_quantization_config(const ConfigObject& obj) {
  DZ_ASSIGN_OR_RETURN(std::string method, obj.required_string("quant_method"));
  if (method == "fp8") return parse_fp8(obj);
  if (method == "compressed-tensors") return parse_compressed_tensors(obj);
  if (method == "mxfp4") {
    QuantizationConfig q;
    q.method = QuantMethod::kMxfp4GptOss;
    q.group_size = 32;
    DZ_ASSIGN_OR_RETURN(q.modules_to_not_convert,
                        obj.optional_string_list("modules_to_not_convert"));
    DZ_ASSIGN_OR_RETURN(q.matcher,
                        compile_matcher(obj, "modules_to_not_convert", q.modules_to_not_convert));
    return q;
  }
  return obj.field_error(
      "quant_method",
      fmt::format("unsupported \"{}\" (supported: fp8, compressed-tensors, mxfp4)", method));
}

bool QuantizationConfig::ignores(std::string_view module_name) const {
  if (!matcher) return false;
  for (const auto& name : matcher->exact)
    if (name == module_name) return true;
  for (const auto& pattern : matcher->patterns)
    if (std::regex_search(module_name.begin(), module_name.end(), pattern,
                          std::regex_constants::match_continuous))
      return true;
  return false;
}

std::string QuantizationConfig::describe() const {
  switch (method) {
    case QuantMethod::kNone:
      return "none";
    case QuantMethod::kFp8Block:
      return fmt::format("fp8 e4m3 weights, {}x{} blocks, scale_fmt {}", block_rows, block_cols,
                         scale_fmt.value_or("plain"));
    case QuantMethod::kMxfp4CompressedTensors:
      return fmt::format("compressed-tensors mxfp4-pack-quantized, group {}, {} ignore entries",
                         group_size, ignore.size());
    case QuantMethod::kMxfp4GptOss:
      return fmt::format("gpt-oss mxfp4, {} modules not converted", modules_to_not_convert.size());
  }
  return "?";
}

}  // namespace dz::formats
