#include "dayzero/runtime/stop_strings.h"

#include <random>

#include <gtest/gtest.h>

namespace dz::runtime {
namespace stop_strings_test {

// Pushes pieces one by one; returns what was streamed after each, then finish() if not stopped.
std::vector<std::string> stream(StopMatcher& matcher, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const std::string& piece : pieces) out.push_back(matcher.push(piece));
  if (!matcher.stopped()) out.push_back(matcher.finish());
  return out;
}

TEST(StopMatcher, NoStopStringsStreamsEverything) {
  StopMatcher matcher({});
  EXPECT_EQ(stream(matcher, {"ab", "c", "de"}), (std::vector<std::string>{"ab", "c", "de", ""}));
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcher, StopSplitAcrossTokensCutsBeforeIt) {
  StopMatcher matcher({"END"});
  // "E" and "EN" might start "END": held back until the match completes.
  EXPECT_EQ(stream(matcher, {"hello E", "N", "D tail"}),
            (std::vector<std::string>{"hello ", "", ""}));
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.matched_stop(), "END");
  EXPECT_EQ(matcher.emitted(), "hello ");
  EXPECT_EQ(matcher.push("more"), "");
}

TEST(StopMatcher, IncludeStopStrKeepsIt) {
  StopMatcher matcher({"END"}, /*include_stop_str_in_output=*/true);
  EXPECT_EQ(stream(matcher, {"hello E", "N", "D tail"}),
            (std::vector<std::string>{"hello ", "", "END"}));
  EXPECT_EQ(matcher.emitted(), "hello END");
}

TEST(StopMatcher, HeldBackTextIsReleasedWhenItCannotStartAStop) {
  StopMatcher matcher({"###"});
  EXPECT_EQ(matcher.push("a#"), "a");
  EXPECT_EQ(matcher.push("#"), "");
  EXPECT_EQ(matcher.push("b"), "##b");
  EXPECT_EQ(matcher.push("##"), "");
  EXPECT_EQ(matcher.finish(), "##");  // the completion ended for another reason
  EXPECT_FALSE(matcher.stopped());
  EXPECT_EQ(matcher.emitted(), "a##b##");
}

TEST(StopMatcher, SelfOverlappingStop) {
  // After "aa", "aaa" can still end in "aab": only the first "a" is safe.
  StopMatcher matcher({"aab"});
  EXPECT_EQ(matcher.push("xaa"), "x");
  EXPECT_EQ(matcher.push("a"), "a");
  EXPECT_EQ(matcher.push("b"), "");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.emitted(), "xa");
}

TEST(StopMatcher, OverlappingCandidatesTheEarliestMatchWins) {
  StopMatcher matcher({"cde", "bcdx", "abc"});
  EXPECT_EQ(matcher.push("zab"), "z");
  EXPECT_EQ(matcher.push("cde"), "");
  EXPECT_EQ(matcher.matched_stop(), "abc");
  EXPECT_EQ(matcher.emitted(), "z");
  // At one position the first listed wins.
  StopMatcher same_start({"abcd", "ab"}, true);
  EXPECT_EQ(same_start.push("xabcd"), "xabcd");
  EXPECT_EQ(same_start.matched_stop(), "abcd");
  StopMatcher shorter_first({"ab", "abcd"}, true);
  EXPECT_EQ(shorter_first.push("xabcd"), "xab");
}

TEST(StopMatcher, MatchInsideOneTokenAndFinishReasons) {
  StopMatcher matcher({"\n\n"});
  EXPECT_EQ(matcher.push("one\n\ntwo"), "one");
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(finish_reason_name(FinishReason::kStop), "stop");
  EXPECT_EQ(finish_reason_name(FinishReason::kLength), "length");
  EXPECT_EQ(finish_reason_name(FinishReason::kNone), "");
}

// Fresh random text over a small alphabet, cut into random pieces: the streamed text equals the
// whole text cut before the first occurrence of any stop string, whatever the split (no stop
// string contains another, so the first to complete is the one that starts first).
TEST(StopMatcher, RandomSplitsMatchTheWholeTextSearch) {
  std::mt19937 rng(17);
  const std::vector<std::string> stops = {"aba", "bb", "cab"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string text;
    const int length = std::uniform_int_distribution<int>(1, 30)(rng);
    for (int i = 0; i < length; ++i)
      text.push_back(static_cast<char>('a' + std::uniform_int_distribution<int>(0, 2)(rng)));
    size_t cut = std::string::npos, cut_len = 0;
    for (const std::string& s : stops) {
      const size_t pos = text.find(s);
      if (pos < cut) {
        cut = pos;
        cut_len = s.size();
      }
    }
    for (bool include : {false, true}) {
      StopMatcher matcher(stops, include);
      std::string streamed;
      size_t at = 0;
      while (at < text.size() && !matcher.stopped()) {
        const size_t piece = std::uniform_int_distribution<size_t>(1, 4)(rng);
        streamed += matcher.push(std::string_view(text).substr(at, piece));
        at += piece;
      }
      if (!matcher.stopped()) streamed += matcher.finish();
      const std::string expected =
          cut == std::string::npos ? text : text.substr(0, cut + (include ? cut_len : 0));
      EXPECT_EQ(streamed, expected) << text;
      EXPECT_EQ(matcher.stopped(), cut != std::string::npos) << text;
    }
  }
}

}  // namespace stop_strings_test
}  // namespace dz::runtime
