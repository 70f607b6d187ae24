// The dayzero_hybrid recipe (docs/recipe_dayzero_hybrid.md): the Kimi parser with RoPE MLA + the
// DSA indexer on the full_attn_layers. Parse, schedule, tensor table, and errors that name the
// field.

#include <gtest/gtest.h>

#include "dayzero/model/arch/config_test_util.h"
#include "dayzero/model/arch/kimi_linear.h"

namespace dz::model {
namespace dayzero_hybrid_test {

using testing::parse_error;
using testing::parse_ok;

// The tiny checkpoint's config (make_tiny.dayzero_hybrid_config): KDA layers 1, 3 and MLA layers
// 2, 4 (1-based), latent MXFP4 MoE from layer 1 on, AttnRes blocks of 2.
nlohmann::json hybrid_config() {
  return nlohmann::json::parse(R"json({
    "architectures": ["DayzeroHybridForCausalLM"], "model_type": "dayzero_hybrid",
    "vocab_size": 768, "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4,
    "num_attention_heads": 4, "kv_lora_rank": 128, "q_lora_rank": 64, "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16, "v_head_dim": 32, "mla_use_output_gate": true,
    "rope_theta": 10000.0, "rope_scaling": null,
    "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
    "moe_router_activation_func": "sigmoid", "moe_renormalize": true, "num_expert_group": 1,
    "topk_group": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1, "rms_norm_eps": 1e-05,
    "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 1,
    "moe_intermediate_size": 64, "routed_expert_hidden_size": 64, "latent_moe_use_norm": true,
    "routed_scaling_factor": 2.0, "hidden_act": "silu", "attn_res_block_size": 2,
    "tie_word_embeddings": false,
    "linear_attn_config": {"kda_layers": [1, 3], "full_attn_layers": [2, 4], "num_heads": 4,
                           "head_dim": 32, "short_conv_kernel_size": 4},
    "quantization_config": {"quant_method": "compressed-tensors",
      "format": "mxfp4-pack-quantized", "config_groups": {"group_0": {"targets": ["Linear"],
      "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group",
                  "symmetric": true, "dynamic": false}}},
      "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*"]}
  })json");
}

KimiLinearConfig parse(const nlohmann::json& config) {
  auto obj = formats::ConfigObject::parse(config.dump(), "config.json");
  EXPECT_TRUE(obj.ok());
  auto c = parse_kimi_linear_config(*obj, KimiMlaKind::kRopeDsa);
  EXPECT_TRUE(c.ok()) << c.status().to_string();
  return std::move(c).value();
}

TEST(DayzeroHybrid, ParsesRopeAndIndexerFields) {
  KimiLinearConfig c = parse(hybrid_config());
  ASSERT_TRUE(c.rope_dsa.has_value());
  EXPECT_EQ(c.rope_dsa->rope_theta, 10000.0);
  EXPECT_EQ(c.rope_dsa->index_n_heads, 4);
  EXPECT_EQ(c.rope_dsa->index_head_dim, 128);
  EXPECT_EQ(c.rope_dsa->index_topk, 8);
  EXPECT_FALSE(c.rope_dsa->indexer_rope_interleave);  // rotate-half by default, as V3.2
  EXPECT_FALSE(c.mla_use_nope);
  EXPECT_EQ(c.q_lora_rank, 64);
  EXPECT_EQ(c.quantization_config.method, formats::QuantMethod::kMxfp4CompressedTensors);
  auto with_interleave = hybrid_config();
  with_interleave["indexer_rope_interleave"] = true;
  with_interleave["mla_use_nope"] = false;
  EXPECT_TRUE(parse(with_interleave).rope_dsa->indexer_rope_interleave);
  // The Kimi recipes never set rope_dsa.
  auto obj = formats::ConfigObject::parse(hybrid_config().dump(), "config.json");
  auto kimi = parse_kimi_linear_config(*obj);
  EXPECT_EQ(kimi.status().message(),
            "config.json: field \"mla_use_nope\": required field is missing");
}

TEST(DayzeroHybrid, RegistryScheduleAndTensorTable) {
  auto arch = parse_ok(hybrid_config());
  ASSERT_NE(arch, nullptr);
  EXPECT_EQ(arch->recipe_name(), "dayzero_hybrid");
  EXPECT_EQ(arch->model_type(), "dayzero_hybrid");
  LayerSchedule s = arch->schedule();
  ASSERT_EQ(s.layers.size(), 4u);
  EXPECT_EQ(s.count(AttentionKind::kKda), 2);
  EXPECT_EQ(s.count(AttentionKind::kMlaDsa), 2);
  EXPECT_EQ(s.count(AttentionKind::kMla), 0);
  EXPECT_EQ(s.count(FfnKind::kLatentMoe), 3);
  auto lines = describe_schedule(s);
  EXPECT_EQ(lines.front(), "0: KDA + dense MLP + AttnRes (bank write)");
  EXPECT_EQ(lines[1], "1: MLA+DSA + latent MoE + AttnRes");

  TensorTable t = arch->tensor_table();
  auto expect = [&](const std::string& name, Shape shape, DType dtype) {
    const TensorSpec* spec = t.find(name);
    ASSERT_NE(spec, nullptr) << name;
    EXPECT_EQ(spec->shape, shape) << name << " " << spec->shape.to_string();
    EXPECT_EQ(spec->dtypes[0], dtype) << name;
  };
  const std::string a = "model.layers.1.self_attn.";
  expect(a + "q_a_proj.weight", {64, 128}, DType::kBF16);
  expect(a + "q_a_layernorm.weight", {64}, DType::kBF16);
  expect(a + "q_b_proj.weight", {4 * 48, 64}, DType::kBF16);
  expect(a + "kv_a_proj_with_mqa.weight", {128 + 16, 128}, DType::kBF16);
  expect(a + "kv_b_proj.weight", {4 * 64, 128}, DType::kBF16);
  expect(a + "g_proj.weight", {4 * 32, 128}, DType::kBF16);
  expect(a + "indexer.wq_b.weight", {4 * 128, 64}, DType::kBF16);
  expect(a + "indexer.wk.weight", {128, 128}, DType::kBF16);
  expect(a + "indexer.k_norm.weight", {128}, DType::kF32);
  expect(a + "indexer.k_norm.bias", {128}, DType::kF32);
  expect(a + "indexer.weights_proj.weight", {4, 128}, DType::kBF16);
  expect("model.layers.0.self_attn.f_a_proj.weight", {32, 128}, DType::kBF16);
  expect("model.layers.1.block_sparse_moe.experts.15.w1.weight_packed", {64, 32}, DType::kU8);
  expect("model.output_attn_res_proj.weight", {1, 128}, DType::kBF16);
  EXPECT_EQ(t.find("model.layers.0.self_attn.indexer.wk.weight"), nullptr);  // KDA layer
  EXPECT_EQ(t.find("model.layers.1.self_attn.q_proj.weight"), nullptr);
}

TEST(DayzeroHybrid, MtpLayerFollowsTheMainLayers) {
  auto config = hybrid_config();
  config["num_nextn_predict_layers"] = 1;
  auto arch = parse_ok(config);
  ASSERT_NE(arch, nullptr);
  LayerSchedule s = arch->schedule();
  ASSERT_EQ(s.layers.size(), 5u);
  EXPECT_EQ(s.num_main_layers(), 4);
  EXPECT_EQ(s.num_mtp_layers(), 1);
  const LayerSpec& mtp = s.layers.back();
  EXPECT_EQ(mtp.layer_id, 4);
  EXPECT_TRUE(mtp.is_mtp);
  EXPECT_EQ(mtp.attention, AttentionKind::kMlaDsa);
  EXPECT_EQ(mtp.ffn, FfnKind::kLatentMoe);
  EXPECT_FALSE(mtp.attn_res);  // the MTP layer adds its sublayers to a plain residual
  EXPECT_EQ(describe_schedule(s).back(), "4: MTP: MLA+DSA + latent MoE");

  TensorTable t = arch->tensor_table();
  const std::string p = "model.layers.4.";
  for (const char* name :
       {"enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight",
        "embed_tokens.weight", "shared_head.head.weight", "self_attn.indexer.wk.weight",
        "block_sparse_moe.experts.0.w1.weight_packed"})
    EXPECT_NE(t.find(p + name), nullptr) << name;
  EXPECT_EQ(t.find(p + "eh_proj.weight")->shape, (Shape{128, 256}));
  EXPECT_EQ(t.find(p + "self_attention_res_proj.weight"), nullptr);
  EXPECT_EQ(t.find(p + "self_attn.f_a_proj.weight"), nullptr);

  config["num_nextn_predict_layers"] = 2;
  EXPECT_EQ(parse_error(config),
            "config.json: field \"num_nextn_predict_layers\": dayzero_hybrid defines at most one "
            "MTP layer");
}

TEST(DayzeroHybrid, ErrorsNameTheField) {
  auto error = [](const char* field, const nlohmann::json& value) {
    auto config = hybrid_config();
    if (value.is_discarded())
      config.erase(field);
    else
      config[field] = value;
    return parse_error(config);
  };
  const nlohmann::json erase = nlohmann::json::value_t::discarded;
  EXPECT_EQ(error("mla_use_nope", true),
            "config.json: field \"mla_use_nope\": must be absent or false for dayzero_hybrid (its "
            "MLA uses RoPE)");
  EXPECT_EQ(error("q_lora_rank", erase),
            "config.json: field \"q_lora_rank\": is required for dayzero_hybrid (the DSA indexer "
            "reads the q latent)");
  EXPECT_EQ(error("rope_theta", erase),
            "config.json: field \"rope_theta\": required field is missing");
  EXPECT_EQ(error("rope_theta", 0.5),
            "config.json: field \"rope_theta\": expected a number above 1, found 0.5");
  EXPECT_EQ(error("rope_scaling", {{"type", "yarn"}, {"factor", 40}}),
            "config.json: field \"rope_scaling\": must be null or absent for dayzero_hybrid (plain "
            "RoPE frequencies; YaRN is not part of this recipe)");
  EXPECT_EQ(error("index_topk", erase),
            "config.json: field \"index_topk\": required field is missing");
  EXPECT_EQ(error("index_n_heads", 0),
            "config.json: field \"index_n_heads\": expected a positive integer, found 0");
  EXPECT_EQ(error("index_head_dim", 8),
            "config.json: field \"index_head_dim\": 8 is smaller than its rope part "
            "qk_rope_head_dim 16");
  EXPECT_EQ(
      error("indexer_rope_interleave", "yes"),
      "config.json: field \"indexer_rope_interleave\": expected true or false, found \"yes\"");
  EXPECT_EQ(error("qk_rope_head_dim", 15),
            "config.json: field \"qk_rope_head_dim\": 15 is odd; RoPE rotates pairs");
  // The Kimi checks still apply.
  EXPECT_EQ(error("moe_router_activation_func", "softmax"),
            "config.json: field \"moe_router_activation_func\": unsupported \"softmax\" "
            "(supported: sigmoid)");
}

}  // namespace dayzero_hybrid_test
}  // namespace dz::model
