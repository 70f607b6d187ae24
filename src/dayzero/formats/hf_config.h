#pragma once
// A typed reader over a Hugging Face config.json, and the sub-structs that several architectures
// share (rope_scaling, quantization_config). Every error names the file and the JSON path of the
// field, e.g. `config.json: field "text_config.linear_attn_config.kda_layers[3]": expected a
// positive integer, found "x"` (docs/style.md §3: config structs mirror config.json, fields refused
// by name). Per-architecture config structs live with their recipe in model/arch/.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "dayzero/core/status.h"

namespace dz::formats {

// A view of one JSON object inside a parsed document. Copies share the document, so a
// ConfigObject stays valid after the document's other handles are gone.
class ConfigObject {
 public:
  // Parses `text` (the whole config.json); the top level must be an object.
  static Result<ConfigObject> parse(std::string_view text, std::string_view file_name);
  // Reads and parses a file; messages use its base name.
  static Result<ConfigObject> load(const std::string& path);

  const std::string& file_name() const { return *file_name_; }
  // JSON path of this object ("" at the top, "text_config.linear_attn_config" below).
  const std::string& path() const { return path_; }
  // JSON path of a field of this object.
  std::string field_path(std::string_view key) const;

  // True if the field exists and is not null (published configs write `null` for "unset").
  bool has(std::string_view key) const;

  Result<int64_t> required_int(std::string_view key) const;
  // Integers are refused above 2^24 (no real config comes near; products cannot overflow).
  Result<int64_t> required_positive_int(std::string_view key) const;
  Result<int64_t> required_non_negative_int(std::string_view key) const;
  // Absent or null gives nullopt; present values must be positive integers.
  Result<std::optional<int64_t>> optional_positive_int(std::string_view key) const;
  Result<int64_t> optional_non_negative_int(std::string_view key, int64_t default_value) const;
  Result<double> required_number(std::string_view key) const;
  Result<double> optional_number(std::string_view key, double default_value) const;
  Result<std::optional<double>> optional_number(std::string_view key) const;
  Result<bool> required_bool(std::string_view key) const;
  Result<bool> optional_bool(std::string_view key, bool default_value) const;
  Result<std::string> required_string(std::string_view key) const;
  Result<std::optional<std::string>> optional_string(std::string_view key) const;
  // A list of integers, each checked positive ("kda_layers[3]" names a bad element).
  Result<std::vector<int64_t>> required_positive_int_list(std::string_view key) const;
  // A list of numbers; absent or null gives an empty list.
  Result<std::vector<double>> optional_number_list(std::string_view key) const;
  // A list of strings; absent or null gives an empty list.
  Result<std::vector<std::string>> optional_string_list(std::string_view key) const;
  Result<ConfigObject> required_object(std::string_view key) const;
  Result<std::optional<ConfigObject>> optional_object(std::string_view key) const;
  // The keys of this object, in file order.
  std::vector<std::string> keys() const;

  // `config.json: field "a.b": <message>` for checks the caller makes itself.
  Status field_error(std::string_view key, std::string_view message) const;
  // `config.json: field "a.b": expected <expected>, found <JSON of the value>`.
  Status type_error(std::string_view key, std::string_view expected) const;

 private:
  ConfigObject(std::shared_ptr<const nlohmann::json> root, const nlohmann::json* node,
               std::shared_ptr<const std::string> file_name, std::string path);
  // The field's value, or a "missing" error; null counts as missing.
  Result<const nlohmann::json*> get(std::string_view key) const;
  const nlohmann::json* find(std::string_view key) const;

  std::shared_ptr<const nlohmann::json> root_;
  const nlohmann::json* node_ = nullptr;  // points into *root_
  std::shared_ptr<const std::string> file_name_;
  std::string path_;
};

// rope_scaling (docs/models.md §1.3). Only "yarn" is pinned down; other types are refused by name.
struct RopeScaling {
  std::string type;  // "yarn" ("type" or "rope_type" in the file)
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0;  // default as in DeepSeek's modeling code
  double beta_slow = 1.0;
  double mscale = 1.0;
  double mscale_all_dim = 0.0;  // 0 = attention scale not corrected (DeepSeek default)
};
Result<RopeScaling> parse_rope_scaling(const ConfigObject& rope_scaling);

enum class QuantMethod {
  kNone,
  kFp8Block,  // DeepSeek: F8_E4M3 weights + F32 weight_scale_inv (docs/formats.md §3.3)
  kMxfp4CompressedTensors,  // compressed-tensors mxfp4-pack-quantized (docs/formats.md §3.4)
  kMxfp4GptOss,             // gpt-oss blocks/scales (docs/formats.md §3.5)
};

struct ModuleMatcher;  // compiled ignore patterns (hf_config.cpp)

struct QuantizationConfig {
  QuantMethod method = QuantMethod::kNone;
  // kFp8Block: weight_block_size [rows, cols]; scale_fmt ("ue8m0") or nullopt for plain scales.
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  std::optional<std::string> scale_fmt;
  // kMxfp4CompressedTensors: elements per E8M0 scale; `ignore` patterns ("re:<regex>" or exact
  // module names) are kept as written.
  int64_t group_size = 0;
  std::vector<std::string> ignore;
  // kMxfp4GptOss: modules_to_not_convert.
  std::vector<std::string> modules_to_not_convert;
  // Compiled form of `ignore` / `modules_to_not_convert`, built by the parser.
  std::shared_ptr<const ModuleMatcher> matcher;

  // Whether the compressed-tensors ignore list (or gpt-oss modules_to_not_convert) names the
  // module, e.g. "language_model.model.layers.3.self_attn.q_proj". "re:" patterns match from the
  // start of the name like Python's re.match; other entries must equal the name.
  bool ignores(std::string_view module_name) const;
  // One line for humans: "fp8 e4m3 block 128x128, scale_fmt ue8m0", "none", ...
  std::string describe() const;
};

// Parses a quantization_config object; anything not listed above is refused naming the field.
Result<QuantizationConfig> parse_quantization_config(const ConfigObject& quantization_config);

}  // namespace dz::formats

// Reads field `field` of `obj` into `out.field` with `obj.method("field", extra...)`, so a config
// struct member and its JSON key cannot drift apart. Returns the error from the enclosing function.
#define DZ_READ_CONFIG_FIELD(obj, out, method, field, ...) \
  DZ_ASSIGN_OR_RETURN((out).field, (obj).method(#field __VA_OPT__(, ) __VA_ARGS__))
