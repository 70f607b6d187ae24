// Port of encode_messages() from DeepSeek-V3.2's encoding/encoding_dsv32.py (dsv32_encoder.h).

#include "dayzero/serve/chat/dsv32_encoder.h"

#include "dayzero/serve/chat/chat_template.h"
#include "dayzero/serve/chat/value.h"

namespace dz::serve::chat {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kBos = "<｜begin▁of▁sentence｜>";
constexpr std::string_view kEos = "<｜end▁of▁sentence｜>";
constexpr std::string_view kThinkStart = "<think>";
constexpr std::string_view kThinkEnd = "</think>";
constexpr std::string_view kDsml = "｜DSML｜";

// TOOLS_SYSTEM_TEMPLATE with dsml_token and the thinking tokens filled in; {tool_schemas} last.
std::string tools_system_prompt(const std::string& tool_schemas) {
  const std::string d(kDsml);
  std::string out;
  out += "## Tools\n";
  out += "You have access to a set of tools you can use to answer the user's question.\n";
  out += "You can invoke functions by writing a \"<" + d +
         "function_calls>\" block like the following as part of your reply to the user:\n";
  out += "<" + d + "function_calls>\n";
  out += "<" + d + "invoke name=\"$FUNCTION_NAME\">\n";
  out += "<" + d + "parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" +
         d + "parameter>\n";
  out += "...\n";
  out += "</" + d + "invoke>\n";
  out += "<" + d + "invoke name=\"$FUNCTION_NAME2\">\n";
  out += "...\n";
  out += "</" + d + "invoke>\n";
  out += "</" + d + "function_calls>\n";
  out +=
      "String and scalar parameters should be specified as is without any escaping or quotes, "
      "while lists and objects should use JSON format. The \"string\" attribute should be set "
      "to \"true\" for string type parameters and \"false\" for other types (numbers, "
      "booleans, arrays, objects).\n";
  out +=
      "If the thinking_mode is enabled, then after function results you should strongly "
      "consider outputting a thinking block. Here is an example:\n";
  out += "<" + d + "function_calls>\n...\n</" + d + "function_calls>\n";
  out += "<function_results>\n...\n</function_results>\n";
  out += std::string(kThinkStart) + "...thinking about results" + std::string(kThinkEnd) + "\n";
  out += "Here are the functions available in JSONSchema format:\n<functions>\n";
  out += tool_schemas;
  out += "\n</functions>\n";
  return out;
}

// json.dumps(value, ensure_ascii=False): Python's default separators.
Result<std::string> to_json(const Json& value) {
  return dump_json(Value::from_json(value), {});
}

// Python's str.format of a JSON value: strings as is, None as "None".
std::string py_format(const Json& value) {
  if (value.is_null()) return "None";
  return Value::from_json(value).str();
}

std::string role_of(const Json& msg) {
  auto it = msg.find("role");
  return it != msg.end() && it->is_string() ? it->get<std::string>() : "";
}

bool truthy(const Json& msg, const char* key) {
  auto it = msg.find(key);
  return it != msg.end() && Value::from_json(*it).truthy();
}

Result<std::string> render_tools(const Json& tools) {
  std::string schemas;
  for (size_t i = 0; i < tools.size(); ++i) {
    if (!tools[i].is_object() || !tools[i].contains("function"))
      return make_error(StatusCode::kInvalidArgument, "tools[{}] has no \"function\"", i);
    DZ_ASSIGN_OR_RETURN(std::string schema, to_json(tools[i]["function"]));
    if (i) schemas += "\n";
    schemas += schema;
  }
  return tools_system_prompt(schemas);
}

Result<std::string> tools_and_format(const Json& msg) {
  std::string out;
  if (truthy(msg, "tools")) {
    DZ_ASSIGN_OR_RETURN(std::string tools, render_tools(msg["tools"]));
    out += "\n\n" + tools;
  }
  if (truthy(msg, "response_format")) {
    DZ_ASSIGN_OR_RETURN(std::string schema, to_json(msg["response_format"]));
    out +=
        "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n" +
        schema;
  }
  return out;
}

Result<std::string> encode_arguments(const Json& function) {
  Json arguments = function.contains("arguments") ? function["arguments"] : Json();
  if (arguments.is_string()) {
    arguments = Json::parse(arguments.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (arguments.is_discarded())
      return make_error(StatusCode::kInvalidArgument, "tool call arguments are not valid JSON");
  }
  if (!arguments.is_object())
    return make_error(StatusCode::kInvalidArgument,
                      "Assistant tool call function.arguments must be a JSON object.");
  std::string out;
  bool first = true;
  for (auto it = arguments.begin(); it != arguments.end(); ++it) {
    bool is_str = it.value().is_string();
    std::string value;
    if (is_str) {
      value = it.value().get<std::string>();
    } else {
      DZ_ASSIGN_OR_RETURN(value, to_json(it.value()));
    }
    if (!first) out += "\n";
    first = false;
    // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict on the chained operator+.
    out.append("<").append(kDsml).append("parameter name=\"").append(it.key());
    out.append("\" string=\"").append(is_str ? "true" : "false").append("\">").append(value);
    out.append("</").append(kDsml).append("parameter>");
  }
  return out;
}

int find_last_user_index(const Json& messages) {
  for (int i = static_cast<int>(messages.size()) - 1; i >= 0; --i) {
    std::string role = role_of(messages[static_cast<size_t>(i)]);
    if (role == "user" || role == "developer") return i;
  }
  return -1;
}

Result<std::string> render_message(int index, const Json& messages, bool thinking) {
  if (index < 0 || index >= static_cast<int>(messages.size()))
    return make_error(StatusCode::kInvalidArgument,
                      "Index {} out of range for messages list of length {}", index,
                      messages.size());
  const Json& msg = messages[static_cast<size_t>(index)];
  const int last_user = find_last_user_index(messages);
  const std::string role = role_of(msg);
  const Json content = msg.contains("content") ? msg["content"] : Json();
  std::string prompt;
  auto user_turn = [&](const std::string& text) {
    prompt += "<｜User｜>" + text + "<｜Assistant｜>";
    prompt += index == last_user && thinking ? kThinkStart : kThinkEnd;
  };
  if (role == "system") {
    prompt += truthy(msg, "content") ? py_format(content) : "";  // `content or ""`
    DZ_ASSIGN_OR_RETURN(std::string extra, tools_and_format(msg));
    prompt += extra;
  } else if (role == "developer") {
    if (!truthy(msg, "content"))
      return make_error(StatusCode::kInvalidArgument, "Invalid message for role `developer`");
    DZ_ASSIGN_OR_RETURN(std::string extra, tools_and_format(msg));
    user_turn(extra + "\n\n# The user's message is: " + py_format(content));
  } else if (role == "user") {
    user_turn(py_format(content));
  } else if (role == "tool") {
    int prev = index - 1;
    while (prev >= 0 && role_of(messages[static_cast<size_t>(prev)]) == "tool") --prev;
    if (prev < 0 || role_of(messages[static_cast<size_t>(prev)]) != "assistant")
      return make_error(StatusCode::kInvalidArgument,
                        "Invalid messages at {}: a tool result "
                        "must follow an assistant message with tool calls",
                        index);
    const Json& assistant = messages[static_cast<size_t>(prev)];
    const int order = index - prev;
    const Json calls = assistant.contains("tool_calls") ? assistant["tool_calls"] : Json();
    if (!calls.is_array() || calls.empty() || static_cast<int>(calls.size()) < order)
      return make_error(StatusCode::kInvalidArgument, "No tool calls but found tool output");
    if (order == 1) prompt += "\n\n<function_results>";
    prompt += "\n<result>" + py_format(content) + "</result>";
    if (order == static_cast<int>(calls.size())) {
      prompt += "\n</function_results>";
      prompt += std::string("\n\n") +
                std::string(index >= last_user && thinking ? kThinkStart : kThinkEnd);
    }
  } else if (role == "assistant") {
    std::string tool_calls;
    if (truthy(msg, "tool_calls")) {
      std::string invokes;
      const Json& calls = msg["tool_calls"];
      for (size_t i = 0; i < calls.size(); ++i) {
        if (!calls[i].is_object() || !calls[i].contains("function") ||
            !calls[i]["function"].is_object())
          return make_error(StatusCode::kInvalidArgument, "tool_calls[{}] has no function", i);
        const Json& function = calls[i]["function"];
        DZ_ASSIGN_OR_RETURN(std::string arguments, encode_arguments(function));
        if (i) invokes += "\n";
        invokes += "<" + std::string(kDsml) + "invoke name=\"" +
                   py_format(function.contains("name") ? function["name"] : Json()) + "\">\n" +
                   arguments + "\n</" + std::string(kDsml) + "invoke>";
      }
      tool_calls = "\n\n<" + std::string(kDsml) + "function_calls>\n" + invokes + "\n</" +
                   std::string(kDsml) + "function_calls>";
    }
    std::string reasoning_part;
    if (thinking && index > last_user) {
      if (!truthy(msg, "reasoning_content") && tool_calls.empty())
        return make_error(StatusCode::kInvalidArgument,
                          "ThinkingMode: thinking, invalid message without "
                          "reasoning_content/tool_calls after last user message");
      const Json& reasoning = msg.contains("reasoning_content") ? msg["reasoning_content"] : Json();
      reasoning_part =
          (truthy(msg, "reasoning_content") ? py_format(reasoning) : "") + std::string(kThinkEnd);
    }
    std::string summary = truthy(msg, "content") ? py_format(content) : "";
    prompt += reasoning_part + summary + tool_calls + std::string(kEos);
  } else {
    return make_error(StatusCode::kInvalidArgument, "Unknown role: {}", role);
  }
  return prompt;
}

}  // namespace

Result<std::string> encode_dsv32_messages(const Json& messages, const Dsv32EncodeOptions& options) {
  if (!messages.is_array())
    return make_error(StatusCode::kInvalidArgument, "messages must be an array");
  for (const auto& msg : messages)
    if (!msg.is_object())
      return make_error(StatusCode::kInvalidArgument, "messages must be objects");
  // Text-only content-part lists become strings first (chat_template.h's rule).
  Json full = flatten_text_parts(messages);
  for (const auto& msg : full)
    if (msg.contains("content") && msg["content"].is_array())
      return make_error(StatusCode::kUnsupported, "DeepSeek-V3.2 messages with image parts");
  std::string prompt = options.add_default_bos_token ? std::string(kBos) : "";
  if (options.thinking && options.drop_thinking) {
    // drop_thinking_messages(): upstream keeps user/system/tool and everything from the last
    // user turn on, strips reasoning from earlier assistant turns, and drops other roles there.
    const int last_user = find_last_user_index(full);
    Json kept = Json::array();
    for (int i = 0; i < static_cast<int>(full.size()); ++i) {
      Json msg = full[static_cast<size_t>(i)];
      std::string role = role_of(msg);
      if (role == "user" || role == "system" || role == "tool" || i >= last_user) {
        kept.push_back(std::move(msg));
      } else if (role == "assistant") {
        msg.erase("reasoning_content");
        kept.push_back(std::move(msg));
      }
    }
    full = std::move(kept);
  }
  for (int i = 0; i < static_cast<int>(messages.size()); ++i) {
    DZ_ASSIGN_OR_RETURN(std::string part, render_message(i, full, options.thinking));
    prompt += part;
  }
  return prompt;
}

}  // namespace dz::serve::chat
