#include "dayzero/model/arch/kimi_linear.h"

#include <gtest/gtest.h>

#include "dayzero/model/arch/config_test_util.h"

namespace dz::model {
namespace kimi_linear_test {

using testing::parse_error;
using testing::real_config;

KimiLinearConfig parse(const nlohmann::json& text_config) {
  auto obj = formats::ConfigObject::parse(text_config.dump(), "config.json");
  EXPECT_TRUE(obj.ok());
  auto config = parse_kimi_linear_config(*obj);
  EXPECT_TRUE(config.ok()) << config.status().to_string();
  return std::move(config).value();
}

std::vector<int> mla_layers(const LayerSchedule& s) {
  std::vector<int> out;
  for (const auto& layer : s.layers)
    if (layer.attention == AttentionKind::kMla) out.push_back(layer.layer_id);
  return out;
}

TEST(KimiLinear, PublishedScheduleHasMlaAtEveryFourthLayerAndTheLast) {
  KimiLinearConfig c = parse(real_config("kimi_linear"));
  EXPECT_FALSE(c.q_lora_rank.has_value());                // null in the file
  EXPECT_EQ(c.linear_attn_config.kda_layers.front(), 0);  // 1-based in the file
  LayerSchedule s = kimi_linear_schedule(c);
  EXPECT_EQ(mla_layers(s), (std::vector<int>{3, 7, 11, 15, 19, 23, 26}));
  EXPECT_EQ(s.count(AttentionKind::kKda), 20);
  EXPECT_EQ(s.count(FfnKind::kDenseMlp), 1);
  EXPECT_EQ(s.count(FfnKind::kMoe), 26);
  EXPECT_FALSE(s.layers[0].attn_res);
  auto lines = describe_schedule(s);
  EXPECT_EQ(lines.front(), "0: KDA + dense MLP");
  EXPECT_EQ(lines[1], "1-2: KDA + MoE");
  EXPECT_EQ(lines[2], "3: MLA + MoE");
  EXPECT_EQ(lines.back(), "26: MLA + MoE");
}

// KDA splits by head, its output by row, A_log whole (K3 pads it; each rank reads its heads);
// K3's latent MoE projections are replicated, its experts whole.
TEST(KimiLinear, TensorSplitsFollowTheBlocks) {
  TensorTable t =
      kimi_linear_tensors(parse(real_config("kimi_k3")["text_config"]), "language_model.");
  auto split = [&](const std::string& name) {
    return testing::split_of(t, "language_model." + name);
  };
  const std::string kda = "model.layers.0.self_attn.";
  EXPECT_EQ(split(kda + "q_proj.weight"), "column");
  EXPECT_EQ(split(kda + "q_conv1d.weight"), "column");
  EXPECT_EQ(split(kda + "f_a_proj.weight"), "replicated");
  EXPECT_EQ(split(kda + "f_b_proj.weight"), "column");
  EXPECT_EQ(split(kda + "A_log"), "replicated");
  EXPECT_EQ(split(kda + "dt_bias"), "column");
  EXPECT_EQ(split(kda + "o_norm.weight"), "replicated");
  EXPECT_EQ(split(kda + "o_proj.weight"), "row");
  const std::string moe = "model.layers.1.block_sparse_moe.";
  EXPECT_EQ(split(moe + "routed_expert_down_proj.weight"), "replicated");
  EXPECT_EQ(split(moe + "experts.3.w1.weight_packed"), "by_expert");
  EXPECT_EQ(split(moe + "experts.3.w2.weight_scale"), "by_expert");
  EXPECT_EQ(split(moe + "shared_experts.gate_proj.weight"), "column");
  EXPECT_EQ(split("model.layers.1.self_attention_res_proj.weight"), "replicated");
}

TEST(KimiLinear, TensorTableMatchesModelsMd) {
  TensorTable t = kimi_linear_tensors(parse(real_config("kimi_linear")), "");
  auto expect = [&](const std::string& name, Shape shape, DType dtype) {
    const TensorSpec* spec = t.find(name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(spec->shape, shape) << name << " " << spec->shape.to_string();
    EXPECT_EQ(spec->dtypes[0], dtype) << name;
  };
  expect("model.layers.0.self_attn.q_proj.weight", {4096, 2304}, DType::kBF16);
  expect("model.layers.0.self_attn.q_conv1d.weight", {4096, 1, 4}, DType::kBF16);
  expect("model.layers.0.self_attn.f_a_proj.weight", {128, 2304}, DType::kBF16);
  expect("model.layers.0.self_attn.f_b_proj.weight", {4096, 128}, DType::kBF16);
  expect("model.layers.0.self_attn.dt_bias", {4096}, DType::kF32);
  expect("model.layers.0.self_attn.A_log", {1, 1, 32, 1}, DType::kF32);
  expect("model.layers.0.self_attn.b_proj.weight", {32, 2304}, DType::kBF16);
  expect("model.layers.0.self_attn.g_a_proj.weight", {128, 2304}, DType::kBF16);
  expect("model.layers.0.self_attn.g_b_proj.weight", {4096, 128}, DType::kBF16);
  expect("model.layers.0.self_attn.o_norm.weight", {128}, DType::kBF16);
  expect("model.layers.0.self_attn.o_proj.weight", {2304, 4096}, DType::kBF16);
  expect("model.layers.3.self_attn.q_proj.weight", {6144, 2304}, DType::kBF16);
  expect("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", {576, 2304}, DType::kBF16);
  expect("model.layers.3.self_attn.kv_b_proj.weight", {8192, 512}, DType::kBF16);
  expect("model.layers.3.self_attn.o_proj.weight", {2304, 4096}, DType::kBF16);
  expect("model.layers.0.mlp.gate_proj.weight", {9216, 2304}, DType::kBF16);
  expect("model.layers.1.block_sparse_moe.gate.weight", {256, 2304}, DType::kBF16);
  expect("model.layers.1.block_sparse_moe.gate.e_score_correction_bias", {256}, DType::kF32);
  expect("model.layers.1.block_sparse_moe.experts.255.w1.weight", {1024, 2304}, DType::kBF16);
  expect("model.layers.1.block_sparse_moe.experts.0.w2.weight", {2304, 1024}, DType::kBF16);
  expect("model.layers.1.block_sparse_moe.shared_experts.down_proj.weight", {2304, 1024},
         DType::kBF16);
  expect("lm_head.weight", {163840, 2304}, DType::kBF16);
  EXPECT_EQ(t.find("model.layers.3.self_attn.g_proj.weight"), nullptr);
  EXPECT_EQ(t.find("model.layers.3.self_attn.q_a_proj.weight"), nullptr);
}

TEST(KimiK3, PublishedScheduleAndFeatures) {
  KimiLinearConfig c = parse(real_config("kimi_k3")["text_config"]);
  EXPECT_EQ(c.q_lora_rank, 1536);
  EXPECT_TRUE(c.mla_use_output_gate);
  EXPECT_TRUE(c.linear_attn_config.use_full_rank_gate);
  EXPECT_EQ(c.linear_attn_config.gate_lower_bound, -5.0);
  EXPECT_EQ(c.attn_res_block_size, 12);
  EXPECT_EQ(c.routed_expert_hidden_size, 3584);
  EXPECT_EQ(c.hidden_act, "situ");
  EXPECT_EQ(c.quantization_config.method, formats::QuantMethod::kMxfp4CompressedTensors);
  LayerSchedule s = kimi_linear_schedule(c);
  ASSERT_EQ(s.layers.size(), 93u);
  for (const auto& layer : s.layers) {
    int i = layer.layer_id;
    EXPECT_EQ(layer.attention == AttentionKind::kMla, i % 4 == 3 || i == 92) << i;
    EXPECT_EQ(layer.ffn, i == 0 ? FfnKind::kDenseMlp : FfnKind::kLatentMoe) << i;
    EXPECT_TRUE(layer.attn_res);
    EXPECT_EQ(layer.attn_res_write, i % 12 == 0) << i;
  }
  EXPECT_EQ(s.count(AttentionKind::kMla), 24);
  EXPECT_EQ(s.count(AttentionKind::kKda), 69);
}

TEST(KimiK3, TensorTableMatchesModelsMd) {
  TensorTable t =
      kimi_linear_tensors(parse(real_config("kimi_k3")["text_config"]), "language_model.");
  auto expect = [&](const std::string& name, Shape shape, DType dtype) {
    const TensorSpec* spec = t.find("language_model." + name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(spec->shape, shape) << name << " " << spec->shape.to_string();
    EXPECT_EQ(spec->dtypes[0], dtype) << name;
  };
  const std::string l0 = "model.layers.0.", l3 = "model.layers.3.", l1 = "model.layers.1.";
  expect(l0 + "self_attn.g_proj.weight", {12288, 7168}, DType::kBF16);
  expect(l0 + "self_attn.k_conv1d.weight", {12288, 1, 4}, DType::kF32);
  expect(l0 + "self_attn.A_log", {128}, DType::kF32);
  expect(l0 + "self_attn.o_norm.weight", {128}, DType::kF32);
  expect(l0 + "self_attn.b_proj.weight", {96, 7168}, DType::kBF16);
  expect(l3 + "self_attn.q_b_proj.weight", {18432, 1536}, DType::kBF16);
  expect(l3 + "self_attn.kv_b_proj.weight", {24576, 512}, DType::kBF16);
  expect(l3 + "self_attn.g_proj.weight", {12288, 7168}, DType::kBF16);
  expect(l0 + "mlp.up_proj.weight", {33792, 7168}, DType::kBF16);
  expect(l1 + "block_sparse_moe.gate.weight", {896, 7168}, DType::kBF16);
  expect(l1 + "block_sparse_moe.routed_expert_down_proj.weight", {3584, 7168}, DType::kBF16);
  expect(l1 + "block_sparse_moe.routed_expert_norm.weight", {3584}, DType::kBF16);
  expect(l1 + "block_sparse_moe.routed_expert_up_proj.weight", {7168, 3584}, DType::kBF16);
  expect(l1 + "block_sparse_moe.shared_experts.gate_proj.weight", {6144, 7168}, DType::kBF16);
  expect(l1 + "block_sparse_moe.experts.895.w1.weight_packed", {3072, 1792}, DType::kU8);
  expect(l1 + "block_sparse_moe.experts.895.w1.weight_scale", {3072, 112}, DType::kU8);
  expect(l1 + "block_sparse_moe.experts.0.w2.weight_packed", {3584, 1536}, DType::kU8);
  expect(l1 + "block_sparse_moe.experts.0.w2.weight_scale", {3584, 96}, DType::kU8);
  expect(l1 + "self_attention_res_proj.weight", {1, 7168}, DType::kBF16);
  expect(l1 + "mlp_res_norm.weight", {7168}, DType::kBF16);
  expect("model.output_attn_res_proj.weight", {1, 7168}, DType::kBF16);
  expect("lm_head.weight", {163840, 7168}, DType::kBF16);
  EXPECT_EQ(t.find("language_model.model.layers.0.self_attn.g_a_proj.weight"), nullptr);
}

TEST(KimiLinear, RefusesBadLayerLists) {
  auto with_lists = [](nlohmann::json kda, nlohmann::json full) {
    auto config = real_config("kimi_linear");
    config["linear_attn_config"]["kda_layers"] = kda;
    config["linear_attn_config"]["full_attn_layers"] = full;
    return parse_error(config);
  };
  std::vector<int> kda = {1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26};
  std::vector<int> full = {4, 8, 12, 16, 20, 24, 27};
  EXPECT_EQ(with_lists(kda, full), "");
  // 0-based lists are caught: layer 27 is missing and 0 is not a positive integer.
  std::vector<int> zero_based = full;
  for (int& v : zero_based) v -= 1;
  EXPECT_EQ(with_lists(kda, zero_based),
            "config.json: field \"linear_attn_config.full_attn_layers[0]\": layer 3 is also in "
            "kda_layers");
  auto overlap = full;
  overlap.push_back(5);
  EXPECT_EQ(with_lists(kda, overlap),
            "config.json: field \"linear_attn_config.full_attn_layers[7]\": layer 5 is also in "
            "kda_layers");
  auto incomplete = full;
  incomplete.pop_back();
  EXPECT_EQ(with_lists(kda, incomplete),
            "config.json: field \"linear_attn_config.kda_layers\": layer 27 (1-based) is in "
            "neither kda_layers nor full_attn_layers; together they must cover 1..27");
  auto duplicate = kda;
  duplicate.push_back(2);
  EXPECT_EQ(with_lists(duplicate, full),
            "config.json: field \"linear_attn_config.kda_layers[20]\": layer 2 is listed twice");
  auto out_of_range = full;
  out_of_range.back() = 28;
  EXPECT_EQ(with_lists(kda, out_of_range),
            "config.json: field \"linear_attn_config.full_attn_layers[6]\": layer 28 is out of "
            "range 1..27 (the list is 1-based)");
  auto config = real_config("kimi_linear");
  config["linear_attn_config"]["kda_layers"][3] = "x";
  EXPECT_EQ(parse_error(config),
            "config.json: field \"linear_attn_config.kda_layers[3]\": expected a positive "
            "integer, found \"x\"");
  config["linear_attn_config"]["kda_layers"][3] = 0;
  EXPECT_EQ(parse_error(config),
            "config.json: field \"linear_attn_config.kda_layers[3]\": expected a positive "
            "integer, found 0");
}

TEST(KimiLinear, RefusesContradictoryFields) {
  auto with = [](const char* key, nlohmann::json value) {
    auto config = real_config("kimi_linear");
    config[key] = value;
    return parse_error(config);
  };
  EXPECT_EQ(with("num_experts_per_token", 257),
            "config.json: field \"num_experts_per_token\": 257 exceeds num_experts 256");
  EXPECT_EQ(with("topk_group", 2),
            "config.json: field \"topk_group\": 2 exceeds num_expert_group 1");
  EXPECT_EQ(with("first_k_dense_replace", 27),
            "config.json: field \"first_k_dense_replace\": 27 leaves no MoE layer "
            "(num_hidden_layers 27)");
  EXPECT_EQ(with("mla_use_nope", false),
            "config.json: field \"mla_use_nope\": must be true: Kimi MLA with RoPE is not "
            "supported");
  EXPECT_EQ(with("moe_router_activation_func", "softmax"),
            "config.json: field \"moe_router_activation_func\": unsupported \"softmax\" "
            "(supported: sigmoid)");
  EXPECT_EQ(with("kv_lora_rank", -1),
            "config.json: field \"kv_lora_rank\": expected a positive integer, found -1");
  EXPECT_EQ(with("num_nextn_predict_layers", 1),
            "config.json: field \"num_nextn_predict_layers\": MTP layers are not defined for "
            "kimi_linear");
  EXPECT_EQ(with("hidden_act", "situ"),
            "config.json: field \"activation_situ_beta\": required field is missing");
}

TEST(KimiK3, RefusesBadNestedFields) {
  auto config = real_config("kimi_k3");
  config["text_config"]["linear_attn_config"]["short_conv_kernel_size"] = 9;
  EXPECT_EQ(parse_error(config),
            "config.json: field \"text_config.linear_attn_config.short_conv_kernel_size\": 9 "
            "exceeds 8, the widest short convolution dayzero runs");
  config = real_config("kimi_k3");
  config["text_config"]["linear_attn_config"]["gate_lower_bound"] = 1.0;
  EXPECT_EQ(parse_error(config),
            "config.json: field \"text_config.linear_attn_config.gate_lower_bound\": expected a "
            "negative number, found 1.0");
  config = real_config("kimi_k3");
  config["text_config"]["quantization_config"]["config_groups"]["group_0"]["weights"]["num_bits"] =
      8;
  EXPECT_EQ(parse_error(config),
            "config.json: field "
            "\"text_config.quantization_config.config_groups.group_0.weights.num_bits\": expected "
            "4, found 8");
  config = real_config("kimi_k3");
  config["text_config"]["quantization_config"] = {{"quant_method", "fp8"},
                                                  {"fmt", "e4m3"},
                                                  {"activation_scheme", "dynamic"},
                                                  {"weight_block_size", {128, 128}}};
  EXPECT_EQ(parse_error(config),
            "config.json: field \"text_config.quantization_config\": fp8 e4m3 weights, 128x128 "
            "blocks, scale_fmt plain is not a kimi_linear format (supported: compressed-tensors "
            "mxfp4-pack-quantized or none)");
  config = real_config("kimi_k3");
  config["text_config"]["routed_expert_hidden_size"] = 3580;
  EXPECT_EQ(parse_error(config),
            "config.json: field \"text_config.quantization_config\": MXFP4 experts need in-dims "
            "divisible by 32 (expert width 3580, moe_intermediate_size 3072)");
}

}  // namespace kimi_linear_test
}  // namespace dz::model
