#include "dayzero/model/registry.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <unistd.h>

#include "dayzero/model/arch/config_test_util.h"
#include "dayzero/model/inspect.h"

namespace dz::model {
namespace registry_test {

using testing::parse_error;
using testing::parse_ok;
using testing::real_config;

TEST(Registry, ListsSupportedModelTypes) {
  auto types = supported_model_types();
  EXPECT_EQ(std::vector<std::string>(types.begin(), types.end()),
            (std::vector<std::string>{"deepseek_v32", "kimi_linear", "kimi_k3", "dayzero_hybrid"}));
}

// The chat encoding is the registry's fact too: DeepSeek-V3.2 ships an encoder, not a template.
TEST(Registry, ChoosesTheChatEncoding) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("dz_registry_chat_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto encoding_for = [&](const std::string& config_json) {
    std::ofstream(dir / "config.json") << config_json;
    return chat_encoding_of(dir.string());
  };
  EXPECT_EQ(encoding_for(R"({"model_type": "deepseek_v32"})"), ChatEncoding::kDeepseekV32);
  EXPECT_EQ(encoding_for(R"({"model_type": "kimi_linear"})"), ChatEncoding::kTemplate);
  EXPECT_EQ(encoding_for(R"({"model_type": "dayzero_hybrid"})"), ChatEncoding::kTemplate);
  EXPECT_EQ(encoding_for("not json"), ChatEncoding::kTemplate);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(chat_encoding_of(dir.string()), ChatEncoding::kTemplate);  // no config.json
}

TEST(Registry, MapsModelTypesToRecipes) {
  auto ds = parse_ok(real_config("deepseek_v32"));
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->recipe_name(), "deepseek_v32");
  EXPECT_EQ(ds->model_type(), "deepseek_v32");
  auto kl = parse_ok(real_config("kimi_linear"));
  ASSERT_NE(kl, nullptr);
  EXPECT_EQ(kl->recipe_name(), "kimi_linear");
  auto k3 = parse_ok(real_config("kimi_k3"));
  ASSERT_NE(k3, nullptr);
  EXPECT_EQ(k3->recipe_name(), "kimi_linear");
  EXPECT_EQ(k3->model_type(), "kimi_k3");
  // K3's text tensors carry the language_model. prefix; its vision tower sits at the top.
  TensorTable table = k3->tensor_table();
  EXPECT_NE(table.find("language_model.model.embed_tokens.weight"), nullptr);
  EXPECT_NE(table.find("language_model.lm_head.weight"), nullptr);
  EXPECT_EQ(table.find("model.embed_tokens.weight"), nullptr);
  EXPECT_NE(table.find("vision_tower.encoder.blocks.26.wqkv.weight"), nullptr);
  EXPECT_NE(table.find("mm_projector.post_norm.weight"), nullptr);
  EXPECT_TRUE(k3->unchecked_prefixes().empty());
}

TEST(Registry, RefusesUnknownModelTypeListingSupportedOnes) {
  auto config = real_config("deepseek_v32");
  config["model_type"] = "llama";
  EXPECT_EQ(parse_error(config),
            "config.json: field \"model_type\": unknown model_type \"llama\" (supported: "
            "deepseek_v32, kimi_linear, kimi_k3, dayzero_hybrid)");
  auto arch = parse_model_config_text(config.dump(), "config.json");
  EXPECT_EQ(arch.status().code(), StatusCode::kUnsupported);
  config.erase("model_type");
  EXPECT_EQ(parse_error(config), "config.json: field \"model_type\": required field is missing");
}

TEST(Registry, RecognisesGlm5NextButRefusesIt) {
  auto config = real_config("deepseek_v32");
  config["model_type"] = "glm5_next";
  std::string message = parse_error(config);
  EXPECT_TRUE(
      message.starts_with("config.json: field \"model_type\": GLM-5.3-Flash is recognised "
                          "but not supported"))
      << message;
  EXPECT_NE(message.find("mHC hyper-connections"), std::string::npos);
  EXPECT_NE(message.find("pooled-block indexer"), std::string::npos);
}

TEST(Registry, KimiK3NeedsItsNestedKimiLinearTextConfig) {
  auto config = real_config("kimi_k3");
  config["text_config"]["model_type"] = "deepseek_v32";
  EXPECT_EQ(parse_error(config),
            "config.json: field \"text_config.model_type\": expected \"kimi_linear\" inside a "
            "kimi_k3 config, found \"deepseek_v32\"");
  config.erase("text_config");
  EXPECT_EQ(parse_error(config), "config.json: field \"text_config\": required field is missing");
}

TEST(Registry, RefusesBadJson) {
  auto arch = parse_model_config_text("{\"model_type\": \"kimi_linear\"", "config.json");
  ASSERT_FALSE(arch.ok());
  EXPECT_TRUE(arch.status().message().starts_with("config.json: invalid JSON: "));
}

// Parameter totals from the full-size configs against the published figures (docs/models.md §7).
// "Active" excludes the embedding lookup, as the published figures do (inspect.h).
void expect_near_relative(double value, double expected, double tolerance, const char* what) {
  EXPECT_LE(std::abs(value / expected - 1.0), tolerance)
      << what << ": " << value << " vs published " << expected;
}

TEST(Registry, DeepseekV32ParameterTotalsMatchPublished) {
  auto arch = parse_ok(real_config("deepseek_v32"));
  ModelSummary s = summarize_architecture(*arch);
  // 671B main model + 14B MTP = 685B (DeepSeek-V3 report; HF model card); 37B active.
  // Tolerance 0.5% on totals (the published figures are rounded to 1B), 2% on active (37B is
  // rounded from ~37.5B).
  expect_near_relative(static_cast<double>(s.total_params - s.mtp_params), 671e9, 0.005, "main");
  expect_near_relative(static_cast<double>(s.total_params), 685e9, 0.005, "total");
  expect_near_relative(static_cast<double>(s.mtp_params), 14e9, 0.05, "mtp");
  expect_near_relative(static_cast<double>(s.active_params), 37e9, 0.02, "active");
  // Exact pieces: 58 MoE layers × 256 experts × 3 × 2048 × 7168 routed FP8 parameters.
  EXPECT_EQ(s.by_component.at("routed_experts").num_params, 58LL * 256 * 3 * 2048 * 7168);
  EXPECT_EQ(s.by_dtype.at("F8_E4M3").num_bytes, s.by_dtype.at("F8_E4M3").num_params);
  EXPECT_GT(s.by_component.at("scales").num_bytes, 0);
  EXPECT_EQ(s.by_component.at("scales").num_params, 0);
}

TEST(Registry, KimiK3ParameterTotalsMatchPublished) {
  auto arch = parse_ok(real_config("kimi_k3"));
  ModelSummary s = summarize_architecture(*arch);
  // docs/models.md §7.3.3: routed 2.72T, non-expert 56.7B, total 2.78T, active 104B for the text
  // model. Tolerance 0.5% (figures given to three digits).
  int64_t routed = s.by_component.at("routed_experts").num_params;
  EXPECT_EQ(routed, 92LL * 896 * 3 * 3584 * 3072);
  // The vision tower and projector (docs/vision.md §3): patch embedding, position table, 27 blocks
  // (two norms, wqkv, wo, fc0, fc1), final norm; projector 4096² + 7168 × 4096 and its norm.
  const int64_t block = 2 * 1024 + 4608 * 1024 + 1024 * 1536 + 2 * 4096 * 1024;
  const int64_t vision =
      1024 * 588 + 64 * 64 * 1024 + 27 * block + 1024 + 4096LL * 4096 + 7168 * 4096 + 7168;
  EXPECT_EQ(s.by_component.at("vision").num_params, vision);
  const int64_t text = s.total_params - vision;
  expect_near_relative(static_cast<double>(routed), 2.72e12, 0.005, "routed");
  expect_near_relative(static_cast<double>(text - routed), 56.7e9, 0.005, "non-expert");
  expect_near_relative(static_cast<double>(text), 2.78e12, 0.005, "total");
  expect_near_relative(static_cast<double>(s.active_params - vision), 104e9, 0.005, "active");
  EXPECT_EQ(s.mtp_params, 0);
  // MXFP4: packed bytes are half the parameters, one E8M0 scale byte per 32.
  EXPECT_EQ(s.by_dtype.at("U8").num_params, routed);
  EXPECT_EQ(s.by_component.at("scales").num_bytes, routed / 32);
  EXPECT_EQ(s.by_component.at("routed_experts").num_bytes, routed / 2);
}

TEST(Registry, KimiLinearParameterTotalsMatchPublished) {
  auto arch = parse_ok(real_config("kimi_linear"));
  ModelSummary s = summarize_architecture(*arch);
  // "48B total, 3B active" (Kimi-Linear-48B-A3B): whole-billion rounding of 49.1B and 3.1B, so
  // the tolerance is 3% on the total and 5% on active.
  expect_near_relative(static_cast<double>(s.total_params), 48e9, 0.03, "total");
  expect_near_relative(static_cast<double>(s.active_params), 3e9, 0.05, "active");
  EXPECT_EQ(s.by_dtype.count("F8_E4M3"), 0u);
}

}  // namespace registry_test
}  // namespace dz::model
