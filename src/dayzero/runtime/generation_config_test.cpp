#include "dayzero/runtime/generation_config.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace dz::runtime {
namespace generation_config_test {

class GenerationConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("dz_generation_config_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    write("config.json", R"({"eos_token_id": 7, "bos_token_id": 0})");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(GenerationConfigTest, ReadsTheSamplingDefaults) {
  write("generation_config.json",
        R"({"eos_token_id": [7, 3], "temperature": 0.6, "top_p": 0.95, "top_k": 20,
            "min_p": 0.05, "repetition_penalty": 1.1, "do_sample": true})");
  Result<GenerationDefaults> d = load_generation_defaults(dir_.string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_EQ(d->eos_token_ids, (std::vector<int32_t>{3, 7}));
  EXPECT_FLOAT_EQ(d->temperature.value(), 0.6f);
  EXPECT_FLOAT_EQ(d->top_p.value(), 0.95f);
  EXPECT_EQ(d->top_k.value(), 20);
  EXPECT_FLOAT_EQ(d->min_p.value(), 0.05f);
  EXPECT_FLOAT_EQ(d->repetition_penalty.value(), 1.1f);
}

TEST_F(GenerationConfigTest, AbsentFieldsStayUnset) {
  write("generation_config.json", R"({"eos_token_id": 7, "temperature": null})");
  Result<GenerationDefaults> d = load_generation_defaults(dir_.string());
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  EXPECT_FALSE(d->temperature);
  EXPECT_FALSE(d->top_p);
  EXPECT_FALSE(d->top_k);
}

TEST_F(GenerationConfigTest, WrongTypesNameTheField) {
  write("generation_config.json", R"({"top_k": 2.5})");
  Result<GenerationDefaults> d = load_generation_defaults(dir_.string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("top_k must be a number"), std::string::npos)
      << d.status().to_string();
  write("generation_config.json", R"({"temperature": "hot"})");
  d = load_generation_defaults(dir_.string());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("temperature"), std::string::npos);
}

}  // namespace generation_config_test
}  // namespace dz::runtime
