// encode_dsv32_messages against outputs derived by hand from DeepSeek-V3.2's
// encoding/encoding_dsv32.py (read through sgl-project/sglang:
// python/sglang/srt/entrypoints/openai/encoding_dsv32.py, which is adapted from it).

#include "dayzero/serve/chat/dsv32_encoder.h"

#include <gtest/gtest.h>

namespace dz::serve::chat {
namespace dsv32_encoder_test {

using Json = nlohmann::ordered_json;

const Json kConversation = Json::parse(R"([
  {"role": "system", "content": "You are a helpful assistant."},
  {"role": "user", "content": "hello"},
  {"role": "assistant", "content": "Hello! I am DeepSeek.", "reasoning_content": "thinking..."},
  {"role": "user", "content": "1+1=?"}])");

TEST(Dsv32Encoder, ChatModeIsTheDefault) {
  // Every user turn ends with the generation prompt <｜Assistant｜></think> in chat mode.
  EXPECT_EQ(*encode_dsv32_messages(kConversation),
            "<｜begin▁of▁sentence｜>You are a helpful assistant."
            "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.<｜end▁of▁sentence｜>"
            "<｜User｜>1+1=?<｜Assistant｜></think>");
}

TEST(Dsv32Encoder, ThinkingModeOpensThinkAfterTheLastUserTurn) {
  EXPECT_EQ(*encode_dsv32_messages(kConversation, {.thinking = true}),
            "<｜begin▁of▁sentence｜>You are a helpful assistant."
            "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.<｜end▁of▁sentence｜>"
            "<｜User｜>1+1=?<｜Assistant｜><think>");
  Json answered = kConversation;
  answered.push_back({{"role", "assistant"}, {"content", "2"}, {"reasoning_content", "add"}});
  EXPECT_EQ(*encode_dsv32_messages(answered, {.thinking = true, .add_default_bos_token = false}),
            "You are a helpful assistant."
            "<｜User｜>hello<｜Assistant｜></think>Hello! I am DeepSeek.<｜end▁of▁sentence｜>"
            "<｜User｜>1+1=?<｜Assistant｜><think>add</think>2<｜end▁of▁sentence｜>");
  answered.back().erase("reasoning_content");
  EXPECT_EQ(encode_dsv32_messages(answered, {.thinking = true}).status().message(),
            "ThinkingMode: thinking, invalid message without reasoning_content/tool_calls after "
            "last user message");
}

TEST(Dsv32Encoder, ToolCallsAndResults) {
  Json messages = Json::parse(R"([
    {"role": "system", "content": "S", "tools": [{"type": "function", "function":
        {"name": "get", "parameters": {"type": "object"}}}]},
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function":
        {"name": "get", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
    {"role": "tool", "content": "sunny"}])");
  Result<std::string> prompt = encode_dsv32_messages(messages);
  ASSERT_TRUE(prompt.ok()) << prompt.status().to_string();
  const std::string& p = *prompt;
  EXPECT_EQ(p.rfind("<｜begin▁of▁sentence｜>S\n\n## Tools\nYou have access to a set of tools", 0),
            0u);
  EXPECT_NE(p.find("Here are the functions available in JSONSchema format:\n<functions>\n"
                   "{\"name\": \"get\", \"parameters\": {\"type\": \"object\"}}\n</functions>\n"
                   "<｜User｜>weather?<｜Assistant｜></think>"),
            std::string::npos);
  EXPECT_NE(
      p.find("</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get\">\n"
             "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
             "</｜DSML｜invoke>\n</｜DSML｜function_calls><｜end▁of▁sentence｜>"
             "\n\n<function_results>\n<result>sunny</result>\n</function_results>\n\n</think>"),
      std::string::npos)
      << p;
}

TEST(Dsv32Encoder, ContentPartsAndErrors) {
  Json parts = Json::parse(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b"}]}])");
  EXPECT_EQ(*encode_dsv32_messages(parts),
            "<｜begin▁of▁sentence｜><｜User｜>a\nb<｜Assistant｜></think>");
  EXPECT_EQ(encode_dsv32_messages(Json::parse(R"([{"role": "robot", "content": "x"}])"))
                .status()
                .message(),
            "Unknown role: robot");
  EXPECT_EQ(
      encode_dsv32_messages(Json::parse(R"([{"role": "tool", "content": "x"}])")).status().code(),
      StatusCode::kInvalidArgument);
  EXPECT_EQ(
      encode_dsv32_messages(Json::parse(R"([{"role": "user", "content": null}])")).value(),
      "<｜begin▁of▁sentence｜><｜User｜>None<｜Assistant｜></think>");  // Python's format(None)
}

}  // namespace dsv32_encoder_test
}  // namespace dz::serve::chat
