#include "dayzero/runtime/utf8_stream.h"

#include <random>

#include <gtest/gtest.h>

namespace dz::runtime {
namespace {

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

TEST(Utf8Stream, InvalidBytesPassThrough) {
  Utf8Stream stream;
  EXPECT_EQ(stream.push("x\x80"), "x\x80");  // stray continuation
  EXPECT_EQ(stream.push("\xFF"), "\xFF");    // never valid
  EXPECT_EQ(stream.push("\xC3\xA9\xC3"), "\xC3\xA9");
  EXPECT_EQ(stream.finish(), "\xC3");  // an incomplete end of stream is flushed as is
}

TEST(Utf8Stream, TailLengths) {
  EXPECT_EQ(incomplete_utf8_tail(""), 0u);
  EXPECT_EQ(incomplete_utf8_tail("abc"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2"), 1u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2\x82"), 2u);
  EXPECT_EQ(incomplete_utf8_tail("a\xE2\x82\xAC"), 0u);
  EXPECT_EQ(incomplete_utf8_tail("\xF0\x9F\x98"), 3u);
}

}  // namespace
}  // namespace dz::runtime
