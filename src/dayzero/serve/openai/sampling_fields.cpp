#include "dayzero/serve/openai/sampling_fields.h"

#include <cctype>
#include <charconv>
#include <limits>
#include <string_view>

#include <fmt/format.h>

#include "dayzero/serve/openai/json_fields.h"

namespace dz::serve::openai {
namespace {

constexpr int32_t kInt32Min = std::numeric_limits<int32_t>::min();
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

void read_stream_options(FieldReader& reader, StreamOptions& out) {
  const nlohmann::json* value = reader.find("stream_options");
  if (value == nullptr || !reader.ok()) return;
  if (!value->is_object()) return reader.fail_type("stream_options", *value, "an object");
  FieldReader options(*value, "stream_options.");
  options.read_bool("include_usage", out.include_usage);
  options.read_bool("continuous_usage_stats", out.continuous_usage_stats);
  reader.adopt(options.take_error());
}

void read_stop(FieldReader& reader, const ParseLimits& limits, std::vector<std::string>& out) {
  const nlohmann::json* value = reader.find("stop");
  if (value == nullptr || !reader.ok()) return;
  const auto add = [&](const nlohmann::json& item) {
    if (!item.is_string()) return reader.fail_type("stop", item, "a string or a list of strings");
    const auto& text = item.get_ref<const std::string&>();
    if (static_cast<int64_t>(text.size()) > limits.max_stop_string_bytes)
      return reader.fail("stop", fmt::format("stop strings must be at most {} bytes, got {}",
                                             limits.max_stop_string_bytes, text.size()));
    out.push_back(text);
  };
  if (!value->is_array()) return add(*value);
  if (static_cast<int64_t>(value->size()) > limits.max_stop_strings)
    return reader.fail("stop", fmt::format("stop has {} strings, at most {} are allowed",
                                           value->size(), limits.max_stop_strings));
  for (const nlohmann::json& item : *value) add(item);
}

void read_stop_token_ids(FieldReader& reader, const ParseLimits& limits,
                         std::vector<int32_t>& out) {
  const nlohmann::json* value = reader.find("stop_token_ids");
  if (value == nullptr || !reader.ok()) return;
  if (!value->is_array()) return reader.fail_type("stop_token_ids", *value, "a list of token ids");
  if (static_cast<int64_t>(value->size()) > limits.max_stop_token_ids)
    return reader.fail("stop_token_ids", fmt::format("stop_token_ids has {} ids, at most {}",
                                                     value->size(), limits.max_stop_token_ids));
  for (const nlohmann::json& item : *value) {
    const std::optional<int64_t> id = json_to_int64(item);
    if (!id || *id < 0 || *id > kInt32Max)
      return reader.fail("stop_token_ids",
                         fmt::format("stop_token_ids: expected token ids, got {}", item.dump()));
    out.push_back(static_cast<int32_t>(*id));
  }
}

// {"<token id>": bias, ...}: keys are decimal ids, as OpenAI's tokenizer-id keys.
void read_logit_bias(FieldReader& reader, const ParseLimits& limits,
                     std::vector<std::pair<int32_t, float>>& out) {
  const nlohmann::json* value = reader.find("logit_bias");
  if (value == nullptr || !reader.ok()) return;
  if (!value->is_object())
    return reader.fail_type("logit_bias", *value, "an object of token id to bias");
  if (static_cast<int64_t>(value->size()) > limits.max_logit_bias)
    return reader.fail("logit_bias", fmt::format("logit_bias has {} entries, at most {}",
                                                 value->size(), limits.max_logit_bias));
  for (const auto& [key, bias] : value->items()) {
    int32_t id = -1;
    const char* end = key.data() + key.size();
    const auto [ptr, ec] = std::from_chars(key.data(), end, id);
    if (key.empty() || ec != std::errc() || ptr != end || id < 0)
      return reader.fail("logit_bias",
                         fmt::format("logit_bias keys must be token ids, got \"{}\"", key));
    if (!bias.is_number())
      return reader.fail("logit_bias", fmt::format("logit_bias of token {}: expected a number, "
                                                   "got {}",
                                                   key, json_type_phrase(bias)));
    const double d = bias.get<double>();
    // Checked here and not only by the sampler: narrowing a huge double to float is undefined.
    if (!(d >= -runtime::kMaxLogitBias && d <= runtime::kMaxLogitBias))
      return reader.fail(
          "logit_bias",
          fmt::format("logit_bias of token {} must be in [-100, 100], got {}", key, bias.dump()));
    out.emplace_back(id, static_cast<float>(d));
  }
}

void read_seed(FieldReader& reader, std::optional<uint64_t>& out) {
  const nlohmann::json* value = reader.find("seed");
  if (value == nullptr || !reader.ok()) return;
  if (value->is_number_unsigned()) {
    out = value->get<uint64_t>();
  } else if (const std::optional<int64_t> v = json_to_int64(*value)) {
    out = static_cast<uint64_t>(*v);  // negative seeds keep their two's-complement bits
  } else {
    reader.fail_type("seed", *value, "an integer");
  }
}

// The field a validate_sampling_params message starts with ("top_p must be ...", "stop: ...").
std::optional<std::string> leading_field(std::string_view message) {
  size_t end = 0;
  while (end < message.size() &&
         (std::islower(static_cast<unsigned char>(message[end])) != 0 || message[end] == '_'))
    ++end;
  if (end == 0) return std::nullopt;
  return std::string(message.substr(0, end));
}

}  // namespace

std::optional<ApiError> read_sampling_fields(const nlohmann::json& body, const ParseLimits& limits,
                                             SamplingFields& out) {
  FieldReader reader(body);
  const nlohmann::json* model = reader.find("model");
  if (model == nullptr) return ApiError::invalid_value("model", "model is required");
  reader.read_string("model", out.model);
  reader.read_bool("stream", out.stream);
  read_stream_options(reader, out.stream_options);

  runtime::SamplingParams& s = out.sampling;
  out.temperature_set = reader.read_float("temperature", s.temperature);
  out.top_p_set = reader.read_float("top_p", s.top_p);
  out.top_k_set = reader.read_int("top_k", s.top_k, kInt32Min, kInt32Max);
  out.min_p_set = reader.read_float("min_p", s.min_p);
  out.repetition_penalty_set = reader.read_float("repetition_penalty", s.repetition_penalty);
  reader.read_float("presence_penalty", s.presence_penalty);
  reader.read_float("frequency_penalty", s.frequency_penalty);
  read_logit_bias(reader, limits, s.logit_bias);
  read_seed(reader, out.seed);
  if (out.seed) s.seed = *out.seed;
  read_stop(reader, limits, s.stop);
  read_stop_token_ids(reader, limits, s.stop_token_ids);
  reader.read_bool("ignore_eos", s.ignore_eos);
  reader.read_bool("include_stop_str_in_output", s.include_stop_str_in_output);
  reader.read_int("min_tokens", s.min_tokens, 0, kInt64Max);

  int64_t max_tokens = 0;
  if (reader.read_int("max_tokens", max_tokens, 1, kInt64Max)) out.max_tokens = max_tokens;
  if (reader.read_int("max_completion_tokens", max_tokens, 1, kInt64Max))
    out.max_tokens = max_tokens;
  reader.read_int("n", out.n, 1, limits.max_n);
  reader.read_bool("skip_special_tokens", out.skip_special_tokens);
  reader.read_int("priority", out.priority, kInt32Min, kInt32Max);
  if (reader.read_string("cache_salt", out.cache_salt) && out.cache_salt.empty())
    reader.fail("cache_salt", "cache_salt must be a non-empty string when given");
  // `user` is accepted and ignored (OpenAI's abuse-monitoring tag).
  return reader.take_error();
}

std::optional<ApiError> validate_sampling_fields(const SamplingFields& fields,
                                                 const ParseLimits& limits) {
  if (fields.max_tokens && fields.sampling.min_tokens > *fields.max_tokens)
    return ApiError::invalid_value("min_tokens",
                                   fmt::format("min_tokens ({}) must not exceed max_tokens ({})",
                                               fields.sampling.min_tokens, *fields.max_tokens));
  const Status status = runtime::validate_sampling_params(fields.sampling, limits.vocab_size);
  if (status.ok()) return std::nullopt;
  ApiError error = ApiError::invalid_value("", status.message());
  error.param = leading_field(status.message());
  return error;
}

}  // namespace dz::serve::openai
