// Synthetic models (synthetic_model.h): config parsing and its errors by field, the byte counts
// the benchmarks divide by, and models that run: finite logits of RMS O(1) after many layers,
// the same logits from the same seed, other logits from another seed.
#include "dayzero/model/synthetic_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "dayzero/model/kv_cache.h"

namespace dz::model {
namespace synthetic_model_test {

// A small hybrid with every mixer, a dense first layer then MoE, FP8 weights, MXFP4 experts and
// the FP8 latent cache.
constexpr const char* kHybridJson = R"({
  "description": "test hybrid",
  "vocab_size": 200, "hidden_size": 64, "num_layers": 6,
  "mixer_pattern": ["kda", "mla_dsa", "mla"],
  "mla": {"num_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 128, "qk_nope_head_dim": 16,
          "qk_rope_head_dim": 8, "v_head_dim": 16},
  "dsa": {"index_n_heads": 2, "index_head_dim": 128, "index_topk": 4},
  "kda": {"num_heads": 2, "head_dim": 16, "conv_width": 4, "gate_rank": 8},
  "ffn": {"kind": "moe", "first_dense_layers": 1, "intermediate_size": 96, "num_experts": 8,
          "num_experts_per_tok": 2, "moe_intermediate_size": 32, "num_shared_experts": 1},
  "weight_format": "fp8_block", "expert_format": "mxfp4", "kv_cache_dtype": "fp8", "seed": 5
})";

constexpr const char* kDenseJson = R"({
  "vocab_size": 100, "hidden_size": 64, "num_layers": 2, "mixer_pattern": ["mla"],
  "mla": {"num_heads": 2, "q_lora_rank": 0, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
          "qk_rope_head_dim": 8, "v_head_dim": 16},
  "ffn": {"kind": "dense", "intermediate_size": 128}
})";

SyntheticModelConfig parse_ok(const std::string& text) {
  Result<SyntheticModelConfig> c = parse_synthetic_config(text);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : SyntheticModelConfig{};
}

// Logits [n, V] of one sequence of n tokens prefilled in one batch (state slot 0).
std::vector<float> prefill_logits(HybridModel& model, const std::vector<int32_t>& tokens) {
  constexpr int64_t kBlock = 16;
  const auto n = static_cast<int64_t>(tokens.size());
  Result<KvCache> cache = KvCache::create(model.cache_layers(), n / kBlock + 2, kBlock, 1);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  std::vector<int32_t> table(static_cast<size_t>(n / kBlock + 1));
  std::iota(table.begin(), table.end(), 1);
  std::vector<int32_t> positions(static_cast<size_t>(n));
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<int64_t> slots;
  for (int32_t p : positions) slots.push_back(slot_of(table, kBlock, p));
  ForwardBatch batch;
  batch.block_size = kBlock;
  batch.sequences.push_back(SequenceSlice{
      .token_begin = 0, .num_tokens = n, .pos_begin = 0, .block_table = table, .state_slot = 0});
  batch.token_ids = tokens;
  batch.positions = positions;
  batch.slot_mapping = slots;
  std::vector<int64_t> rows(static_cast<size_t>(n));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  std::vector<float> logits(static_cast<size_t>(n * model.vocab_size()));
  const Status status =
      model.forward(ExecContext{.num_threads = 2}, batch, *cache, rows, logits.data(), nullptr);
  EXPECT_TRUE(status.ok()) << status.message();
  return logits;
}

double rms(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += double{x} * x;
  return std::sqrt(sum / static_cast<double>(v.size()));
}

TEST(SyntheticModelTest, ParsesEveryField) {
  const SyntheticModelConfig c = parse_ok(kHybridJson);
  EXPECT_EQ(c.vocab_size, 200);
  EXPECT_EQ(c.num_layers, 6);
  ASSERT_EQ(c.mixer_pattern.size(), 3u);
  EXPECT_EQ(c.mixer(3), SyntheticMixer::kKda);
  EXPECT_EQ(c.mixer(4), SyntheticMixer::kMlaDsa);
  EXPECT_EQ(c.mixer(5), SyntheticMixer::kMla);
  EXPECT_EQ(c.mla.kv_lora_rank, 128);
  EXPECT_EQ(c.dsa.index_topk, 4);
  EXPECT_EQ(c.kda.gate_rank, 8);
  EXPECT_TRUE(c.ffn.moe);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.ffn.num_shared_experts, 1);
  EXPECT_EQ(c.weight_format, SyntheticFormat::kFp8Block);
  EXPECT_EQ(c.expert_format, SyntheticFormat::kMxfp4);
  EXPECT_EQ(c.kv_cache_dtype, kernels::KvCacheDtype::kFp8);
  EXPECT_EQ(c.seed, 5u);
  const SyntheticModelConfig dense = parse_ok(kDenseJson);  // defaults
  EXPECT_EQ(dense.weight_format, SyntheticFormat::kBf16);
  EXPECT_EQ(dense.kv_cache_dtype, kernels::KvCacheDtype::kBf16);
  EXPECT_EQ(dense.seed, 1u);
  EXPECT_FALSE(dense.is_moe_layer(1));
}

TEST(SyntheticModelTest, ErrorsNameTheField) {
  auto error = [](std::string text, const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
    Result<SyntheticModelConfig> c = parse_synthetic_config(text);
    return c.ok() ? std::string("ok") : c.status().message();
  };
  EXPECT_EQ(error(kDenseJson, R"("hidden_size": 64,)", ""),
            "synthetic config: field \"hidden_size\": required field is missing");
  EXPECT_EQ(error(kDenseJson, R"("kv_lora_rank": 32)", R"("kv_lora_rank": "x")"),
            "synthetic config: field \"mla.kv_lora_rank\": expected a positive integer, found "
            "\"x\"");
  EXPECT_EQ(error(kDenseJson, R"(["mla"])", R"(["mla", "gqa"])"),
            "synthetic config: field \"mixer_pattern[1]\": expected \"mla\", \"mla_dsa\" or "
            "\"kda\", found \"gqa\"");
  EXPECT_EQ(error(kDenseJson, R"(["mla"])", R"(["kda"])"),
            "synthetic config: field \"kda\": required by mixer_pattern");
  EXPECT_EQ(error(kDenseJson, R"("v_head_dim": 16)", R"("v_head_dim": 16, "heads": 3)"),
            "synthetic config: field \"mla.heads\": unknown field");
  EXPECT_EQ(error(kDenseJson, R"("kind": "dense")", R"("kind": "sparse")"),
            "synthetic config: field \"ffn.kind\": expected \"dense\" or \"moe\", found "
            "\"sparse\"");
  EXPECT_EQ(error(kDenseJson, R"("intermediate_size": 128)",
                  R"("intermediate_size": 128, "num_experts": 4)"),
            "synthetic config: field \"ffn.num_experts\": only for \"kind\": \"moe\"");
  EXPECT_EQ(error(kDenseJson, R"("ffn")", R"("weight_format": "mxfp4", "ffn")"),
            "synthetic config: weight_format: \"mxfp4\" is for routed experts only "
            "(expert_format)");
  EXPECT_EQ(error(kHybridJson, R"("num_experts_per_tok": 2)", R"("num_experts_per_tok": 9)"),
            "synthetic config: ffn.num_experts_per_tok: more than num_experts");
  EXPECT_EQ(error(kHybridJson, R"("kv_lora_rank": 128)", R"("kv_lora_rank": 96)"),
            "synthetic config: mla.kv_lora_rank: a multiple of 128 with kv_cache_dtype \"fp8\"");
  EXPECT_EQ(error(kHybridJson, R"("q_lora_rank": 32)", R"("q_lora_rank": 0)"),
            "synthetic config: mla.q_lora_rank: mla_dsa layers need a q LoRA (the indexer reads "
            "it)");
  EXPECT_EQ(error(kHybridJson, R"("index_head_dim": 128)", R"("index_head_dim": 64)"),
            "synthetic config: dsa.index_head_dim: expected 128 (the indexer's FP8 key groups)");
  EXPECT_EQ(error(kHybridJson, R"("conv_width": 4)", R"("conv_width": 9)"),
            "synthetic config: kda.conv_width: expected 1 to 8");
  EXPECT_EQ(error(kHybridJson, R"("fp8", "seed")", R"("fp16", "seed")"),
            "synthetic config: field \"kv_cache_dtype\": expected \"bf16\" or \"fp8\", found "
            "\"fp16\"");
}

TEST(SyntheticModelTest, WeightBytesByHand) {
  const SyntheticModelConfig c = parse_ok(kDenseJson);
  const SyntheticWeightBytes b = synthetic_weight_bytes(c);
  // Per layer: norms 2·64 FP32; q_proj [2·24, 64], kv_a [40, 64], kv_a norm 32 FP32, W_UK/W_UV
  // 2·32·32 BF16, o_proj [64, 32]; MLP 3·128·64. lm_head [100, 64], final norm 64 FP32.
  const int64_t layer = 4 * 128 + 2 * 48 * 64 + 2 * 40 * 64 + 4 * 32 + 2 * 2 * 32 * 32 +
                        2 * 64 * 32 + 2 * 3 * 128 * 64;
  EXPECT_EQ(b.per_step_bytes, 2 * layer + 2 * 100 * 64 + 4 * 64);
  EXPECT_EQ(b.per_expert_bytes, 0);
  EXPECT_EQ(b.num_moe_layers, 0);
  const SyntheticWeightBytes h = synthetic_weight_bytes(parse_ok(kHybridJson));
  EXPECT_EQ(h.num_moe_layers, 5);
  EXPECT_EQ(h.per_expert_bytes, 3 * (32 * 64 / 2 + 32 * 64 / 32));  // MXFP4: 4.25 bits
}

TEST(SyntheticModelTest, HybridRunsAndIsDeterministic) {
  const SyntheticModelConfig c = parse_ok(kHybridJson);
  Result<std::unique_ptr<HybridModel>> a = build_synthetic_model(c);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_EQ((*a)->num_layers(), 6);
  EXPECT_EQ((*a)->layer(0).attention_kind(), AttentionKind::kKda);
  EXPECT_EQ((*a)->layer(0).ffn_kind(), FfnKind::kDenseMlp);
  EXPECT_EQ((*a)->layer(1).attention_kind(), AttentionKind::kMlaDsa);
  EXPECT_EQ((*a)->layer(2).attention_kind(), AttentionKind::kMla);
  EXPECT_EQ((*a)->layer(2).ffn_kind(), FfnKind::kMoe);
  EXPECT_EQ((*a)->kv_cache_dtype(), kernels::KvCacheDtype::kFp8);
  const std::vector<int32_t> tokens{3, 150, 7, 42, 199, 0, 88, 12, 64, 5};
  const std::vector<float> la = prefill_logits(**a, tokens);
  for (float x : la) ASSERT_TRUE(std::isfinite(x));
  const double r = rms(la);
  EXPECT_GT(r, 0.05);
  EXPECT_LT(r, 20.0);

  Result<std::unique_ptr<HybridModel>> again = build_synthetic_model(c);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(prefill_logits(**again, tokens), la);

  SyntheticModelConfig other = c;
  other.seed = 6;
  Result<std::unique_ptr<HybridModel>> b = build_synthetic_model(other);
  ASSERT_TRUE(b.ok());
  const std::vector<float> lb = prefill_logits(**b, tokens);
  double diff = 0;
  for (size_t i = 0; i < la.size(); ++i) diff += std::abs(la[i] - lb[i]);
  EXPECT_GT(diff / static_cast<double>(la.size()), 0.1 * r);
}

// 48 layers of BF16 MLA + MoE: the residual stream, and so the logits, stay O(1).
TEST(SyntheticModelTest, DeepStackStaysBounded) {
  SyntheticModelConfig c = parse_ok(kHybridJson);
  c.num_layers = 48;
  c.mixer_pattern = {SyntheticMixer::kMla, SyntheticMixer::kKda};
  c.weight_format = c.expert_format = SyntheticFormat::kBf16;
  Result<std::unique_ptr<HybridModel>> m = build_synthetic_model(c);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::vector<float> logits = prefill_logits(**m, {1, 2, 3, 4, 5, 6, 7, 8});
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  EXPECT_GT(rms(logits), 0.05);
  EXPECT_LT(rms(logits), 20.0);
}

TEST(SyntheticModelTest, BuildValidatesTheConfig) {
  SyntheticModelConfig c = parse_ok(kDenseJson);
  c.ffn.intermediate_size = 0;
  Result<std::unique_ptr<HybridModel>> m = build_synthetic_model(c);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "ffn.intermediate_size: expected a positive integer");
}

// The benchmark configs parse and stay within the sizes docs/performance.md asks for.
TEST(SyntheticModelTest, BenchConfigsParse) {
  const std::filesystem::path dir = std::filesystem::path(DZ_SOURCE_DIR) / "bench" / "configs";
  for (const char* name : {"dense_bw.json", "moe_bw.json"}) {
    Result<SyntheticModelConfig> c = load_synthetic_config((dir / name).string());
    ASSERT_TRUE(c.ok()) << c.status().message();
    const SyntheticWeightBytes b = synthetic_weight_bytes(*c);
    const int64_t active =
        b.per_step_bytes + c->ffn.num_experts_per_tok * b.num_moe_layers * b.per_expert_bytes;
    EXPECT_GT(active, int64_t{600} << 20) << name;  // well over the 260 MiB L3
    EXPECT_LT(b.total_bytes, int64_t{4} << 30) << name;
  }
}

}  // namespace synthetic_model_test
}  // namespace dz::model
