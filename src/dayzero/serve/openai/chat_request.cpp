#include "dayzero/serve/openai/chat_request.h"

#include <array>
#include <utility>

#include <fmt/format.h>

#include "dayzero/serve/openai/json_fields.h"

namespace dz::serve::openai {
namespace {

constexpr std::array<std::string_view, 5> kRoles = {"system", "developer", "user", "assistant",
                                                    "tool"};

// An image part's URL: {"type":"image_url","image_url":{"url":...}} (OpenAI), the URL as a bare
// string there (vLLM accepts both), or {"type":"input_image","image_url":...} (Responses API).
void read_image_url(FieldReader& part_reader, std::string& url, std::string& param) {
  const nlohmann::json* value = part_reader.find("image_url");
  if (value == nullptr)
    return part_reader.fail("image_url", part_reader.param("image_url") + " is required");
  if (value->is_string()) {
    url = value->get<std::string>();
    param = part_reader.param("image_url");
    return;
  }
  if (!value->is_object())
    return part_reader.fail_type("image_url", *value, "an object with a url, or a URL string");
  FieldReader url_reader(*value, part_reader.param("image_url") + ".");
  if (!url_reader.read_string("url", url) && url_reader.ok())
    url_reader.fail("url", url_reader.param("url") + " is required");
  std::string detail;  // "auto" | "low" | "high": OpenAI's resolution hint; K3 has one rule
  url_reader.read_string("detail", detail);
  param = url_reader.param("url");
  part_reader.adopt(url_reader.take_error());
}

// Content parts → text, joined with "\n" as vLLM's "string" content format does; an image part
// joins as an empty text whose offset the image keeps (the server puts the model's image text
// there, docs/serving.md §5.6).
void read_content_parts(FieldReader& reader, const nlohmann::json& parts, const std::string& role,
                        std::string& out, std::vector<ChatImagePart>& images) {
  for (size_t j = 0; j < parts.size() && reader.ok(); ++j) {
    const std::string field = fmt::format("content[{}]", j);
    const nlohmann::json& part = parts[j];
    if (!part.is_object()) return reader.fail_type(field, part, "a content part object");
    FieldReader part_reader(part, reader.param(field) + ".");
    std::string type;
    if (!part_reader.read_string("type", type)) {
      if (part_reader.ok()) part_reader.fail("type", part_reader.param("type") + " is required");
      return reader.adopt(part_reader.take_error());
    }
    if (j > 0) out += '\n';
    if (type == "text") {
      std::string text;
      if (!part_reader.read_string("text", text) && part_reader.ok())
        part_reader.fail("text", part_reader.param("text") + " is required");
      out += text;
    } else if (type == "image_url" || type == "input_image") {
      if (role != "user")
        part_reader.fail("type", fmt::format("images are allowed in user messages only, not in "
                                             "a \"{}\" message",
                                             role));
      ChatImagePart image{.offset = out.size(), .url = {}, .param = {}};
      if (part_reader.ok()) read_image_url(part_reader, image.url, image.param);
      if (part_reader.ok()) images.push_back(std::move(image));
    } else {
      part_reader.fail("type", fmt::format("unsupported content part type \"{}\"", type));
    }
    reader.adopt(part_reader.take_error());
  }
}

void read_tool_calls(FieldReader& reader, const nlohmann::json& calls) {
  if (!calls.is_array()) return reader.fail_type("tool_calls", calls, "a list of tool calls");
  for (size_t k = 0; k < calls.size() && reader.ok(); ++k) {
    const std::string field = fmt::format("tool_calls[{}]", k);
    const nlohmann::json& call = calls[k];
    if (!call.is_object()) return reader.fail_type(field, call, "a tool call object");
    FieldReader call_reader(call, reader.param(field) + ".");
    std::string ignored;
    call_reader.read_string("id", ignored);
    call_reader.read_string("type", ignored);
    const nlohmann::json* function = call_reader.find("function");
    if (call_reader.ok() && (function == nullptr || !function->is_object())) {
      call_reader.fail("function", call_reader.param("function") + ": expected an object");
    } else if (call_reader.ok()) {
      FieldReader function_reader(*function, call_reader.param("function") + ".");
      if (!function_reader.read_string("name", ignored) && function_reader.ok())
        function_reader.fail("name", function_reader.param("name") + " is required");
      const nlohmann::json* arguments = function_reader.find("arguments");
      if (arguments != nullptr && !arguments->is_string() && !arguments->is_object())
        function_reader.fail_type("arguments", *arguments, "a JSON string");
      call_reader.adopt(function_reader.take_error());
    }
    reader.adopt(call_reader.take_error());
  }
}

std::optional<ApiError> read_message(const nlohmann::json& value, size_t index, ChatMessage& out) {
  const std::string self = fmt::format("messages[{}]", index);
  if (!value.is_object())
    return ApiError::invalid_value(
        self, fmt::format("{}: expected a message object, got {}", self, json_type_phrase(value)));
  FieldReader reader(value, self + ".");
  if (!reader.read_string("role", out.role)) {
    if (reader.ok()) reader.fail("role", reader.param("role") + " is required");
    return reader.take_error();
  }
  bool known = false;
  for (std::string_view role : kRoles) known = known || out.role == role;
  if (!known)
    return ApiError::invalid_value(
        reader.param("role"),
        fmt::format("{} must be one of system, developer, user, assistant, tool; got \"{}\"",
                    reader.param("role"), out.role));

  const nlohmann::json* content = reader.find("content");
  if (content == nullptr) {
    if (out.role != "assistant")
      reader.fail("content",
                  fmt::format("{} is required for role \"{}\"", reader.param("content"), out.role));
  } else if (content->is_string()) {
    out.content = content->get<std::string>();
  } else if (content->is_array()) {
    out.content.emplace();
    read_content_parts(reader, *content, out.role, *out.content, out.images);
  } else {
    reader.fail_type("content", *content, "a string or a list of content parts");
  }
  reader.read_string("name", out.name);
  reader.read_string("reasoning_content", out.reasoning_content);
  reader.read_string("tool_call_id", out.tool_call_id);
  if (const nlohmann::json* calls = reader.find("tool_calls"); calls != nullptr && reader.ok()) {
    read_tool_calls(reader, *calls);
    if (reader.ok()) out.tool_calls = *calls;
  }
  return reader.take_error();
}

void read_tools(FieldReader& reader, const ParseLimits& limits, nlohmann::json& out) {
  const nlohmann::json* tools = reader.find("tools");
  if (tools == nullptr || !reader.ok()) return;
  if (!tools->is_array()) return reader.fail_type("tools", *tools, "a list of tools");
  if (static_cast<int64_t>(tools->size()) > limits.max_tools)
    return reader.fail("tools", fmt::format("tools has {} entries, at most {} are allowed",
                                            tools->size(), limits.max_tools));
  for (size_t k = 0; k < tools->size() && reader.ok(); ++k) {
    const std::string field = fmt::format("tools[{}]", k);
    const nlohmann::json& tool = (*tools)[k];
    if (!tool.is_object()) return reader.fail_type(field, tool, "a tool object");
    FieldReader tool_reader(tool, field + ".");
    std::string type;
    tool_reader.read_string("type", type);
    if (tool_reader.ok() && type != "function")
      tool_reader.fail("type",
                       fmt::format("{}.type must be \"function\", got \"{}\"", field, type));
    const nlohmann::json* function = tool_reader.find("function");
    if (tool_reader.ok() && (function == nullptr || !function->is_object())) {
      tool_reader.fail("function", field + ".function: expected an object");
    } else if (tool_reader.ok()) {
      FieldReader function_reader(*function, field + ".function.");
      std::string name;
      std::string description;
      if (!function_reader.read_string("name", name) && function_reader.ok())
        function_reader.fail("name", field + ".function.name is required");
      function_reader.read_string("description", description);
      const nlohmann::json* parameters = function_reader.find("parameters");
      if (parameters != nullptr && !parameters->is_object())
        function_reader.fail_type("parameters", *parameters, "a JSON schema object");
      tool_reader.adopt(function_reader.take_error());
    }
    reader.adopt(tool_reader.take_error());
  }
  if (reader.ok()) out = *tools;
}

bool has_tool(const nlohmann::json& tools, const std::string& name) {
  if (!tools.is_array()) return false;
  for (const nlohmann::json& tool : tools)
    if (tool.at("function").at("name") == name) return true;  // checked by read_tools
  return false;
}

void read_tool_choice(FieldReader& reader, const nlohmann::json& tools, nlohmann::json& out) {
  const nlohmann::json* choice = reader.find("tool_choice");
  if (choice == nullptr || !reader.ok()) return;
  if (choice->is_string()) {
    const auto& mode = choice->get_ref<const std::string&>();
    if (mode != "none" && mode != "auto" && mode != "required")
      return reader.fail("tool_choice",
                         fmt::format("tool_choice must be \"none\", \"auto\", \"required\" or a "
                                     "named function, got \"{}\"",
                                     mode));
    if (mode == "required" && tools.is_null())
      return reader.fail("tool_choice", "tool_choice \"required\" needs tools");
  } else if (choice->is_object()) {
    const nlohmann::json* function =
        choice->contains("function") ? &(*choice)["function"] : nullptr;
    const bool named = choice->contains("type") && (*choice)["type"] == "function" &&
                       function != nullptr && function->is_object() && function->contains("name") &&
                       (*function)["name"].is_string();
    if (!named)
      return reader.fail("tool_choice",
                         "tool_choice objects must be "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}");
    const auto& name = (*function)["name"].get_ref<const std::string&>();
    if (!has_tool(tools, name))
      return reader.fail("tool_choice",
                         fmt::format("tool_choice names the function \"{}\", which is not in "
                                     "tools",
                                     name));
  } else {
    return reader.fail_type("tool_choice", *choice, "a string or an object");
  }
  out = *choice;
}

}  // namespace

std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body,
                                                       const ParseLimits& limits) {
  std::variant<nlohmann::json, ApiError> parsed = parse_json_object(body, limits.max_json_depth);
  if (auto* error = std::get_if<ApiError>(&parsed)) return std::move(*error);
  const nlohmann::json& object = std::get<nlohmann::json>(parsed);

  ChatRequest request;
  if (auto error = read_sampling_fields(object, limits, request.fields)) return *std::move(error);

  FieldReader reader(object);
  const nlohmann::json* messages = reader.find("messages");
  if (messages == nullptr) return ApiError::invalid_value("messages", "messages is required");
  if (!messages->is_array()) {
    reader.fail_type("messages", *messages, "a list of messages");
    return *reader.take_error();
  }
  if (messages->empty())
    return ApiError::invalid_value("messages", "messages must contain at least one message");
  if (static_cast<int64_t>(messages->size()) > limits.max_messages)
    return ApiError::invalid_value(
        "messages", fmt::format("messages has {} entries, at most {} are allowed", messages->size(),
                                limits.max_messages));
  request.messages.resize(messages->size());
  for (size_t i = 0; i < messages->size(); ++i)
    if (auto error = read_message((*messages)[i], i, request.messages[i])) return *std::move(error);

  runtime::SamplingParams& sampling = request.fields.sampling;
  reader.read_bool("logprobs", sampling.logprobs);
  if (reader.read_int("top_logprobs", sampling.top_logprobs, 0, runtime::kMaxTopLogprobs) &&
      !sampling.logprobs)
    reader.fail("top_logprobs", "top_logprobs needs logprobs set to true");
  read_tools(reader, limits, request.tools);
  read_tool_choice(reader, request.tools, request.tool_choice);
  if (const nlohmann::json* kwargs = reader.find("chat_template_kwargs"); kwargs && reader.ok()) {
    if (kwargs->is_object())
      request.chat_template_kwargs = *kwargs;
    else
      reader.fail_type("chat_template_kwargs", *kwargs, "an object");
  }
  reader.read_bool("add_generation_prompt", request.add_generation_prompt);
  reader.read_bool("continue_final_message", request.continue_final_message);
  if (reader.ok() && request.continue_final_message) {
    if (request.add_generation_prompt)
      reader.fail("continue_final_message",
                  "continue_final_message and add_generation_prompt cannot both be true");
    else if (request.messages.back().role != "assistant")
      reader.fail("continue_final_message",
                  "continue_final_message needs the last message to be from the assistant");
  }
  if (auto error = reader.take_error()) return *std::move(error);
  if (auto error = validate_sampling_fields(request.fields, limits)) return *std::move(error);
  return request;
}

nlohmann::json messages_to_json(std::span<const ChatMessage> messages) {
  nlohmann::json out = nlohmann::json::array();
  for (const ChatMessage& message : messages) {
    nlohmann::json m = {{"role", message.role}, {"content", nullptr}};
    if (message.content) m["content"] = *message.content;
    if (message.name) m["name"] = *message.name;
    if (message.reasoning_content) m["reasoning_content"] = *message.reasoning_content;
    if (!message.tool_calls.is_null()) m["tool_calls"] = message.tool_calls;
    if (message.tool_call_id) m["tool_call_id"] = *message.tool_call_id;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace dz::serve::openai
