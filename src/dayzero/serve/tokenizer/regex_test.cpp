#include "dayzero/serve/tokenizer/regex.h"

#include <gtest/gtest.h>

#include "dayzero/serve/tokenizer/tiktoken_tokenizer.h"

namespace dz::serve {
namespace regex_test {

std::vector<std::string> pieces(const Regex& regex, std::string_view text) {
  Result<std::vector<RegexMatch>> matches = regex.find_all(text);
  EXPECT_TRUE(matches.ok()) << matches.status().to_string();
  std::vector<std::string> out;
  for (const RegexMatch& match : *matches) {
    out.emplace_back(text.substr(match.begin, match.end - match.begin));
  }
  return out;
}

TEST(TranslatePattern, PinsBareScriptsToTheScriptProperty) {
  EXPECT_EQ(*translate_pattern(R"([\p{Han}]+|\p{L}\P{Latin}\p{sc:Greek})"),
            R"([\p{sc:Han}]+|\p{L}\P{sc:Latin}\p{sc:Greek})");
}

TEST(TranslatePattern, TurnsIntersectionsIntoLookaheads) {
  EXPECT_EQ(*translate_pattern(R"([\p{Lu}\p{M}&&[^\p{Han}]]*)"),
            R"((?:(?=[\p{Lu}\p{M}])[^\p{sc:Han}])*)");
  EXPECT_EQ(*translate_pattern(R"([^a-z&&[^m]])"), R"((?:(?!(?:(?=[a-z])[^m]))[\s\S]))");
  EXPECT_EQ(*translate_pattern(R"([ab[cd]])"), R"((?:[ab]|[cd]))");
  EXPECT_EQ(*translate_pattern(R"([\[\]x]+[[:alpha:]])"), R"([\[\]x]+[[:alpha:]])");
}

TEST(TranslatePattern, RefusesBrokenClasses) {
  EXPECT_EQ(translate_pattern("ab[cd").status().message(),
            "pattern \"ab[cd\": unterminated character class at offset 2");
  EXPECT_EQ(translate_pattern("[a&&]").status().message(),
            "pattern \"[a&&]\": empty operand in a class intersection at offset 5");
}

TEST(Regex, IntersectionMatchesLikeRust) {
  Result<Regex> regex = Regex::compile(R"([\p{L}&&[^\p{Han}]]+|[\p{Han}]+|.)");
  ASSERT_TRUE(regex.ok()) << regex.status().to_string();
  EXPECT_EQ(pieces(*regex, "abc中文déf"), (std::vector<std::string>{"abc", "中文", "déf"}));
}

TEST(Regex, KimiPatternSplitsHanFromPunctuationAndKana) {
  Result<Regex> regex = Regex::compile(kKimiPattern);
  ASSERT_TRUE(regex.ok()) << regex.status().to_string();
  // 々 is Script=Han; 、 and 。 are Common (Han only by Script_Extensions).
  EXPECT_EQ(pieces(*regex, "你好、世界々。"),
            (std::vector<std::string>{"你好", "、", "世界々", "。"}));
  EXPECT_EQ(pieces(*regex, "Hello世界カタカナ"),
            (std::vector<std::string>{"Hello", "世界", "カタカナ"}));
  EXPECT_EQ(pieces(*regex, "DON'T you're 12345"),
            (std::vector<std::string>{"DON'T", " you're", " ", "123", "45"}));
  EXPECT_EQ(pieces(*regex, "a   b\n\n  c"),
            (std::vector<std::string>{"a", "  ", " b", "\n\n", " ", " c"}));
}

TEST(Regex, Llama3PatternSplitsLikeTiktoken) {
  Result<Regex> regex = Regex::compile(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)");
  ASSERT_TRUE(regex.ok()) << regex.status().to_string();
  EXPECT_EQ(pieces(*regex, "I'M 1234!!\n\n x"),
            (std::vector<std::string>{"I", "'M", " ", "123", "4", "!!\n\n", " x"}));
}

TEST(Regex, LongWhitespaceRunsFitTheJitStack) {
  Result<Regex> regex = Regex::compile(kKimiPattern);
  ASSERT_TRUE(regex.ok());
  std::string text(200'000, ' ');
  text += "x";
  std::vector<std::string> out = pieces(*regex, text);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].size(), 199'999u);
  EXPECT_EQ(out[1], " x");
}

TEST(Regex, EmptyMatchesAdvanceOneCodePoint) {
  Result<Regex> regex = Regex::compile("x*");
  ASSERT_TRUE(regex.ok());
  EXPECT_EQ(pieces(*regex, "é xx"), (std::vector<std::string>{"xx"}));
}

TEST(Regex, CompileErrorsNamePatternAndOffset) {
  Result<Regex> regex = Regex::compile("(ab");
  ASSERT_FALSE(regex.ok());
  EXPECT_EQ(regex.status().message(), "pattern \"(ab\": missing closing parenthesis at offset 3");
  regex = Regex::compile("[a&&[b]](");
  ASSERT_FALSE(regex.ok());
  EXPECT_NE(regex.status().message().find("(as PCRE2: \"(?:(?=[a])[b])(\")"), std::string::npos)
      << regex.status().message();
}

TEST(Utf8, FindsTheFirstBadByte) {
  EXPECT_EQ(utf8_error_offset("héllo 😀"), std::string_view::npos);
  EXPECT_EQ(utf8_error_offset("ab\xC3"), 2u);            // truncated
  EXPECT_EQ(utf8_error_offset("a\xC0\xAF"), 1u);         // overlong
  EXPECT_EQ(utf8_error_offset("ab\xED\xA0\x80"), 2u);    // surrogate
  EXPECT_EQ(utf8_error_offset("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_error_offset("ok\x80"), 2u);            // stray continuation
}

}  // namespace regex_test
}  // namespace dz::serve
