#include "dayzero/cli/prompts_file.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

namespace dz::cli {
namespace {

using nlohmann::json;

// Errors of one line: `FILE line N: field "x": message`.
class LineContext {
 public:
  LineContext(std::string_view file_name, int64_t line_number)
      : file_name_(file_name), line_number_(line_number) {}

  Status error(std::string_view message) const {
    return make_error(StatusCode::kInvalidArgument, "{} line {}: {}", file_name_, line_number_,
                      message);
  }
  Status field_error(std::string_view key, std::string_view expected, const json& value) const {
    return make_error(StatusCode::kInvalidArgument,
                      "{} line {}: field \"{}\": expected {}, found {}", file_name_, line_number_,
                      key, expected, value.dump(-1, ' ', false, json::error_handler_t::replace));
  }

 private:
  std::string_view file_name_;
  int64_t line_number_;
};

Result<double> get_number(const LineContext& at, const std::string& key, const json& value) {
  if (!value.is_number()) return at.field_error(key, "a number", value);
  return value.get<double>();
}

Result<int64_t> get_int(const LineContext& at, const std::string& key, const json& value,
                        int64_t min, int64_t max) {
  if (value.is_number_integer()) {
    // Unsigned values above INT64_MAX are refused like any other out-of-range value.
    if (value.is_number_unsigned() &&
        value.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return at.field_error(key, fmt::format("an integer in [{}, {}]", min, max), value);
    const auto v = value.get<int64_t>();
    if (v >= min && v <= max) return v;
  }
  return at.field_error(key, fmt::format("an integer in [{}, {}]", min, max), value);
}

Result<std::vector<std::string>> get_stop(const LineContext& at, const json& value) {
  if (value.is_string()) return std::vector<std::string>{value.get<std::string>()};
  if (!value.is_array()) return at.field_error("stop", "a string or a list of strings", value);
  std::vector<std::string> stops;
  for (const json& item : value) {
    if (!item.is_string()) return at.field_error("stop", "a string or a list of strings", value);
    stops.push_back(item.get<std::string>());
  }
  return stops;
}

Result<std::vector<int32_t>> get_ids(const LineContext& at, const json& value) {
  constexpr const char* kExpected = "a non-empty list of token ids (non-negative integers)";
  if (!value.is_array() || value.empty())
    return at.field_error("prompt_token_ids", kExpected, value);
  std::vector<int32_t> ids;
  for (const json& item : value) {
    if (!item.is_number_integer() || item.get<int64_t>() < 0 ||
        item.get<int64_t>() > std::numeric_limits<int32_t>::max())
      return at.field_error("prompt_token_ids", kExpected, value);
    ids.push_back(static_cast<int32_t>(item.get<int64_t>()));
  }
  return ids;
}

Status apply_field(const LineContext& at, const std::string& key, const json& value,
                   PromptLine& line) {
  runtime::SamplingParams& s = line.sampling;
  auto set_float = [&](float& field) -> Status {
    DZ_ASSIGN_OR_RETURN(double v, get_number(at, key, value));
    field = static_cast<float>(v);
    return Status::ok_status();
  };
  if (key == "prompt") {
    if (!value.is_string()) return at.field_error(key, "a string", value);
    line.prompt = value.get<std::string>();
  } else if (key == "prompt_token_ids") {
    DZ_ASSIGN_OR_RETURN(line.prompt_token_ids, get_ids(at, value));
  } else if (key == "images") {
    if (!value.is_array()) return at.field_error(key, "a list of image file names", value);
    for (const json& name : value) {
      if (!name.is_string()) return at.field_error(key, "a list of image file names", value);
      line.images.push_back(name.get<std::string>());
    }
  } else if (key == "max_tokens") {
    DZ_ASSIGN_OR_RETURN(line.max_tokens,
                        get_int(at, key, value, 1, std::numeric_limits<int32_t>::max()));
  } else if (key == "temperature") {
    return set_float(s.temperature);
  } else if (key == "top_p") {
    return set_float(s.top_p);
  } else if (key == "min_p") {
    return set_float(s.min_p);
  } else if (key == "repetition_penalty") {
    return set_float(s.repetition_penalty);
  } else if (key == "presence_penalty") {
    return set_float(s.presence_penalty);
  } else if (key == "frequency_penalty") {
    return set_float(s.frequency_penalty);
  } else if (key == "top_k") {
    DZ_ASSIGN_OR_RETURN(int64_t k, get_int(at, key, value, std::numeric_limits<int32_t>::min(),
                                           std::numeric_limits<int32_t>::max()));
    s.top_k = static_cast<int32_t>(k);
  } else if (key == "seed") {
    DZ_ASSIGN_OR_RETURN(int64_t seed,
                        get_int(at, key, value, 0, std::numeric_limits<int64_t>::max()));
    s.seed = static_cast<uint64_t>(seed);
  } else if (key == "priority") {
    DZ_ASSIGN_OR_RETURN(int64_t priority,
                        get_int(at, key, value, std::numeric_limits<int32_t>::min(),
                                std::numeric_limits<int32_t>::max()));
    line.priority = static_cast<int32_t>(priority);
  } else if (key == "stop") {
    DZ_ASSIGN_OR_RETURN(s.stop, get_stop(at, value));
  } else {
    return at.error(
        fmt::format("unknown field \"{}\" (expected prompt or prompt_token_ids, and optionally "
                    "images, max_tokens, "
                    "temperature, top_p, top_k, min_p, seed, stop, priority, repetition_penalty, "
                    "presence_penalty, frequency_penalty)",
                    key));
  }
  return Status::ok_status();
}

Result<PromptLine> parse_line(std::string_view text, const LineContext& at,
                              const PromptDefaults& defaults) {
  json object;
  try {
    object = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return at.error(fmt::format("not valid JSON ({})", e.what()));
  }
  if (!object.is_object()) return at.error("expected a JSON object such as {\"prompt\": \"...\"}");
  PromptLine line;
  line.sampling = defaults.sampling;
  line.max_tokens = defaults.max_tokens;
  for (const auto& [key, value] : object.items())
    DZ_RETURN_IF_ERROR(apply_field(at, key, value, line));
  const bool has_text = line.prompt.has_value();
  const bool has_ids = object.contains("prompt_token_ids");
  if (has_text == has_ids)
    return at.error("give exactly one of the fields \"prompt\" and \"prompt_token_ids\"");
  if (Status status = runtime::validate_sampling_params(line.sampling); !status.ok())
    return at.error(status.message());
  return line;
}

}  // namespace

Result<std::vector<PromptLine>> parse_prompts(std::string_view text, std::string_view file_name,
                                              const PromptDefaults& defaults) {
  std::vector<PromptLine> lines;
  int64_t line_number = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view raw = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (raw.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const LineContext at(file_name, line_number);
    DZ_ASSIGN_OR_RETURN(PromptLine line, parse_line(raw, at, defaults));
    line.line_number = line_number;
    lines.push_back(std::move(line));
  }
  if (lines.empty())
    return make_error(StatusCode::kInvalidArgument, "{}: no prompts (one JSON object per line)",
                      file_name);
  return lines;
}

Result<std::vector<PromptLine>> load_prompts_file(const std::string& path,
                                                  const PromptDefaults& defaults) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return make_error(StatusCode::kIo, "{}: cannot open the prompts file", path);
  std::ostringstream buffer;
  buffer << file.rdbuf();
  return parse_prompts(buffer.str(), path, defaults);
}

}  // namespace dz::cli
