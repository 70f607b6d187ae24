#include "dayzero/serve/openai/completion_request.h"

#include <limits>
#include <utility>

#include <fmt/format.h>

#include "dayzero/serve/openai/json_fields.h"

namespace dz::serve::openai {
namespace {

// A list of token ids → ids, or the error's message.
std::variant<std::vector<int32_t>, std::string> read_token_ids(const nlohmann::json& list,
                                                               int64_t vocab_size) {
  if (list.empty()) return std::string("a token-id prompt must not be empty");
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  const int64_t max_id =
      vocab_size > 0 ? vocab_size - 1 : int64_t{std::numeric_limits<int32_t>::max()};
  for (const nlohmann::json& item : list) {
    const std::optional<int64_t> id = json_to_int64(item);
    if (!id) return fmt::format("expected token ids, got {}", json_type_phrase(item));
    if (*id < 0 || *id > max_id)
      return fmt::format("token id {} is outside the vocabulary [0, {}]", *id, max_id);
    ids.push_back(static_cast<int32_t>(*id));
  }
  return ids;
}

void read_prompts(FieldReader& reader, const ParseLimits& limits,
                  std::vector<CompletionPrompt>& out) {
  const nlohmann::json* prompt = reader.find("prompt");
  if (!reader.ok()) return;
  if (prompt == nullptr) return reader.fail("prompt", "prompt is required");
  if (prompt->is_string()) {
    if (prompt->get_ref<const std::string&>().empty())
      return reader.fail("prompt", "prompt must not be empty");
    out.emplace_back(prompt->get<std::string>());
    return;
  }
  if (!prompt->is_array())
    return reader.fail_type("prompt", *prompt,
                            "a string, a list of strings, a list of token ids or a list of lists");
  if (prompt->empty()) return reader.fail("prompt", "prompt must not be an empty list");
  // A flat list of numbers is one token-id prompt; otherwise each entry is one prompt.
  if ((*prompt)[0].is_number()) {
    auto ids = read_token_ids(*prompt, limits.vocab_size);
    if (auto* message = std::get_if<std::string>(&ids))
      return reader.fail("prompt", "prompt: " + *message);
    out.emplace_back(std::get<std::vector<int32_t>>(std::move(ids)));
    return;
  }
  if (static_cast<int64_t>(prompt->size()) > limits.max_prompts)
    return reader.fail("prompt", fmt::format("prompt has {} entries, at most {} are allowed",
                                             prompt->size(), limits.max_prompts));
  const bool strings = (*prompt)[0].is_string();
  for (size_t i = 0; i < prompt->size(); ++i) {
    const std::string field = fmt::format("prompt[{}]", i);
    const nlohmann::json& item = (*prompt)[i];
    if (strings) {
      if (!item.is_string())
        return reader.fail_type(field, item, "a string (the list holds strings)");
      if (item.get_ref<const std::string&>().empty())
        return reader.fail(field, field + " must not be empty");
      out.emplace_back(item.get<std::string>());
    } else {
      if (!item.is_array())
        return reader.fail_type(field, item, "a list of token ids (the list holds lists)");
      auto ids = read_token_ids(item, limits.vocab_size);
      if (auto* message = std::get_if<std::string>(&ids))
        return reader.fail(field, field + ": " + *message);
      out.emplace_back(std::get<std::vector<int32_t>>(std::move(ids)));
    }
  }
}

}  // namespace

std::variant<CompletionRequest, ApiError> parse_completion_request(std::string_view body,
                                                                   const ParseLimits& limits) {
  std::variant<nlohmann::json, ApiError> parsed = parse_json_object(body, limits.max_json_depth);
  if (auto* error = std::get_if<ApiError>(&parsed)) return std::move(*error);
  const nlohmann::json& object = std::get<nlohmann::json>(parsed);

  CompletionRequest request;
  if (auto error = read_sampling_fields(object, limits, request.fields)) return *std::move(error);

  FieldReader reader(object);
  read_prompts(reader, limits, request.prompts);
  reader.read_bool("echo", request.echo);
  int32_t logprobs = 0;
  if (reader.read_int("logprobs", logprobs, 0, limits.max_completion_logprobs)) {
    request.fields.sampling.logprobs = true;
    request.fields.sampling.top_logprobs = logprobs;
  }
  if (reader.ok() && reader.find("suffix") != nullptr)
    reader.fail("suffix", "suffix is not supported");
  int64_t best_of = 1;
  if (reader.read_int("best_of", best_of, 1, std::numeric_limits<int64_t>::max()) && best_of != 1)
    reader.fail("best_of", "best_of is not supported (only 1)");
  if (auto error = reader.take_error()) return *std::move(error);
  if (auto error = validate_sampling_fields(request.fields, limits)) return *std::move(error);
  return request;
}

}  // namespace dz::serve::openai
