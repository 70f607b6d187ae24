#include "dayzero/serve/tokenizer/bpe.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace dz::serve {
namespace bpe_test {

TEST(ByteLevel, MatchesGpt2Alphabet) {
  EXPECT_EQ(byte_to_code_point(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(byte_to_code_point('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(byte_to_code_point('a'), uint32_t{'a'});
  EXPECT_EQ(byte_to_code_point(0xAD), 0x143u);  // soft hyphen is the last shifted byte
  EXPECT_EQ(bytes_to_byte_level(" the\n"), "ĠtheĊ");
  EXPECT_EQ(*byte_level_to_bytes("ĠtheĊ"), " the\n");
  EXPECT_FALSE(byte_level_to_bytes("<｜User｜>").has_value());
  for (int byte = 0; byte < 256; ++byte) {
    EXPECT_EQ(*code_point_to_byte(byte_to_code_point(static_cast<uint8_t>(byte))), byte);
  }
}

// The plain algorithm: merge the lowest-rank pair, leftmost on ties, until none merges.
std::vector<std::string> reference_merge(std::vector<std::string> parts,
                                         const std::map<std::string, int>& ranks) {
  while (parts.size() > 1) {
    int best = -1;
    size_t best_pos = 0;
    for (size_t k = 0; k + 1 < parts.size(); ++k) {
      auto it = ranks.find(parts[k] + parts[k + 1]);
      if (it != ranks.end() && (best < 0 || it->second < best)) {
        best = it->second;
        best_pos = k;
      }
    }
    if (best < 0) break;
    parts[best_pos] += parts[best_pos + 1];
    parts.erase(parts.begin() + static_cast<long>(best_pos) + 1);
  }
  return parts;
}

TEST(BpeMerge, MatchesThePlainLoopOnRandomPieces) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    // Random ranks over strings of a small alphabet, so merges overlap and tie.
    std::map<std::string, int> ranks;
    std::vector<std::string> by_id;
    for (char c : std::string("abcd")) {
      ranks[std::string(1, c)] = static_cast<int>(by_id.size());
      by_id.emplace_back(1, c);
    }
    for (int k = 0; k < 30; ++k) {
      std::string token;
      int num_chars = 2 + static_cast<int>(rng() % 4);
      for (int c = 0; c < num_chars; ++c) token += static_cast<char>('a' + rng() % 4);
      if (ranks.emplace(token, static_cast<int>(by_id.size())).second) by_id.push_back(token);
    }
    std::string piece;
    int num_chars = 1 + static_cast<int>(rng() % 40);
    for (int c = 0; c < num_chars; ++c) piece += static_cast<char>('a' + rng() % 4);
    std::vector<int32_t> ids;
    std::vector<std::string> parts;
    for (char c : piece) {
      ids.push_back(ranks.at(std::string(1, c)));
      parts.emplace_back(1, c);
    }
    bpe_merge(ids, [&](int32_t, int32_t, int begin, int, int end) {
      auto it = ranks.find(piece.substr(begin, end - begin));
      return it == ranks.end() ? Merge{} : Merge{it->second, it->second};
    });
    std::vector<std::string> got;
    for (int32_t id : ids) got.push_back(by_id[id]);
    EXPECT_EQ(got, reference_merge(parts, ranks)) << piece;
  }
}

TEST(AddedTokenSplitter, LeftmostLongestWithStripAndSpecialSwitch) {
  AddedTokenSplitter splitter({{.id = 1, .content = "<a>", .special = true},
                               {.id = 2, .content = "<a><b>", .special = true},
                               {.id = 3, .content = "<t>", .rstrip = true},
                               {.id = 4, .content = "<l>", .lstrip = true},
                               {.id = 5, .content = "w", .single_word = true}});
  auto render = [](const std::vector<TextSegment>& segments) {
    std::string out;
    for (const TextSegment& s : segments) {
      out += s.token_id >= 0 ? "#" + std::to_string(s.token_id) : "[" + std::string(s.text) + "]";
    }
    return out;
  };
  EXPECT_EQ(render(splitter.split("x<a><b>y<a>", true)), "[x]#2[y]#1");
  EXPECT_EQ(render(splitter.split("x<a><b>y<a>", false)), "[x<a><b>y<a>]");
  EXPECT_EQ(render(splitter.split("x <t>  \u3000y  <l>z", true)), "[x ]#3[y]#4[z]");
  EXPECT_EQ(render(splitter.split("a w b wx w", true)), "[a ]#5[ b wx ]#5");
}

}  // namespace bpe_test
}  // namespace dz::serve
