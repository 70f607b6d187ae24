#include "dayzero/runtime/utf8_stream.h"

#include <random>

#include <gtest/gtest.h>

namespace dz::runtime {
namespace utf8_stream_test {

// "aé€😀" in UTF-8: 1 + 2 + 3 + 4 bytes.
const std::string kText = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";

TEST(Utf8Stream, HoldsBackAnIncompleteCharacter) {
  Utf8Stream stream;
  EXPECT_EQ(stream.push("a\xF0\x9F"), "a");
  EXPECT_EQ(stream.push("\x98"), "");
  EXPECT_EQ(stream.push("\x80!"), "\xF0\x9F\x98\x80!");
  EXPECT_EQ(stream.finish(), "");
}

TEST(Utf8Stream, EveryRandomSplitReassemblesOnBoundaries) {
  std::mt19937 rng(12);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text;
    for (int i = 0; i < 5; ++i) text += kText;
    Utf8Stream stream;
    std::string out;
    size_t pos = 0;
    while (pos < text.size()) {
      size_t len = std::min<size_t>(text.size() - pos, 1 + rng() % 4);
      std::string piece = stream.push(text.substr(pos, len));
      EXPECT_EQ(incomplete_utf8_tail(piece), 0u);  // never ends inside a character
      out += piece;
      pos += len;
    }
    out += stream.finish();
    EXPECT_EQ(out, text);
  }
}

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Stream, InvalidBytesBecomeReplacementCharacters) {
  Utf8Stream stream;
  EXPECT_EQ(stream.push("x\x80"), "x" + kFffd);  // stray continuation
  EXPECT_EQ(stream.push("\xFF"), kFffd);         // never valid
  EXPECT_EQ(stream.push("\xC3\xA9\xC3"), "\xC3\xA9");
  EXPECT_EQ(stream.finish(), kFffd);  // an incomplete end of stream
}

TEST(Utf8Stream, MaximalSubpartsAsUnicodeSpecifies) {
  // Unicode §3.9 table 3-8 style cases: one U+FFFD per maximal subpart.
  EXPECT_EQ(replace_invalid_utf8("\xC0\xAF"), kFffd + kFffd);              // overlong lead, stray
  EXPECT_EQ(replace_invalid_utf8("\xE0\x80\xAF"), kFffd + kFffd + kFffd);  // overlong 3-byte
  EXPECT_EQ(replace_invalid_utf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(replace_invalid_utf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);
  EXPECT_EQ(replace_invalid_utf8("\xE2\x82"
                                 "a"),
            kFffd + "a");                         // truncated, then ASCII
  EXPECT_EQ(replace_invalid_utf8(kText), kText);  // valid text is unchanged
}

TEST(Utf8Stream, TailLengths) {
  EXPECT_EQ(incomplete_utf8_tail(""), 0u);
  EXPECT_EQ(incomplete_utf8_tail("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2"), 1u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2\x82"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2\x82\xAC"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98"), 3u);
}

}  // namespace utf8_stream_test
}  // namespace dz::runtime
