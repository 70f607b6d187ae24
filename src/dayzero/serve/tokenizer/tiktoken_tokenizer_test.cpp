#include "dayzero/serve/tokenizer/tiktoken_tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace dz::serve {
namespace tiktoken_tokenizer_test {

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t k = 0; k < bytes.size(); k += 3) {
    uint32_t chunk = static_cast<uint8_t>(bytes[k]) << 16;
    if (k + 1 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[k + 1]) << 8;
    if (k + 2 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[k + 2]);
    out += kAlphabet[(chunk >> 18) & 63];
    out += kAlphabet[(chunk >> 12) & 63];
    out += k + 1 < bytes.size() ? kAlphabet[(chunk >> 6) & 63] : '=';
    out += k + 2 < bytes.size() ? kAlphabet[chunk & 63] : '=';
  }
  return out;
}

// Ranks 0..255 are the bytes; then "ab" 256, "abc" 257, "bc" 258, two prefixes of "你" and
// "你好" 261.
std::string small_ranks() {
  std::string text;
  for (int byte = 0; byte < 256; ++byte) {
    text += base64(std::string(1, static_cast<char>(byte))) + " " + std::to_string(byte) + "\n";
  }
  int rank = 256;
  for (std::string token : {"ab", "abc", "bc", "\xE4\xBD", "\xE4\xBD\xA0", "你好"}) {
    text += base64(token) + " " + std::to_string(rank++) + "\n";
  }
  return text;
}
constexpr int32_t kNumRanks = 262;

const char* kConfig = R"({"added_tokens_decoder": {
  "262": {"content": "[BOS]", "special": true},
  "264": {"content": "<|im_end|>", "special": true}}})";

std::unique_ptr<TiktokenTokenizer> small(const TiktokenOptions& options = {}) {
  auto tok = TiktokenTokenizer::create(small_ranks(), kConfig, options);
  EXPECT_TRUE(tok.ok()) << tok.status().to_string();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

std::vector<int32_t> encode(const Tokenizer& tok, std::string_view text, bool special = true) {
  Result<std::vector<int32_t>> ids = tok.encode(text, {.allow_special = special});
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(TiktokenTokenizer, MergesLowestRankFirst) {
  auto tok = small();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(encode(*tok, "abc"), (std::vector<int32_t>{257}));        // whole piece is a rank
  EXPECT_EQ(encode(*tok, "abcd"), (std::vector<int32_t>{257, 'd'}));  // ab, then abc
  EXPECT_EQ(encode(*tok, "xbc"), (std::vector<int32_t>{'x', 258}));
  // "你好" is a rank, but no chain of ranked pairs builds it inside "你好吗".
  EXPECT_EQ(encode(*tok, "你好"), (std::vector<int32_t>{261}));
  EXPECT_EQ(encode(*tok, "你好吗"),
            (std::vector<int32_t>{260, 0xE5, 0xA5, 0xBD, 0xE5, 0x90, 0x97}));
  EXPECT_EQ(encode(*tok, "a b"), (std::vector<int32_t>{'a', ' ', 'b'}));
}

TEST(TiktokenTokenizer, SpecialsFollowTheRanksWithReservedNames) {
  auto tok = small();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), kNumRanks + 256);
  EXPECT_EQ(*tok->token_to_id("[BOS]"), 262);
  EXPECT_EQ(*tok->id_to_token(263), "<|reserved_token_263|>");
  EXPECT_EQ(*tok->token_to_id("Ġ"), ' ');
  EXPECT_EQ(*tok->id_to_token(257), "abc");
  EXPECT_EQ(encode(*tok, "[BOS]abc<|im_end|><|reserved_token_263|>"),
            (std::vector<int32_t>{262, 257, 264, 263}));
  EXPECT_EQ(encode(*tok, "[BOS]", false), (std::vector<int32_t>{'[', 'B', 'O', 'S', ']'}));
}

TEST(TiktokenTokenizer, DecodesExactBytes) {
  auto tok = small();
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = {262, 257, 0xE4, 264};
  EXPECT_EQ(tok->decode(ids), "[BOS]abc\xE4<|im_end|>");
  std::string text = "abcd 你好吗 [BOS] \n\n  x";
  EXPECT_EQ(tok->decode(encode(*tok, text)), text);
}

TEST(TiktokenTokenizer, CutsLongRunsLikeKimi) {
  TiktokenOptions options;
  options.max_run_chars = 3;
  options.max_encode_chars = 8;
  auto tok = small(options);
  ASSERT_NE(tok, nullptr);
  // _split_whitespaces_or_nonwhitespaces("aaaaaaa  b", 3) after cutting into 8-char chunks.
  std::vector<std::string_view> chunks = tok->chunks("aaaaaaa  b");
  EXPECT_EQ(chunks, (std::vector<std::string_view>{"aaa", "aaa", "a ", " b"}));
  EXPECT_EQ(tok->chunks("你好你好你好"), (std::vector<std::string_view>{"你好你", "好你好"}));
  EXPECT_EQ(tok->chunks(""), (std::vector<std::string_view>{""}));
}

TEST(TiktokenTokenizer, MalformedFilesNameLineAndField) {
  auto message = [](std::string_view ranks, std::string_view config = "") {
    auto tok = TiktokenTokenizer::create(ranks, config, {});
    EXPECT_FALSE(tok.ok());
    return tok.ok() ? std::string() : tok.status().message();
  };
  std::string ranks = small_ranks();
  EXPECT_EQ(message(ranks + "YWJj*== 262\n"), "tiktoken.model: line 263: bad base64 \"YWJj*==\"");
  EXPECT_EQ(message(ranks + "eHl6 12\n"),
            "tiktoken.model: line 263: rank 12 is already used on line 13");
  EXPECT_EQ(message(ranks + "YWI= 262\n"),
            "tiktoken.model: line 263: token \"YWI=\" already has rank 256");
  EXPECT_EQ(message(ranks + "eHl6 300\n"),
            "tiktoken.model: rank 262 is missing (ranks must be 0..300)");
  EXPECT_EQ(message(ranks + "eHl6 -4\n"), "tiktoken.model: line 263: bad rank \"-4\"");
  EXPECT_EQ(message(ranks + "eHl6\n"),
            "tiktoken.model: line 263: \"eHl6\" is not \"<base64> <rank>\"");
  EXPECT_EQ(message(ranks.substr(ranks.find('\n') + 1)),
            "tiktoken.model: rank 0 is missing (ranks must be 0..261)");
  EXPECT_EQ(message(ranks, "{\"added_tokens_decoder\": {\"100\": {\"content\": \"x\"}}}"),
            "tokenizer_config.json: added_tokens_decoder[\"100\"]: id is outside the special "
            "range [262, 518) that follows the 262 ranks");
  EXPECT_EQ(message(ranks, "{\"added_tokens_decoder\": {\"262\": {\"special\": true}}}"),
            "tokenizer_config.json: added_tokens_decoder[\"262\"].content: missing or not a "
            "non-empty string");
  EXPECT_EQ(
      message(ranks,
              "{\"added_tokens_decoder\": {\"262\": {\"content\": \"<|reserved_token_263|>\"}}}"),
      "tokenizer_config.json: added_tokens_decoder: \"<|reserved_token_263|>\" names both "
      "id 262 and id 263");
  EXPECT_EQ(message(ranks, "{oops").substr(0, 32), "tokenizer_config.json: bad JSON:");
}

TEST(LoadTokenizer, PicksTheFileTheFolderHas) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "dz_tokenizer_load_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_EQ(load_tokenizer(dir.string()).status().message(),
            dir.string() + ": has neither tokenizer.json nor tiktoken.model");
  std::ofstream(dir / "tiktoken.model") << small_ranks();
  std::ofstream(dir / "tokenizer_config.json") << kConfig;
  auto tok = load_tokenizer(dir.string());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ((*tok)->source(), "tiktoken.model");
  EXPECT_EQ((*tok)->special_tokens().front().content, "[BOS]");
  std::ofstream(dir / "tokenizer.json") << "{\"model\": 3}";
  EXPECT_EQ(load_tokenizer(dir.string()).status().message(),
            (dir / "tokenizer.json").string() + ": model: missing or not an object");
  fs::remove_all(dir);
  EXPECT_EQ(load_tokenizer(dir.string()).status().message(), dir.string() + ": not a directory");
}

}  // namespace tiktoken_tokenizer_test
}  // namespace dz::serve
