#pragma once
// POST /v1/chat/completions request (docs/serving.md §5.2): messages plus the shared sampling
// fields. Parsing checks types and ranges only; rendering the template, counting tokens against the
// context and resolving `model` are the server's.

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/serve/openai/api_error.h"
#include "dayzero/serve/openai/sampling_fields.h"

namespace dz::serve::openai {

// An image content part: its URL as sent and where its text goes in the message's content.
struct ChatImagePart {
  size_t offset = 0;  // in ChatMessage::content, where the image's prompt text is inserted
  std::string url;    // data: URL or http(s) URL, unchecked here
  std::string param;  // the field, for errors ("messages[0].content[1].image_url.url")
};

struct ChatMessage {
  std::string role = {};  // system | developer | user | assistant | tool
  // A string, or the text parts of a content list joined with "\n" (vLLM's "string" content
  // format). nullopt: null or absent, allowed only for assistant turns (e.g. with tool_calls).
  std::optional<std::string> content = {};
  std::vector<ChatImagePart> images = {};  // user messages' image parts, in order
  std::optional<std::string> name = {};
  std::optional<std::string> reasoning_content = {};  // earlier assistant turns, as sent
  nlohmann::json tool_calls = {};                // assistant: the array as sent; null when none
  std::optional<std::string> tool_call_id = {};  // tool: the call it answers
};

struct ChatRequest {
  SamplingFields fields = {};  // sampling.logprobs / top_logprobs from chat's bool + 0..20 pair
  std::vector<ChatMessage> messages = {};  // non-empty
  // The function tools as sent (each {"type":"function","function":{"name",...}}); null when none.
  nlohmann::json tools = {};
  // "none" | "auto" | "required" | {"type":"function","function":{"name"}}; null when absent.
  nlohmann::json tool_choice = {};
  nlohmann::json chat_template_kwargs = nlohmann::json::object();  // e.g. {"thinking": false}
  bool add_generation_prompt = true;
  bool continue_final_message = false;  // the last (assistant) message is left open
};

// Parses and validates a chat request body. Errors are 400 invalid_request_error naming the field
// ("messages[2].content[0].type"). Image parts are allowed in user messages; their URLs are
// the server's to load (§5.6).
std::variant<ChatRequest, ApiError> parse_chat_request(std::string_view body,
                                                       const ParseLimits& limits);

// The messages as chat-template input: objects with "role", "content" (string or null) and the
// optional "name", "reasoning_content", "tool_calls", "tool_call_id" when present.
nlohmann::json messages_to_json(std::span<const ChatMessage> messages);

}  // namespace dz::serve::openai
