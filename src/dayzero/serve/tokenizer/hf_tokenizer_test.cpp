#include "dayzero/serve/tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace dz::serve {
namespace hf_tokenizer_test {

using nlohmann::json;

// A hand-written byte-level BPE: the letters it needs, space as 'Ġ', and merge ranks chosen so
// order matters: (a, b) before (ab, c) before (Ġ, a).
json small_tokenizer() {
  json vocab = {{"a", 0},   {"b", 1},  {"c", 2}, {"Ġ", 3}, {"-", 4},  {"ab", 5},
                {"abc", 6}, {"Ġa", 7}, {"1", 8}, {"2", 9}, {"Ã", 10}, {"©", 11}};
  return {{"added_tokens",
           json::array({{{"id", 20}, {"content", "<s>"}, {"special", true}, {"rstrip", true}},
                        {{"id", 21}, {"content", "<think>"}, {"special", false}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array(
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", "\\p{N}{1,1}"}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"vocab", vocab},
            {"merges", json::array({"a b", "ab c", "Ġ a"})}}}};
}

Result<std::unique_ptr<HfTokenizer>> build(const json& config) {
  return HfTokenizer::from_json(config.dump(), "tokenizer.json");
}

std::vector<int32_t> encode(const HfTokenizer& tok, std::string_view text, bool special = true) {
  Result<std::vector<int32_t>> ids = tok.encode(text, {.allow_special = special});
  EXPECT_TRUE(ids.ok()) << ids.status().to_string();
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST(HfTokenizer, MergesByRankNotByLength) {
  auto tok = build(small_tokenizer());
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode(**tok, "abc"), (std::vector<int32_t>{6}));
  // " ab": (a, b) outranks (Ġ, a), so it is [Ġ, ab], never [Ġa, b].
  EXPECT_EQ(encode(**tok, "abc ab"), (std::vector<int32_t>{6, 3, 5}));
  EXPECT_EQ(encode(**tok, " a-12"), (std::vector<int32_t>{7, 4, 8, 9}));
  EXPECT_EQ(encode(**tok, "é"), (std::vector<int32_t>{10, 11}));  // bytes C3 A9, no merge to one
  EXPECT_EQ((*tok)->vocab_size(), 22);
  EXPECT_EQ(*(*tok)->token_to_id("Ġa"), 7);
  EXPECT_EQ(*(*tok)->id_to_token(20), "<s>");
}

TEST(HfTokenizer, AddedTokensComeFirstAndSpecialsCanBeText) {
  auto tok = build(small_tokenizer());
  ASSERT_TRUE(tok.ok());
  // <s> has rstrip: the spaces after it go with it.
  EXPECT_EQ(encode(**tok, "ab<s>  c<think>a"), (std::vector<int32_t>{5, 20, 2, 21, 0}));
  // As text, '<' and 's' have no tokens and no unk: HF drops them; <think> is not special.
  EXPECT_EQ(encode(**tok, "<s><think>", false), (std::vector<int32_t>{21}));
  ASSERT_EQ((*tok)->special_tokens().size(), 1u);
  EXPECT_EQ((*tok)->special_tokens()[0].content, "<s>");
}

TEST(HfTokenizer, DecodesExactBytes) {
  auto tok = build(small_tokenizer());
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> ids = {6, 3, 5, 20, 10, 11};
  EXPECT_EQ((*tok)->decode(ids), "abc ab<s>é");
  std::vector<int32_t> half = {10, 999, -1};  // a lone lead byte; unknown ids are skipped
  EXPECT_EQ((*tok)->decode(half), "\xC3");
}

TEST(HfTokenizer, ListMergesEqualStringMerges) {
  json config = small_tokenizer();
  config["model"]["merges"] = json::array({{"a", "b"}, {"ab", "c"}, {"Ġ", "a"}});
  auto tok = build(config);
  ASSERT_TRUE(tok.ok()) << tok.status().to_string();
  EXPECT_EQ(encode(**tok, "abc ab"), (std::vector<int32_t>{6, 3, 5}));
}

TEST(HfTokenizer, IgnoreMergesTakesWholeVocabWords) {
  json config = small_tokenizer();
  config["model"]["vocab"]["Ġab"] = 12;  // reachable only as a whole word
  auto plain = build(config);
  config["model"]["ignore_merges"] = true;
  auto ignoring = build(config);
  ASSERT_TRUE(plain.ok() && ignoring.ok());
  EXPECT_EQ(encode(**plain, " ab"), (std::vector<int32_t>{3, 5}));
  EXPECT_EQ(encode(**ignoring, " ab"), (std::vector<int32_t>{12}));
}

TEST(HfTokenizer, SplitBehaviorsFollowHf) {
  auto pieces_with = [](const char* behavior, bool invert, std::string_view text) {
    json config = small_tokenizer();
    config["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"},
               {"pattern", {{"String", "-"}}},
               {"behavior", behavior},
               {"invert", invert}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
    auto tok = build(config);
    EXPECT_TRUE(tok.ok()) << tok.status().to_string();
    return *(*tok)->pre_tokenize(text);
  };
  using Pieces = std::vector<std::string>;
  EXPECT_EQ(pieces_with("Isolated", false, "a-b-"), (Pieces{"a", "-", "b", "-"}));
  EXPECT_EQ(pieces_with("Removed", false, "a-b-"), (Pieces{"a", "b"}));
  EXPECT_EQ(pieces_with("MergedWithPrevious", false, "a-b-"), (Pieces{"a-", "b-"}));
  EXPECT_EQ(pieces_with("MergedWithNext", false, "a-b-"), (Pieces{"a", "-b", "-"}));
  EXPECT_EQ(pieces_with("Contiguous", false, "a--b"), (Pieces{"a", "--", "b"}));
  EXPECT_EQ(pieces_with("Removed", true, "a-b"), (Pieces{"-"}));
}

TEST(HfTokenizer, ByteLevelPrefixSpaceGoesOnEveryPiece) {
  json config = small_tokenizer();
  config["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true;
  auto tok = build(config);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(*(*tok)->pre_tokenize("ab1c"), (std::vector<std::string>{" ab", " 1", " c"}));
}

TEST(HfTokenizer, RefusesInvalidUtf8Text) {
  auto tok = build(small_tokenizer());
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->encode("ab\xFF").status().message(), "text is not valid UTF-8 at byte 2");
}

// Each malformed file is refused with the file, the field and the problem.
TEST(HfTokenizer, MalformedFilesNameTheField) {
  auto message = [](const json& config) {
    auto tok = build(config);
    EXPECT_FALSE(tok.ok());
    return tok.ok() ? std::string() : tok.status().message();
  };
  EXPECT_EQ(
      HfTokenizer::from_json("{\"model\": ", "tokenizer.json").status().message().substr(0, 25),
      "tokenizer.json: bad JSON:");
  json config = small_tokenizer();
  config["model"]["type"] = "WordPiece";
  EXPECT_EQ(message(config),
            "tokenizer.json: model.type: \"WordPiece\" is not supported (only byte-level \"BPE\")");
  config = small_tokenizer();
  config["model"]["merges"].push_back("b q");
  EXPECT_EQ(message(config),
            "tokenizer.json: model.merges[3]: references \"q\", which is not in model.vocab");
  config = small_tokenizer();
  config["model"]["merges"].push_back("b c");
  EXPECT_EQ(message(config),
            "tokenizer.json: model.merges[3]: references \"bc\", which is not in model.vocab");
  config = small_tokenizer();
  config["model"]["merges"].push_back("abc");
  EXPECT_EQ(message(config),
            "tokenizer.json: model.merges[3]: \"abc\" is not two tokens "
            "separated by one space");
  config = small_tokenizer();
  config["model"]["vocab"]["zz"] = 3;
  EXPECT_EQ(message(config), "tokenizer.json: model.vocab[\"Ġ\"]: id 3 is also used by \"zz\"");
  config = small_tokenizer();
  config["model"]["byte_fallback"] = true;
  EXPECT_EQ(message(config),
            "tokenizer.json: model.byte_fallback: true is not supported "
            "(byte-level BPE leaves it unset)");
  config = small_tokenizer();
  config["normalizer"] = {{"type", "NFC"}};
  EXPECT_EQ(message(config),
            "tokenizer.json: normalizer.type: \"NFC\" is not supported "
            "(byte-level BPE checkpoints have none)");
  config = small_tokenizer();
  config["pre_tokenizer"]["pretokenizers"][0] = {{"type", "Metaspace"}};
  EXPECT_EQ(message(config),
            "tokenizer.json: pre_tokenizer.pretokenizers[0].type: \"Metaspace\" "
            "is not supported (Split and ByteLevel are)");
  config = small_tokenizer();
  std::swap(config["pre_tokenizer"]["pretokenizers"][0],
            config["pre_tokenizer"]["pretokenizers"][1]);
  EXPECT_EQ(message(config),
            "tokenizer.json: pre_tokenizer.pretokenizers[0].type: ByteLevel must "
            "be the last pre-tokenizer step and come once");
  config = small_tokenizer();
  config["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(\\p{N}";
  EXPECT_EQ(message(config),
            "tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: "
            "pattern \"(\\p{N}\": missing closing parenthesis at offset 6");
  config = small_tokenizer();
  config["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
  EXPECT_EQ(message(config),
            "tokenizer.json: pre_tokenizer.pretokenizers[0].behavior: "
            "\"Sideways\" is not a split behavior");
  config = small_tokenizer();
  config["decoder"] = nullptr;
  EXPECT_EQ(message(config),
            "tokenizer.json: decoder: null is not supported (byte-level BPE "
            "decodes with ByteLevel)");
  config = small_tokenizer();
  config["added_tokens"][0].erase("content");
  EXPECT_EQ(message(config),
            "tokenizer.json: added_tokens[0]: needs a non-negative integer "
            "\"id\" and a non-empty \"content\"");
}

}  // namespace hf_tokenizer_test
}  // namespace dz::serve
