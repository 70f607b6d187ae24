#include "dayzero/model/arch/deepseek_v32.h"

#include <gtest/gtest.h>

#include "dayzero/model/arch/config_test_util.h"

namespace dz::model {
namespace deepseek_v32_test {

using testing::parse_error;
using testing::real_config;

DeepseekV32Config parse_real() {
  auto obj = formats::ConfigObject::parse(real_config("deepseek_v32").dump(), "config.json");
  EXPECT_TRUE(obj.ok());
  auto config = parse_deepseek_v32_config(*obj);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return std::move(config).value();
}

TEST(DeepseekV32, ParsesPublishedConfig) {
  DeepseekV32Config c = parse_real();
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.num_hidden_layers, 61);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_EQ(c.index_topk, 2048);
  EXPECT_EQ(c.n_group, 8);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 2.5);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 40.0);
  EXPECT_EQ(c.quantization_config.method, formats::QuantMethod::kFp8Block);
  EXPECT_EQ(c.quantization_config.scale_fmt, "ue8m0");
}

TEST(DeepseekV32, ScheduleIsThreeDenseThenMoeWithOneMtpLayer) {
  LayerSchedule s = deepseek_v32_schedule(parse_real());
  ASSERT_EQ(s.layers.size(), 62u);
  EXPECT_EQ(s.num_main_layers(), 61);
  EXPECT_EQ(s.num_mtp_layers(), 1);
  EXPECT_EQ(s.count(AttentionKind::kMlaDsa), 61);
  EXPECT_EQ(s.count(FfnKind::kDenseMlp), 3);
  EXPECT_EQ(s.count(FfnKind::kMoe), 58);
  EXPECT_TRUE(s.layers[61].is_mtp);
  EXPECT_EQ(s.layers[61].ffn, FfnKind::kMoe);
  EXPECT_EQ(describe_schedule(s),
            (std::vector<std::string>{"0-2: MLA+DSA + dense MLP", "3-60: MLA+DSA + MoE",
                                      "61: MTP: MLA+DSA + MoE"}));
}

// How each tensor splits across ranks is declared with it (model/blocks/*): heads by column,
// output projections and MLP down by row, experts whole, vocabulary rows, the rest replicated.
TEST(DeepseekV32, TensorSplitsFollowTheBlocks) {
  TensorTable t = deepseek_v32_tensors(parse_real(), "");
  auto split = [&](const std::string& name) { return testing::split_of(t, name); };
  const std::string a = "model.layers.3.self_attn.";
  EXPECT_EQ(split(a + "q_a_proj.weight"), "replicated");
  EXPECT_EQ(split(a + "q_b_proj.weight"), "column");
  EXPECT_EQ(split(a + "q_b_proj.weight_scale_inv"), "column");
  EXPECT_EQ(split(a + "kv_a_proj_with_mqa.weight"), "replicated");
  EXPECT_EQ(split(a + "kv_b_proj.weight"), "column");
  EXPECT_EQ(split(a + "o_proj.weight"), "row");
  EXPECT_EQ(split(a + "o_proj.weight_scale_inv"), "row");
  EXPECT_EQ(split(a + "indexer.wq_b.weight"), "replicated");
  EXPECT_EQ(split("model.layers.3.mlp.gate.weight"), "replicated");
  EXPECT_EQ(split("model.layers.3.mlp.experts.7.gate_proj.weight"), "by_expert");
  EXPECT_EQ(split("model.layers.3.mlp.experts.7.down_proj.weight"), "by_expert");
  EXPECT_EQ(split("model.layers.3.mlp.shared_experts.up_proj.weight"), "column");
  EXPECT_EQ(split("model.layers.3.mlp.shared_experts.down_proj.weight"), "row");
  EXPECT_EQ(split("model.layers.0.mlp.gate_proj.weight"), "column");
  EXPECT_EQ(split("model.layers.0.mlp.down_proj.weight"), "row");
  EXPECT_EQ(split("model.layers.0.input_layernorm.weight"), "replicated");
  EXPECT_EQ(split("model.embed_tokens.weight"), "by_vocab");
  EXPECT_EQ(split("lm_head.weight"), "by_vocab");
  EXPECT_EQ(split("model.layers.61.shared_head.head.weight"), "by_vocab");
  EXPECT_EQ(split("model.layers.61.eh_proj.weight"), "replicated");
  const TensorSpec* expert = t.find("model.layers.3.mlp.experts.7.up_proj.weight");
  ASSERT_NE(expert, nullptr);
  EXPECT_TRUE(expert->is_routed_expert);
  EXPECT_EQ(expert->component, Component::kRoutedExperts);
}

TEST(DeepseekV32, TensorTableMatchesModelsMd) {
  TensorTable t = deepseek_v32_tensors(parse_real(), "");
  auto expect = [&](const std::string& name, Shape shape, DType dtype) {
    const TensorSpec* spec = t.find(name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(spec->shape, shape) << name << " " << spec->shape.to_string();
    EXPECT_EQ(spec->dtypes[0], dtype) << name;
  };
  // docs/models.md §7.1 table for a MoE layer, with the scale shapes it lists.
  expect("model.layers.3.self_attn.q_a_proj.weight", {1536, 7168}, DType::kF8E4M3);
  expect("model.layers.3.self_attn.q_a_proj.weight_scale_inv", {12, 56}, DType::kF32);
  expect("model.layers.3.self_attn.q_b_proj.weight_scale_inv", {192, 12}, DType::kF32);
  expect("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", {576, 7168}, DType::kF8E4M3);
  expect("model.layers.3.self_attn.kv_a_proj_with_mqa.weight_scale_inv", {5, 56}, DType::kF32);
  expect("model.layers.3.self_attn.kv_b_proj.weight_scale_inv", {256, 4}, DType::kF32);
  expect("model.layers.3.self_attn.o_proj.weight", {7168, 16384}, DType::kF8E4M3);
  expect("model.layers.3.self_attn.o_proj.weight_scale_inv", {56, 128}, DType::kF32);
  expect("model.layers.3.self_attn.indexer.wq_b.weight_scale_inv", {64, 12}, DType::kF32);
  expect("model.layers.3.self_attn.indexer.wk.weight_scale_inv", {1, 56}, DType::kF32);
  expect("model.layers.3.self_attn.indexer.k_norm.bias", {128}, DType::kF32);
  expect("model.layers.3.self_attn.indexer.weights_proj.weight", {64, 7168}, DType::kBF16);
  expect("model.layers.3.mlp.gate.weight", {256, 7168}, DType::kBF16);
  expect("model.layers.3.mlp.gate.e_score_correction_bias", {256}, DType::kF32);
  expect("model.layers.3.mlp.experts.255.down_proj.weight_scale_inv", {56, 16}, DType::kF32);
  expect("model.layers.3.mlp.shared_experts.up_proj.weight", {2048, 7168}, DType::kF8E4M3);
  expect("model.layers.0.mlp.gate_proj.weight_scale_inv", {144, 56}, DType::kF32);
  expect("model.layers.0.mlp.down_proj.weight_scale_inv", {56, 144}, DType::kF32);
  expect("model.layers.61.eh_proj.weight", {7168, 14336}, DType::kF8E4M3);
  expect("model.layers.61.shared_head.head.weight", {129280, 7168}, DType::kBF16);
  expect("model.layers.61.self_attn.indexer.wk.weight", {128, 7168}, DType::kF8E4M3);
  expect("lm_head.weight", {129280, 7168}, DType::kBF16);
  EXPECT_EQ(t.find("model.layers.0.mlp.gate.weight"), nullptr);
  EXPECT_EQ(t.find("model.layers.3.mlp.experts.256.up_proj.weight"), nullptr);
  EXPECT_TRUE(t.find("model.layers.61.eh_proj.weight_scale_inv")->only_if_weight_is_fp8);
}

TEST(DeepseekV32, RefusesContradictoryFields) {
  auto with = [](const char* key, nlohmann::json value) {
    auto config = real_config("deepseek_v32");
    config[key] = value;
    return parse_error(config);
  };
  EXPECT_EQ(with("first_k_dense_replace", 61),
            "config.json: field \"first_k_dense_replace\": 61 leaves no MoE layer "
            "(num_hidden_layers 61)");
  EXPECT_EQ(with("num_experts_per_tok", 300),
            "config.json: field \"num_experts_per_tok\": 300 exceeds n_routed_experts 256");
  EXPECT_EQ(with("topk_group", 9), "config.json: field \"topk_group\": 9 exceeds n_group 8");
  EXPECT_EQ(with("n_group", 7),
            "config.json: field \"n_group\": 7 does not divide n_routed_experts 256");
  EXPECT_EQ(with("kv_lora_rank", 0),
            "config.json: field \"kv_lora_rank\": expected a positive integer, found 0");
  EXPECT_EQ(with("q_lora_rank", nullptr),
            "config.json: field \"q_lora_rank\": required field is missing");
  EXPECT_EQ(with("hidden_size", "7168"),
            "config.json: field \"hidden_size\": expected a positive integer, found \"7168\"");
  EXPECT_EQ(with("scoring_func", "softmax"),
            "config.json: field \"scoring_func\": unsupported \"softmax\" (supported: sigmoid)");
  EXPECT_EQ(with("attention_bias", true),
            "config.json: field \"attention_bias\": biased attention is not supported");
  auto config = real_config("deepseek_v32");
  config["quantization_config"]["fmt"] = "e5m2";
  EXPECT_EQ(parse_error(config),
            "config.json: field \"quantization_config.fmt\": unsupported FP8 format \"e5m2\" "
            "(supported: e4m3)");
  config = real_config("deepseek_v32");
  config["rope_scaling"]["beta_fast"] = 0.5;
  EXPECT_EQ(parse_error(config),
            "config.json: field \"rope_scaling.beta_fast\": must exceed beta_slow (0.5 <= 1)");
}

TEST(DeepseekV32, UnquantizedConfigHasPlainLinears) {
  auto config = real_config("deepseek_v32");
  config.erase("quantization_config");
  auto arch = testing::parse_ok(config);
  ASSERT_NE(arch, nullptr);
  TensorTable t = arch->tensor_table();
  EXPECT_EQ(t.find("model.layers.3.self_attn.q_a_proj.weight")->dtypes[0], DType::kBF16);
  EXPECT_EQ(t.find("model.layers.3.self_attn.q_a_proj.weight_scale_inv"), nullptr);
}

}  // namespace deepseek_v32_test
}  // namespace dz::model
