#include "dayzero/runtime/generation_config.h"

#include <algorithm>
#include <fstream>
#include <type_traits>

#include <nlohmann/json.hpp>

namespace dz::runtime {
namespace {

using Json = nlohmann::json;

// nullopt when the file does not exist.
Result<std::optional<Json>> read_json(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::optional<Json>();
  Json json = Json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    return make_error(StatusCode::kInvalidArgument, "{}: not a JSON object", path);
  return std::optional<Json>(std::move(json));
}

Status add_ids(const Json& object, const char* field, const std::string& path,
               std::vector<int32_t>& ids) {
  if (!object.contains(field) || object[field].is_null()) return Status::ok_status();
  const Json& value = object[field];
  auto add_one = [&](const Json& item) -> Status {
    if (!item.is_number_integer() || item.get<int64_t>() < 0 || item.get<int64_t>() > INT32_MAX)
      return make_error(StatusCode::kInvalidArgument,
                        "{}: {} must be a non-negative integer or a list of them, got {}", path,
                        field, value.dump());
    ids.push_back(item.get<int32_t>());
    return Status::ok_status();
  };
  if (value.is_array()) {
    for (const Json& item : value) DZ_RETURN_IF_ERROR(add_one(item));
    return Status::ok_status();
  }
  return add_one(value);
}

template <typename T>
Status read_number(const Json& object, const char* field, const std::string& path,
                   std::optional<T>& out) {
  if (!object.contains(field) || object[field].is_null()) return Status::ok_status();
  const Json& value = object[field];
  const bool ok = std::is_integral_v<T> ? value.is_number_integer() : value.is_number();
  if (!ok)
    return make_error(StatusCode::kInvalidArgument, "{}: {} must be a number, got {}", path, field,
                      value.dump());
  out = value.get<T>();
  return Status::ok_status();
}

}  // namespace

Result<GenerationDefaults> load_generation_defaults(const std::string& model_dir) {
  GenerationDefaults out;
  const std::string config_path = model_dir + "/config.json";
  DZ_ASSIGN_OR_RETURN(std::optional<Json> config, read_json(config_path));
  if (!config) return make_error(StatusCode::kNotFound, "{}: not found", config_path);
  std::vector<const Json*> sources = {&*config};
  if (config->contains("text_config") && (*config)["text_config"].is_object())
    sources.push_back(&(*config)["text_config"]);
  std::vector<int32_t> bos;
  for (const Json* source : sources) {
    DZ_RETURN_IF_ERROR(add_ids(*source, "eos_token_id", config_path, out.eos_token_ids));
    DZ_RETURN_IF_ERROR(add_ids(*source, "bos_token_id", config_path, bos));
  }
  const std::string generation_path = model_dir + "/generation_config.json";
  DZ_ASSIGN_OR_RETURN(std::optional<Json> generation, read_json(generation_path));
  if (generation) {
    DZ_RETURN_IF_ERROR(add_ids(*generation, "eos_token_id", generation_path, out.eos_token_ids));
    DZ_RETURN_IF_ERROR(read_number(*generation, "temperature", generation_path, out.temperature));
    DZ_RETURN_IF_ERROR(read_number(*generation, "top_p", generation_path, out.top_p));
    DZ_RETURN_IF_ERROR(read_number(*generation, "top_k", generation_path, out.top_k));
    DZ_RETURN_IF_ERROR(read_number(*generation, "min_p", generation_path, out.min_p));
    DZ_RETURN_IF_ERROR(
        read_number(*generation, "repetition_penalty", generation_path, out.repetition_penalty));
    DZ_RETURN_IF_ERROR(add_ids(*generation, "bos_token_id", generation_path, bos));
  }
  if (!bos.empty()) out.bos_token_id = bos.front();
  const std::string tokenizer_path = model_dir + "/tokenizer_config.json";
  DZ_ASSIGN_OR_RETURN(std::optional<Json> tokenizer, read_json(tokenizer_path));
  if (tokenizer && tokenizer->contains("add_bos_token")) {
    const Json& add = (*tokenizer)["add_bos_token"];
    if (!add.is_boolean())
      return make_error(StatusCode::kInvalidArgument, "{}: add_bos_token must be a boolean, got {}",
                        tokenizer_path, add.dump());
    out.add_bos_token = add.get<bool>();
  }
  std::sort(out.eos_token_ids.begin(), out.eos_token_ids.end());
  out.eos_token_ids.erase(std::unique(out.eos_token_ids.begin(), out.eos_token_ids.end()),
                          out.eos_token_ids.end());
  return out;
}

void apply_generation_defaults(SamplingParams& s, const SamplingFieldsGiven& given,
                               const GenerationDefaults& defaults) {
  if (!given.temperature && defaults.temperature) s.temperature = *defaults.temperature;
  if (!given.top_p && defaults.top_p) s.top_p = *defaults.top_p;
  if (!given.top_k && defaults.top_k) s.top_k = *defaults.top_k;
  if (!given.min_p && defaults.min_p) s.min_p = *defaults.min_p;
  if (!given.repetition_penalty && defaults.repetition_penalty)
    s.repetition_penalty = *defaults.repetition_penalty;
}

}  // namespace dz::runtime
