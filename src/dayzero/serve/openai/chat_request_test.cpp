#include "dayzero/serve/openai/chat_request.h"

#include <gtest/gtest.h>

#include <string>

namespace dz::serve::openai {
namespace chat_request_test {

using nlohmann::json;

constexpr const char* kUser = R"("messages": [{"role": "user", "content": "Hi"}])";

ChatRequest parse_ok(const std::string& body, const ParseLimits& limits = {}) {
  auto result = parse_chat_request(body, limits);
  if (auto* error = std::get_if<ApiError>(&result)) {
    ADD_FAILURE() << body << ": " << error->message;
    return {};
  }
  return std::get<ChatRequest>(std::move(result));
}

ApiError parse_error(const std::string& body, const ParseLimits& limits = {}) {
  auto result = parse_chat_request(body, limits);
  if (!std::holds_alternative<ApiError>(result)) {
    ADD_FAILURE() << body << ": parsed";
    return {};
  }
  return std::get<ApiError>(result);
}

// A body with model "m" and `rest` (fields, without braces).
std::string body_with(const std::string& rest) {
  return R"({"model": "m", )" + rest + "}";
}

TEST(ChatRequest, MinimalRequest) {
  const ChatRequest request = parse_ok(body_with(kUser));
  EXPECT_EQ(request.fields.model, "m");
  ASSERT_EQ(request.messages.size(), 1u);
  EXPECT_EQ(request.messages[0].role, "user");
  EXPECT_EQ(request.messages[0].content, "Hi");
  EXPECT_FALSE(request.fields.sampling.logprobs);
  EXPECT_TRUE(request.tools.is_null());
  EXPECT_TRUE(request.tool_choice.is_null());
  EXPECT_EQ(request.chat_template_kwargs, json::object());
  EXPECT_TRUE(request.add_generation_prompt);
  EXPECT_FALSE(request.continue_final_message);
}

TEST(ChatRequest, EveryRoleAndMessageField) {
  const ChatRequest request = parse_ok(body_with(R"("messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "developer", "content": "Dev."},
      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
       "name": "alice"},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
      {"role": "tool", "content": "12C", "tool_call_id": "call_1"},
      {"role": "assistant", "content": "It is 12C."}])"));
  ASSERT_EQ(request.messages.size(), 6u);
  EXPECT_EQ(request.messages[1].role, "developer");
  EXPECT_EQ(request.messages[2].content, "a\nb");
  EXPECT_EQ(request.messages[2].name, "alice");
  EXPECT_FALSE(request.messages[3].content);
  EXPECT_EQ(request.messages[3].reasoning_content, "hmm");
  EXPECT_EQ(request.messages[3].tool_calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(request.messages[4].tool_call_id, "call_1");
  EXPECT_EQ(messages_to_json(request.messages), json::parse(R"([
      {"role": "system", "content": "Be brief."},
      {"role": "developer", "content": "Dev."},
      {"role": "user", "content": "a\nb", "name": "alice"},
      {"role": "assistant", "content": null, "reasoning_content": "hmm",
       "tool_calls": [{"id": "call_1", "type": "function",
                       "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
      {"role": "tool", "content": "12C", "tool_call_id": "call_1"},
      {"role": "assistant", "content": "It is 12C."}])"));
}

TEST(ChatRequest, ImagePartsKeepTheirPlaceInTheText) {
  const ChatRequest request = parse_ok(body_with(R"("messages": [
      {"role": "user", "content": [
          {"type": "image_url", "image_url": {"url": "data:image/png;base64,QQ==", "detail": "low"}},
          {"type": "text", "text": "ab"},
          {"type": "image_url", "image_url": "https://example.com/b.png"},
          {"type": "input_image", "image_url": "data:image/jpeg;base64,Qg=="},
          {"type": "text", "text": "c"}]}])"));
  const ChatMessage& m = request.messages[0];
  EXPECT_EQ(m.content, "\nab\n\n\nc");
  ASSERT_EQ(m.images.size(), 3u);
  EXPECT_EQ(m.images[0].offset, 0u);
  EXPECT_EQ(m.images[0].url, "data:image/png;base64,QQ==");
  EXPECT_EQ(m.images[0].param, "messages[0].content[0].image_url.url");
  EXPECT_EQ(m.images[1].offset, 4u);
  EXPECT_EQ(m.images[1].url, "https://example.com/b.png");
  EXPECT_EQ(m.images[1].param, "messages[0].content[2].image_url");
  EXPECT_EQ(m.images[2].offset, 5u);
  EXPECT_EQ(m.images[2].param, "messages[0].content[3].image_url");
}

TEST(ChatRequest, LogprobsAndTopLogprobs) {
  const ChatRequest request =
      parse_ok(body_with(std::string(kUser) + R"(, "logprobs": true, "top_logprobs": 20)"));
  EXPECT_TRUE(request.fields.sampling.logprobs);
  EXPECT_EQ(request.fields.sampling.top_logprobs, 20);
  EXPECT_TRUE(
      parse_ok(body_with(std::string(kUser) + R"(, "logprobs": true)")).fields.sampling.logprobs);
}

TEST(ChatRequest, ToolsToolChoiceAndTemplateOptions) {
  const ChatRequest request = parse_ok(body_with(std::string(kUser) + R"(,
      "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                 "parameters": {"type": "object", "properties": {}}}}],
      "tool_choice": {"type": "function", "function": {"name": "f"}},
      "chat_template_kwargs": {"thinking": false}, "add_generation_prompt": true)"));
  EXPECT_EQ(request.tools[0]["function"]["name"], "f");
  EXPECT_EQ(request.tool_choice["function"]["name"], "f");
  EXPECT_EQ(request.chat_template_kwargs, json::parse(R"({"thinking": false})"));
  for (const char* mode : {"none", "auto", "required"}) {
    const ChatRequest r = parse_ok(body_with(std::string(kUser) +
                                             R"(, "tools": [{"type": "function", "function":
                                                 {"name": "f"}}], "tool_choice": ")" +
                                             mode + "\""));
    EXPECT_EQ(r.tool_choice, mode);
  }
  EXPECT_EQ(parse_ok(body_with(std::string(kUser) + R"(, "tool_choice": "auto")")).tool_choice,
            "auto");
}

TEST(ChatRequest, ContinueFinalMessage) {
  const ChatRequest request = parse_ok(body_with(R"("messages": [
      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}],
      "continue_final_message": true, "add_generation_prompt": false)"));
  EXPECT_TRUE(request.continue_final_message);
  EXPECT_FALSE(request.add_generation_prompt);
}

TEST(ChatRequest, SharedFieldsAreRead) {
  const ChatRequest request =
      parse_ok(body_with(std::string(kUser) + R"(, "temperature": 0.2, "stream": true)"));
  EXPECT_TRUE(request.fields.stream);
  EXPECT_FLOAT_EQ(request.fields.sampling.temperature, 0.2f);
}

struct BadCase {
  std::string body;
  std::optional<std::string> param;
  std::string message;
};

TEST(ChatRequest, BadRequestsGive400NamingTheField) {
  const std::string tools_f = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  const BadCase cases[] = {
      {R"({"model": "m", "messages": [)", std::nullopt, ""},  // message checked below
      {"[1, 2]", std::nullopt, "The request body must be a JSON object, got an array."},
      {R"({"messages": []})", "model", "model is required"},
      {body_with(R"("temperature": 5, "messages": [])"), "messages",
       "messages must contain at least one message"},
      {R"({"model": "m"})", "messages", "messages is required"},
      {body_with(R"("messages": "hi")"), "messages",
       "messages: expected a list of messages, got a string"},
      {body_with(R"("messages": [5])"), "messages[0]",
       "messages[0]: expected a message object, got an integer"},
      {body_with(R"("messages": [{"content": "x"}])"), "messages[0].role",
       "messages[0].role is required"},
      {body_with(R"("messages": [{"role": 1, "content": "x"}])"), "messages[0].role",
       "messages[0].role: expected a string, got an integer"},
      {body_with(
           R"("messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "x"}])"),
       "messages[1].role",
       "messages[1].role must be one of system, developer, user, assistant, tool; got \"robot\""},
      {body_with(R"("messages": [{"role": "user"}])"), "messages[0].content",
       "messages[0].content is required for role \"user\""},
      {body_with(R"("messages": [{"role": "user", "content": null}])"), "messages[0].content",
       "messages[0].content is required for role \"user\""},
      {body_with(
           R"("messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": 7}])"),
       "messages[2].content",
       "messages[2].content: expected a string or a list of content parts, got an integer"},
      {body_with(R"("messages": [{"role": "user", "content": ["x"]}])"), "messages[0].content[0]",
       "messages[0].content[0]: expected a content part object, got a string"},
      {body_with(R"("messages": [{"role": "user", "content": [{"text": "x"}]}])"),
       "messages[0].content[0].type", "messages[0].content[0].type is required"},
      {body_with(R"("messages": [{"role": "user", "content": [{"type": "text"}]}])"),
       "messages[0].content[0].text", "messages[0].content[0].text is required"},
      {body_with(R"("messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}])"),
       "messages[0].content[0].text",
       "messages[0].content[0].text: expected a string, got an integer"},
      {body_with(R"("messages": [{"role": "assistant", "content": [
          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])"),
       "messages[0].content[0].type",
       "images are allowed in user messages only, not in a \"assistant\" message"},
      {body_with(R"("messages": [{"role": "user", "content": [{"type": "image_url"}]}])"),
       "messages[0].content[0].image_url", "messages[0].content[0].image_url is required"},
      {body_with(R"("messages": [{"role": "user", "content": [{"type": "image_url",
          "image_url": 7}]}])"),
       "messages[0].content[0].image_url",
       "messages[0].content[0].image_url: expected an object with a url, or a URL string, got an "
       "integer"},
      {body_with(R"("messages": [{"role": "user", "content": [{"type": "image_url",
          "image_url": {"detail": "low"}}]}])"),
       "messages[0].content[0].image_url.url", "messages[0].content[0].image_url.url is required"},
      {body_with(R"("messages": [{"role": "user", "content": [{"type": "input_audio"}]}])"),
       "messages[0].content[0].type", "unsupported content part type \"input_audio\""},
      {body_with(R"("messages": [{"role": "user", "content": "x", "name": 5}])"),
       "messages[0].name", "messages[0].name: expected a string, got an integer"},
      {body_with(R"("messages": [{"role": "tool", "content": "x", "tool_call_id": 5}])"),
       "messages[0].tool_call_id", "messages[0].tool_call_id: expected a string, got an integer"},
      {body_with(R"("messages": [{"role": "assistant", "tool_calls": {}}])"),
       "messages[0].tool_calls",
       "messages[0].tool_calls: expected a list of tool calls, got an object"},
      {body_with(R"("messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}])"),
       "messages[0].tool_calls[0].function",
       "messages[0].tool_calls[0].function: expected an object"},
      {body_with(R"("messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}])"),
       "messages[0].tool_calls[0].function.name",
       "messages[0].tool_calls[0].function.name is required"},
      {body_with(
           R"("messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}])"),
       "messages[0].tool_calls[0].function.arguments",
       "messages[0].tool_calls[0].function.arguments: expected a JSON string, got an integer"},
      {body_with(std::string(kUser) + R"(, "logprobs": 1)"), "logprobs",
       "logprobs: expected a boolean, got an integer"},
      {body_with(std::string(kUser) + R"(, "top_logprobs": 2)"), "top_logprobs",
       "top_logprobs needs logprobs set to true"},
      {body_with(std::string(kUser) + R"(, "logprobs": true, "top_logprobs": 21)"), "top_logprobs",
       "top_logprobs must be in [0, 20], got 21"},
      {body_with(std::string(kUser) + R"(, "tools": {})"), "tools",
       "tools: expected a list of tools, got an object"},
      {body_with(std::string(kUser) + R"(, "tools": [{"type": "retrieval"}])"), "tools[0].type",
       "tools[0].type must be \"function\", got \"retrieval\""},
      {body_with(std::string(kUser) + R"(, "tools": [{"type": "function"}])"), "tools[0].function",
       "tools[0].function: expected an object"},
      {body_with(std::string(kUser) + R"(, "tools": [{"type": "function", "function": {}}])"),
       "tools[0].function.name", "tools[0].function.name is required"},
      {body_with(
           std::string(kUser) +
           R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": 1}}])"),
       "tools[0].function.parameters",
       "tools[0].function.parameters: expected a JSON schema object, got an integer"},
      {body_with(std::string(kUser) + R"(, "tool_choice": "sometimes")"), "tool_choice",
       "tool_choice must be \"none\", \"auto\", \"required\" or a named function, got "
       "\"sometimes\""},
      {body_with(std::string(kUser) + R"(, "tool_choice": "required")"), "tool_choice",
       "tool_choice \"required\" needs tools"},
      {body_with(std::string(kUser) + ", " + tools_f +
                 R"(, "tool_choice": {"type": "function", "function": {"name": "g"}})"),
       "tool_choice", "tool_choice names the function \"g\", which is not in tools"},
      {body_with(std::string(kUser) + ", " + tools_f + R"(, "tool_choice": {"name": "f"})"),
       "tool_choice",
       "tool_choice objects must be {\"type\": \"function\", \"function\": {\"name\": ...}}"},
      {body_with(std::string(kUser) + R"(, "tool_choice": 1)"), "tool_choice",
       "tool_choice: expected a string or an object, got an integer"},
      {body_with(std::string(kUser) + R"(, "chat_template_kwargs": "thinking")"),
       "chat_template_kwargs", "chat_template_kwargs: expected an object, got a string"},
      {body_with(std::string(kUser) + R"(, "add_generation_prompt": "yes")"),
       "add_generation_prompt", "add_generation_prompt: expected a boolean, got a string"},
      {body_with(std::string(kUser) + R"(, "continue_final_message": true)"),
       "continue_final_message",
       "continue_final_message and add_generation_prompt cannot both be true"},
      {body_with(std::string(kUser) +
                 R"(, "continue_final_message": true, "add_generation_prompt": false)"),
       "continue_final_message",
       "continue_final_message needs the last message to be from the assistant"},
      {body_with(std::string(kUser) + R"(, "top_p": 2)"), "top_p",
       "top_p must be in (0, 1], got 2"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError error = parse_error(c.body);
    EXPECT_EQ(error.http_status, 400);
    EXPECT_EQ(error.type, "invalid_request_error");
    EXPECT_EQ(error.code, "invalid_value");
    EXPECT_EQ(error.param, c.param);
    if (!c.message.empty()) {
      EXPECT_EQ(error.message, c.message);
    }
  }
}

TEST(ChatRequest, BadJsonNamesTheBytePosition) {
  const ApiError error = parse_error(R"({"model": "m", "messages": [)");
  EXPECT_EQ(error.http_status, 400);
  EXPECT_FALSE(error.param);
  EXPECT_NE(error.message.find("not valid JSON (at byte 29)"), std::string::npos) << error.message;
  const ApiError utf8 = parse_error("{\"model\": \"\xff\"}");
  EXPECT_NE(utf8.message.find("not valid JSON"), std::string::npos) << utf8.message;
  EXPECT_NO_THROW((void)utf8.to_json().dump());  // the quoted bad byte is replaced
  EXPECT_NE(parse_error("").message.find("not valid JSON"), std::string::npos);
}

TEST(ChatRequest, DeepNestingIsRefused) {
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  const ApiError error = parse_error(body_with(std::string(kUser) + ", \"x\": " + deep));
  EXPECT_EQ(error.message, "The request body nests JSON deeper than 64 levels.");
  parse_ok(
      body_with(std::string(kUser) + ", \"x\": " + std::string(60, '[') + std::string(60, ']')));
}

TEST(ChatRequest, TooManyMessagesAndTools) {
  const ParseLimits limits{.max_messages = 2, .max_tools = 1};
  parse_ok(body_with(R"("messages": [{"role": "user", "content": "a"},
                                     {"role": "assistant", "content": "b"}])"),
           limits);
  const ApiError messages = parse_error(body_with(R"("messages": [{"role": "user", "content": "a"},
          {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}])"),
                                        limits);
  EXPECT_EQ(messages.param, "messages");
  EXPECT_EQ(messages.message, "messages has 3 entries, at most 2 are allowed");
  const ApiError tools = parse_error(
      body_with(std::string(kUser) + R"(, "tools": [{"type": "function", "function": {"name":
          "f"}}, {"type": "function", "function": {"name": "g"}}])"),
      limits);
  EXPECT_EQ(tools.param, "tools");
  EXPECT_EQ(tools.message, "tools has 2 entries, at most 1 are allowed");
}

}  // namespace chat_request_test
}  // namespace dz::serve::openai
