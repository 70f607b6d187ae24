#include "dayzero/runtime/ngram_proposer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <random>

namespace dz::runtime {
namespace ngram_proposer_test {

// The definition, spelled out: every (n, end) pair, longest n first, then the latest end.
std::vector<int32_t> reference(const std::vector<int32_t>& t, const NgramConfig& c) {
  const auto len = static_cast<int64_t>(t.size());
  for (int64_t n = c.max_n; n >= c.min_n; --n) {
    if (n > len - 1) continue;
    for (int64_t end = len - 2; end >= n - 1; --end) {
      bool match = true;
      for (int64_t j = 0; j < n; ++j) match &= t[static_cast<size_t>(end - j)] == t[len - 1 - j];
      if (!match) continue;
      std::vector<int32_t> drafts;
      for (int64_t p = end + 1; p < len && p <= end + c.num_speculative_tokens; ++p)
        drafts.push_back(t[static_cast<size_t>(p)]);
      return drafts;
    }
  }
  return {};
}

TEST(NgramProposer, ExamplesLongestThenMostRecent) {
  const NgramConfig c{.min_n = 1, .max_n = 3, .num_speculative_tokens = 2};
  // "5 6 7" occurs at the start and ends the sequence: the tokens after it.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{5, 6, 7, 8, 9, 1, 5, 6, 7}, c),
            (std::vector<int32_t>{8, 9}));
  // Suffix "7" occurs twice: the most recent occurrence's follower.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{7, 1, 2, 7, 3, 4, 7}, c),
            (std::vector<int32_t>{3, 4}));
  // A longer match wins over a more recent shorter one.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{2, 7, 1, 9, 7, 3, 2, 7}, c),
            (std::vector<int32_t>{1, 9}));
  // Fewer followers than k; no match; too short; min_n not reached.
  EXPECT_EQ(propose_ngram(std::vector<int32_t>{4, 5, 4}, c), (std::vector<int32_t>{5, 4}));
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3}, c).empty());
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1}, c).empty());
  EXPECT_TRUE(propose_ngram(std::vector<int32_t>{1, 2, 3, 2},
                            NgramConfig{.min_n = 2, .max_n = 3, .num_speculative_tokens = 2})
                  .empty());
}

TEST(NgramProposer, RandomSequencesMatchTheDefinition) {
  const uint64_t seed = 20261206;
  std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 2000; ++trial) {
    // Small vocabularies make repeats common; planted copies make long matches.
    const auto vocab = static_cast<int32_t>(2 + rng() % 6);
    std::vector<int32_t> t(1 + rng() % 40);
    for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    if (t.size() > 8 && rng() % 2) {
      const size_t from = rng() % (t.size() - 4);
      t.insert(t.end(), t.begin() + static_cast<std::ptrdiff_t>(from),
               t.begin() + static_cast<std::ptrdiff_t>(from + 4));
    }
    NgramConfig c;
    c.min_n = static_cast<int32_t>(1 + rng() % 3);
    c.max_n = c.min_n + static_cast<int32_t>(rng() % 4);
    c.num_speculative_tokens = static_cast<int32_t>(1 + rng() % 5);
    ASSERT_EQ(propose_ngram(t, c), reference(t, c)) << "trial " << trial;
  }
}

TEST(NgramProposer, ConfigChecksNameTheField) {
  EXPECT_TRUE(validate_ngram_config({}).ok());
  EXPECT_NE(validate_ngram_config({.min_n = 0, .max_n = 2, .num_speculative_tokens = 1})
                .message()
                .find("prompt_lookup_min"),
            std::string::npos);
  EXPECT_NE(validate_ngram_config({.min_n = 3, .max_n = 2, .num_speculative_tokens = 1})
                .message()
                .find("prompt_lookup_max"),
            std::string::npos);
  EXPECT_NE(validate_ngram_config({.min_n = 1, .max_n = 2, .num_speculative_tokens = 0})
                .message()
                .find("num_speculative_tokens"),
            std::string::npos);
}

}  // namespace ngram_proposer_test
}  // namespace dz::runtime
