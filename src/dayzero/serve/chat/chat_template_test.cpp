// ChatTemplate: loading from tokenizer_config.json, HF's variables, the content-part rule.

#include "dayzero/serve/chat/chat_template.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

namespace dz::serve::chat {
namespace chat_template_test {

using Json = nlohmann::ordered_json;
namespace fs = std::filesystem;

class ChatTemplateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::temp_directory_path() /
        ("dz_chat_template_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
         "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  static std::string fixture(const std::string& name) {
    std::ifstream file(fs::path(DZ_SOURCE_DIR) / "tests/data/chat_templates" / name,
                       std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(file), {});
  }
  fs::path dir_;
};

const char* kChatml =
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

TEST_F(ChatTemplateTest, LoadsStringTemplateAndAddedTokenObjects) {
  Json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                 {"eos_token", "</s>"},
                 {"chat_template", std::string("{{ bos_token }}") + kChatml + "{{ eos_token }}"}};
  write("tokenizer_config.json", config.dump());
  Result<ChatTemplate> chat = ChatTemplate::load(dir_);
  ASSERT_TRUE(chat.ok()) << chat.status().to_string();
  EXPECT_EQ(chat->bos_token(), "<s>");
  EXPECT_EQ(chat->eos_token(), "</s>");
  Json messages = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(*chat->render(messages, true),
            "<s><|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n</s>");
  EXPECT_EQ(*chat->render(messages, false), "<s><|im_start|>user\nHi<|im_end|>\n</s>");
}

TEST_F(ChatTemplateTest, ListOfNamedTemplatesUsesDefault) {
  Json config = {{"chat_template", Json::array({{{"name", "tool_use"}, {"template", "TOOLS"}},
                                                {{"name", "default"}, {"template", "DEFAULT"}}})}};
  write("tokenizer_config.json", config.dump());
  EXPECT_EQ(*ChatTemplate::load(dir_)->render(Json::array(), false), "DEFAULT");
  write("tokenizer_config.json",
        Json{{"chat_template", Json::array({{{"name", "x"}, {"template", "X"}}})}}.dump());
  EXPECT_EQ(ChatTemplate::load(dir_).status().code(), StatusCode::kNotFound);
}

TEST_F(ChatTemplateTest, ChatTemplateJinjaWinsAndMissingIsReported) {
  EXPECT_EQ(ChatTemplate::load(dir_).status().code(), StatusCode::kNotFound);
  write("tokenizer_config.json", "{}");
  write("chat_template.jinja", "J{{ messages|length }}\n");
  EXPECT_EQ(
      *ChatTemplate::load(dir_)->render(Json::array({{{"role", "user"}, {"content", "x"}}}), false),
      "J1");
  write("tokenizer_config.json", Json{{"chat_template", "from config"}}.dump());
  EXPECT_EQ(*ChatTemplate::load(dir_)->render(Json::array(), false), "J0");  // the file wins
}

TEST_F(ChatTemplateTest, SyntaxErrorsFailAtLoadWithTheirPlace) {
  write("tokenizer_config.json",
        Json{{"chat_template", "{% for m in messages %}\n{{ m | nope }}"}}.dump());
  Status status = ChatTemplate::load(dir_).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find(
                "template line 1 column 4: 'for' is not closed: missing '{% endfor %}'"),
            std::string::npos)
      << status.message();
  write("tokenizer_config.json", "{not json");
  EXPECT_EQ(ChatTemplate::load(dir_).status().code(), StatusCode::kCorrupt);
}

TEST_F(ChatTemplateTest, ToolsAndKwargsReachTheTemplate) {
  Result<ChatTemplate> chat = ChatTemplate::from_source(
      "{% if tools is defined %}{{ tools|tojson }}{% else %}none{% endif %}|{{ enable_thinking }}",
      "", "");
  ASSERT_TRUE(chat.ok());
  Json tools = Json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}])");
  EXPECT_EQ(
      *chat->render(Json::array(), false, tools, {{"enable_thinking", false}}),
      R"([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}]|False)");
  EXPECT_EQ(*chat->render(Json::array(), false), "none|");
  EXPECT_EQ(chat->render(Json::array(), false, nullptr, {{"messages", 1}}).status().message(),
            "chat_template_kwargs may not set 'messages'");
}

TEST_F(ChatTemplateTest, TextPartsAreJoinedForStringTemplates) {
  Result<ChatTemplate> chat = ChatTemplate::from_source(kChatml, "", "");
  ASSERT_TRUE(chat.ok());
  EXPECT_FALSE(chat->takes_content_parts());
  Json messages = Json::parse(
      R"([{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}])");
  EXPECT_EQ(*chat->render(messages, false), "<|im_start|>user\none\ntwo<|im_end|>\n");
}

TEST_F(ChatTemplateTest, KimiTemplateLoopsOverPartsItself) {
  Result<ChatTemplate> kimi =
      ChatTemplate::from_source(fixture("moonshotai-Kimi-K2.jinja"), "[BOS]", "[EOS]");
  ASSERT_TRUE(kimi.ok()) << kimi.status().to_string();
  EXPECT_TRUE(kimi->takes_content_parts());
  Json messages = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  EXPECT_EQ(*kimi->render(messages, true),
            "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>"
            "<|im_user|>user<|im_middle|>Hi<|im_end|><|im_assistant|>assistant<|im_middle|>");
  Json parts = Json::parse(R"([{"role": "system", "content": "S"}, {"role": "user", "content":
      [{"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "data:"}}]}])");
  EXPECT_EQ(*kimi->render(parts, false),
            "<|im_system|>system<|im_middle|>S<|im_end|><|im_user|>user<|im_middle|>look: "
            "<|media_start|>image<|media_content|><|media_pad|><|media_end|><|im_end|>");
  Result<ChatTemplate> thinking =
      ChatTemplate::from_source(fixture("Kimi-K2-Thinking.jinja"), "", "");
  ASSERT_TRUE(thinking.ok()) << thinking.status().to_string();
  EXPECT_TRUE(thinking->takes_content_parts());
}

TEST_F(ChatTemplateTest, KimiThinkingToolCallsUseTheNamespaceQueue) {
  Result<ChatTemplate> kimi = ChatTemplate::from_source(fixture("Kimi-K2-Thinking.jinja"), "", "");
  ASSERT_TRUE(kimi.ok()) << kimi.status().to_string();
  Json messages = Json::parse(R"([
    {"role": "user", "content": "weather?"},
    {"role": "assistant", "content": "", "reasoning_content": "need tool",
     "tool_calls": [{"type": "function", "function": {"name": "get", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "content": "sunny"}])");
  EXPECT_EQ(
      *kimi->render(messages, true),
      "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot "
      "AI.<|im_end|>"
      "<|im_user|>user<|im_middle|>weather?<|im_end|>"
      "<|im_assistant|>assistant<|im_middle|><think>need tool</think><|tool_calls_section_begin|>"
      "<|tool_call_begin|>functions.get:0<|tool_call_argument_begin|>{\"city\": "
      "\"Paris\"}<|tool_call_end|>"
      "<|tool_calls_section_end|><|im_end|>"
      "<|im_system|>tool<|im_middle|>## Return of functions.get:0\nsunny<|im_end|>"
      "<|im_assistant|>assistant<|im_middle|>");
}

}  // namespace chat_template_test
}  // namespace dz::serve::chat
