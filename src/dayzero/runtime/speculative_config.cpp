#include "dayzero/runtime/speculative_config.h"

#include <limits>
#include <string>

#include <nlohmann/json.hpp>

namespace dz::runtime {

namespace {

using Json = nlohmann::json;

constexpr int64_t kMaxSpeculativeTokens = 16;

Result<int64_t> int_field(const Json& json, const char* key, int64_t min, int64_t max) {
  const Json& value = json.at(key);
  if (!value.is_number_integer())
    return make_error(StatusCode::kInvalidArgument,
                      "--speculative-config: \"{}\" must be an integer, got {}", key, value.dump());
  const auto v = value.get<int64_t>();
  if (v < min || v > max)
    return make_error(StatusCode::kInvalidArgument,
                      "--speculative-config: \"{}\" = {} (want {} to {})", key, v, min, max);
  return v;
}

}  // namespace

std::string_view method_name(SpeculativeMethod method) {
  switch (method) {
    case SpeculativeMethod::kNone:
      return "none";
    case SpeculativeMethod::kNgram:
      return "ngram";
    case SpeculativeMethod::kMtp:
      return "mtp";
  }
  return "?";
}

Result<SpeculativeConfig> parse_speculative_config(std::string_view json_text) {
  SpeculativeConfig config;
  if (json_text.empty()) return config;
  const Json json = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object())
    return make_error(StatusCode::kInvalidArgument, "--speculative-config: not a JSON object: {}",
                      json_text);
  for (const auto& [key, value] : json.items()) {
    if (key != "method" && key != "num_speculative_tokens" && key != "prompt_lookup_min" &&
        key != "prompt_lookup_max" && key != "disable_by_batch_size")
      return make_error(StatusCode::kInvalidArgument,
                        "--speculative-config: unknown key \"{}\" (known: method, "
                        "num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, "
                        "disable_by_batch_size)",
                        key);
  }
  if (!json.contains("method") || !json.at("method").is_string())
    return make_error(StatusCode::kInvalidArgument,
                      "--speculative-config: \"method\" must be \"ngram\" or \"mtp\"");
  const std::string method = json.at("method").get<std::string>();
  if (method == "ngram")
    config.method = SpeculativeMethod::kNgram;
  else if (method == "mtp")
    config.method = SpeculativeMethod::kMtp;
  else
    return make_error(StatusCode::kInvalidArgument,
                      "--speculative-config: method \"{}\" (want \"ngram\" or \"mtp\")", method);
  if (!json.contains("num_speculative_tokens"))
    return make_error(StatusCode::kInvalidArgument,
                      "--speculative-config: \"num_speculative_tokens\" is required");
  DZ_ASSIGN_OR_RETURN(const int64_t k,
                      int_field(json, "num_speculative_tokens", 1, kMaxSpeculativeTokens));
  config.ngram.num_speculative_tokens = static_cast<int32_t>(k);
  const bool has_min = json.contains("prompt_lookup_min");
  const bool has_max = json.contains("prompt_lookup_max");
  if ((has_min || has_max) && config.method != SpeculativeMethod::kNgram)
    return make_error(StatusCode::kInvalidArgument,
                      "--speculative-config: prompt_lookup_min/max are for method \"ngram\"");
  // vLLM: one bound given sets the other; neither gives 5 and 5.
  constexpr int64_t kMaxLookup = 64;
  int64_t min_n = 5, max_n = 5;
  if (has_min) {
    DZ_ASSIGN_OR_RETURN(min_n, int_field(json, "prompt_lookup_min", 1, kMaxLookup));
    if (!has_max) max_n = min_n;
  }
  if (has_max) {
    DZ_ASSIGN_OR_RETURN(max_n, int_field(json, "prompt_lookup_max", 1, kMaxLookup));
    if (!has_min) min_n = max_n;
  }
  config.ngram.min_n = static_cast<int32_t>(min_n);
  config.ngram.max_n = static_cast<int32_t>(max_n);
  DZ_RETURN_IF_ERROR(validate_ngram_config(config.ngram));
  if (json.contains("disable_by_batch_size")) {
    DZ_ASSIGN_OR_RETURN(
        config.disable_by_batch_size,
        int_field(json, "disable_by_batch_size", 1, std::numeric_limits<int32_t>::max()));
  }
  return config;
}

}  // namespace dz::runtime
