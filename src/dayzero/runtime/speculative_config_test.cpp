#include "dayzero/runtime/speculative_config.h"

#include <gtest/gtest.h>

#include <string>

namespace dz::runtime {
namespace speculative_config_test {

std::string error_of(std::string_view json) {
  const Result<SpeculativeConfig> config = parse_speculative_config(json);
  EXPECT_FALSE(config.ok()) << json;
  return config.ok() ? std::string() : config.status().message();
}

TEST(SpeculativeConfig, ParsesVllmSpellingWithItsDefaults) {
  Result<SpeculativeConfig> off = parse_speculative_config("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());

  Result<SpeculativeConfig> ngram = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4})");
  ASSERT_TRUE(ngram.ok()) << ngram.status().to_string();
  EXPECT_EQ(ngram->method, SpeculativeMethod::kNgram);
  EXPECT_EQ(ngram->num_speculative_tokens(), 3);
  EXPECT_EQ(ngram->ngram.min_n, 4);  // one bound sets the other, as vLLM
  EXPECT_EQ(ngram->ngram.max_n, 4);

  Result<SpeculativeConfig> both = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
          "prompt_lookup_max": 5, "disable_by_batch_size": 4})");
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->ngram.min_n, 2);
  EXPECT_EQ(both->ngram.max_n, 5);
  EXPECT_EQ(both->disable_by_batch_size, 4);

  Result<SpeculativeConfig> neither =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 2})");
  ASSERT_TRUE(neither.ok());
  EXPECT_EQ(neither->ngram.min_n, 5);
  EXPECT_EQ(neither->ngram.max_n, 5);

  Result<SpeculativeConfig> mtp =
      parse_speculative_config(R"({"method": "mtp", "num_speculative_tokens": 1})");
  ASSERT_TRUE(mtp.ok());
  EXPECT_EQ(mtp->method, SpeculativeMethod::kMtp);
}

TEST(SpeculativeConfig, BadConfigsNameWhatIsWrong) {
  EXPECT_NE(error_of("{not json").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of("[1]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"num_speculative_tokens": 2})").find("method"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "eagle", "num_speculative_tokens": 2})").find("eagle"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram"})").find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 0})")
                .find("num_speculative_tokens"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": "3"})").find("integer"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 2, "model": "x"})")
                .find("unknown key \"model\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 2,
                         "prompt_lookup_min": 4, "prompt_lookup_max": 2})")
                .find("prompt_lookup_max"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "mtp", "num_speculative_tokens": 2, "prompt_lookup_max": 2})")
                .find("ngram"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"method": "ngram", "num_speculative_tokens": 2,
                         "disable_by_batch_size": 0})")
                .find("disable_by_batch_size"),
            std::string::npos);
}

}  // namespace speculative_config_test
}  // namespace dz::runtime
