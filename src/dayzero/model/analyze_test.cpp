// `dayzero analyze` on the released configs (tests/data/configs/), against numbers worked out by
// hand from the config fields (each derivation is written next to its number).

#include "dayzero/model/analyze.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "dayzero/model/arch/config_test_util.h"

namespace dz::model {
namespace analyze_test {

Analysis analyze(const std::string& name, const AnalyzeOptions& options) {
  Result<formats::ConfigObject> root =
      formats::ConfigObject::parse(testing::real_config(name).dump(), "config.json");
  EXPECT_TRUE(root.ok()) << root.status().to_string();
  Result<Analysis> analysis = analyze_config(*root, options);
  EXPECT_TRUE(analysis.ok()) << analysis.status().to_string();
  return analysis.ok() ? std::move(analysis).value() : Analysis{};
}

const CommLine* find_line(const std::vector<CommLine>& lines, const std::string& prefix) {
  for (const CommLine& line : lines) {
    if (line.what.rfind(prefix, 0) == 0) return &line;
  }
  ADD_FAILURE() << "no line starting with \"" << prefix << "\"";
  return nullptr;
}

bool has_requirement(const Analysis& a, const std::string& item, bool supported) {
  for (const Requirement& r : a.requirements) {
    if (r.item.find(item) != std::string::npos) return r.supported == supported;
  }
  return false;
}

TEST(Analyze, DeepseekV32UnderTp4Ep2) {
  const Analysis a =
      analyze("deepseek_v32",
              {.plan = {.tp = 4, .ep = 2}, .context = 32768, .batch = 16, .prefill_tokens = 2048});
  ASSERT_TRUE(a.plan_status.ok()) << a.plan_status.to_string();
  EXPECT_TRUE(a.runnable);
  // 61 layers, first_k_dense_replace 3, one MTP layer, the indexer on every layer.
  EXPECT_EQ(a.num_main_layers, 61);
  EXPECT_EQ(a.num_mtp_layers, 1);
  EXPECT_EQ(a.mla_dsa_layers, 61);
  EXPECT_EQ(a.dense_mlp_layers, 3);
  EXPECT_EQ(a.moe_layers, 58);
  EXPECT_EQ(a.mixer_period, "[MLA+DSA] x 61");
  EXPECT_EQ(a.dims.index_topk, 2048);
  EXPECT_EQ(a.dims.index_n_heads, 64);
  // Latent record: FP8 512 codes + 4 scales x 4 B + 64 rope x 2 B = 656; BF16 576 x 2 = 1152;
  // index key 128 + 4 = 132; times 61 layers.
  EXPECT_EQ(a.mla_bytes_per_token_fp8, 61 * 656);
  EXPECT_EQ(a.mla_bytes_per_token_bf16, 61 * 1152);
  EXPECT_EQ(a.index_bytes_per_token, 61 * 132);
  EXPECT_EQ(a.state_bytes_per_sequence, 0);
  // 16 sequences over ep = 2 TP groups: 8 per group. 32768 tokens x 8 sequences x
  // (40016 + 8052) B on every rank of a group (the latent is replicated over TP).
  EXPECT_EQ(a.cache_bytes_per_rank, int64_t{32768} * 8 * 48068);
  // Decode, T = 8 per group: all-reduce 2 (4-1)/4 x 8 x 7168 x 4 B = 344064 B, after o_proj and
  // after the FFN on each of the 61 layers.
  const CommLine* o_proj = find_line(a.decode_comm, "all-reduce after o_proj");
  ASSERT_NE(o_proj, nullptr);
  EXPECT_EQ(o_proj->bytes_per_layer, 344064);
  EXPECT_EQ(o_proj->layers, 61);
  EXPECT_EQ(find_line(a.decode_comm, "all-reduce after the FFN")->bytes_per_step, 61 * 344064);
  // Logits: rank 0 receives 3 ranks' 8 x 129280/4 FP32 rows.
  EXPECT_EQ(find_line(a.decode_comm, "logit columns")->bytes_per_layer, 3 * 8 * 32320 * 4);
  // Prefill, T = 2048: 2 x 3/4 x 2048 x 7168 x 4 = 88080384 B per layer; one logits row.
  EXPECT_EQ(find_line(a.prefill_comm, "all-reduce after o_proj")->bytes_per_layer, 88080384);
  EXPECT_EQ(find_line(a.prefill_comm, "logit columns")->bytes_per_layer, 3 * 32320 * 4);
  // EP: 256 experts over 8 ranks; each rank sends its 8/4 = 2 tokens to r other ranks and gets
  // r x 7168 FP32 values back per token, on the 58 MoE layers.
  const double r = expected_remote_ranks(256, 8, 8);
  const CommLine* combine = find_line(a.decode_comm, "combine");
  EXPECT_EQ(combine->bytes_per_layer, std::llround(2 * r * 7168 * 4));
  EXPECT_EQ(combine->layers, 58);
  // Dispatch: 7 other ranks' counts (8 B each); per token r records of 7168 BF16 values and a
  // 4-byte count, and its 8 x 7/8 remote choices of 8 B.
  const CommLine* dispatch = find_line(a.decode_comm, "dispatch");
  EXPECT_EQ(dispatch->bytes_per_layer,
            7 * 8 + std::llround(2 * (r * (7168 * 2 + 4) + 8 * 8 * 7.0 / 8)));
  EXPECT_TRUE(has_requirement(a, "DSA lightning indexer", true));
  EXPECT_TRUE(has_requirement(a, "tensor parallelism", true));
  EXPECT_TRUE(has_requirement(a, "expert parallelism", true));
  EXPECT_TRUE(o_proj->implemented);
  EXPECT_TRUE(combine->implemented);
}

TEST(Analyze, WeightsPerRankDivideBySplit) {
  const Analysis one = analyze("deepseek_v32", {});
  ASSERT_TRUE(one.plan_status.ok());
  EXPECT_EQ(one.weight_bytes_per_rank, one.summary.total_bytes);
  EXPECT_TRUE(one.decode_comm.empty());
  // Every split tensor of DeepSeek-V3.2 divides by 2: per rank, the replicated bytes whole and
  // the rest halved.
  const Analysis two = analyze("deepseek_v32", {.plan = {.tp = 2}});
  ASSERT_TRUE(two.plan_status.ok());
  EXPECT_EQ(two.replicated_weight_bytes, one.replicated_weight_bytes);
  EXPECT_EQ(
      two.weight_bytes_per_rank,
      one.replicated_weight_bytes + (one.summary.total_bytes - one.replicated_weight_bytes) / 2);
  // Routed experts split 8 ways at tp 4 x ep 2, the rest 4 ways: fewer bytes than tp 4 alone.
  const Analysis tp4 = analyze("deepseek_v32", {.plan = {.tp = 4}});
  const Analysis tp4ep2 = analyze("deepseek_v32", {.plan = {.tp = 4, .ep = 2}});
  // Routed experts, with their scales and the MTP layer's: a quarter per rank, then an eighth.
  int64_t routed = 0;
  const TensorTable table = testing::parse_ok(testing::real_config("deepseek_v32"))->tensor_table();
  for (const TensorSpec& spec : table.specs()) {
    if (spec.is_routed_expert) routed += spec.shape.num_elems() * dtype_bits(spec.dtypes[0]) / 8;
  }
  EXPECT_EQ(tp4.weight_bytes_per_rank - tp4ep2.weight_bytes_per_rank, routed / 4 - routed / 8);
}

TEST(Analyze, KimiLinearStateSplitsByHead) {
  const Analysis a = analyze("kimi_linear", {.plan = {.tp = 4}, .batch = 2});
  ASSERT_TRUE(a.plan_status.ok()) << a.plan_status.to_string();
  EXPECT_EQ(a.kda_layers, 20);
  EXPECT_EQ(a.mla_layers, 7);
  EXPECT_EQ(a.mixer_period, "[KDA KDA KDA MLA] x 6, then KDA KDA MLA");
  // Per KDA layer and rank, 32/4 = 8 heads: state 8 x 128 x 128 x 4 = 524288 B, conv rows
  // 3 x (4-1) x 8 x 128 x 2 = 18432 B; 20 layers.
  EXPECT_EQ(a.state_bytes_per_sequence, 20 * (524288 + 18432));
  // 7 NoPE MLA layers still cache 512 + 64 values per token: 7 x 1152 B in BF16, 7 x 656 in FP8.
  EXPECT_EQ(a.mla_bytes_per_token_bf16, 7 * 1152);
  EXPECT_EQ(a.cache_bytes_per_rank, 4096 * 2 * 7 * 656 + 2 * 20 * (524288 + 18432));
  EXPECT_TRUE(has_requirement(a, "Kimi Delta Attention", true));
  EXPECT_TRUE(has_requirement(a, "MLA without RoPE", true));
  EXPECT_TRUE(has_requirement(a, "tensor parallelism", true));
  EXPECT_TRUE(find_line(a.decode_comm, "all-reduce after o_proj")->implemented);
}

// Context parallelism, worked by hand (docs/parallel.md §9.5): Kimi-Linear (hidden 2304, 32 KDA
// heads of 128, conv 4; 7 MLA layers, r_kv 512) at tp 2 x cp 2, a 4096-token prefill cut into 4
// pieces of 1024: rank 0 runs pieces 0 and 3 and gathers the other 2048 tokens' rows.
TEST(Analyze, KimiLinearUnderTp2Cp2) {
  const Analysis a =
      analyze("kimi_linear", {.plan = {.tp = 2, .cp = 2}, .batch = 4, .prefill_tokens = 4096});
  ASSERT_TRUE(a.plan_status.ok()) << a.plan_status.to_string();
  const CommLine* records = find_line(a.prefill_comm, "all-gather of the other pieces' latent");
  ASSERT_NE(records, nullptr);
  EXPECT_EQ(records->bytes_per_layer, 2048 * 1152);  // Kimi's default cache: BF16 records
  EXPECT_EQ(records->layers, 7);
  // Tails: 2 pieces x 1 other rank x 3 (q, k, v) x 3 rows x 16 heads x 128 x 4 B.
  EXPECT_EQ(find_line(a.prefill_comm, "all-gather of the KDA pieces' last")->bytes_per_layer,
            2 * 3 * 3 * 16 * 128 * 4);
  // Summaries [P | dX]: 2 pieces x 16 heads x 2 x 128 x 128 x 4 B, whatever T.
  EXPECT_EQ(find_line(a.prefill_comm, "all-gather of the KDA pieces' summaries")->bytes_per_layer,
            2 * 16 * 2 * 128 * 128 * 4);
  EXPECT_EQ(find_line(a.prefill_comm, "all-gather of the KDA pieces' summaries")->layers, 20);
  // The TP all-reduces carry rank 0's 2048 tokens: 2 (2-1)/2 x 2048 x 2304 x 4.
  EXPECT_EQ(find_line(a.prefill_comm, "all-reduce after o_proj")->bytes_per_layer, 2048 * 2304 * 4);
  // Decode, 4 rows: every rank's partial [4, 16 heads, 512 + 1] per MLA layer; no indexer.
  EXPECT_EQ(find_line(a.decode_comm, "all-gather of the partial outputs")->bytes_per_layer,
            4 * 16 * 513 * 4);
  for (const CommLine& line : a.decode_comm)
    EXPECT_EQ(line.what.find("candidates"), std::string::npos);
  EXPECT_TRUE(has_requirement(a, "context parallelism", true));
  // Each CP rank stores half of the blocks; both keep every sequence's KDA state.
  const Analysis tp_only =
      analyze("kimi_linear", {.plan = {.tp = 2}, .batch = 4, .prefill_tokens = 4096});
  const int64_t states = 4 * tp_only.state_bytes_per_sequence;
  EXPECT_EQ(a.cache_bytes_per_rank - states, (tp_only.cache_bytes_per_rank - states) / 2);
  EXPECT_TRUE(has_requirement(analyze("deepseek_v32", {.plan = {.ep = 2, .cp = 2}}),
                              "context parallelism", false));
}

TEST(Analyze, KimiK3AtTp8MatchesTheDesignFigure) {
  const Analysis a = analyze("kimi_k3", {.plan = {.tp = 8}});
  ASSERT_TRUE(a.plan_status.ok()) << a.plan_status.to_string();
  EXPECT_EQ(a.num_main_layers, 93);
  EXPECT_EQ(a.latent_moe_layers, 92);
  EXPECT_EQ(a.attn_res_layers, 93);
  EXPECT_EQ(a.mixer_period, "[KDA KDA KDA MLA] x 23, then MLA");
  // 96 heads / 8 = 12 per rank: 69 x 12 x 128 x 128 x 4 B = 51.75 MiB of state, plus
  // 69 x 3 x 3 x 12 x 128 x 2 B of conv rows.
  EXPECT_EQ(a.state_bytes_per_sequence, 69 * (12 * 128 * 128 * 4 + 3 * 3 * 12 * 128 * 2));
  EXPECT_EQ(a.dims.routed_hidden_size, 3584);
  // Decode, T = 1: the latent routed sum, 2 x 7/8 x 3584 x 4 B = 25088 B, on the 92 MoE layers.
  const CommLine* latent = find_line(a.decode_comm, "all-reduce of the latent routed sum");
  EXPECT_EQ(latent->bytes_per_layer, 25088);
  EXPECT_EQ(latent->layers, 92);
  EXPECT_TRUE(has_requirement(a, "latent MoE", true));
  EXPECT_TRUE(has_requirement(a, "vision tower", true));
}

TEST(Analyze, Glm53FlashIsReadButNotRunnable) {
  const Analysis a = analyze("glm5_next", {.plan = {.tp = 4}});
  ASSERT_TRUE(a.plan_status.ok()) << a.plan_status.to_string();
  EXPECT_FALSE(a.runnable);
  // 45 layers, MLA on every fourth (3, 7, ..., 43), three dense, one MTP layer.
  EXPECT_EQ(a.num_main_layers, 45);
  EXPECT_EQ(a.num_mtp_layers, 1);
  EXPECT_EQ(a.mla_dsa_layers, 11);
  EXPECT_EQ(a.kda_layers, 34);
  EXPECT_EQ(a.dense_mlp_layers, 3);
  EXPECT_EQ(a.moe_layers, 42);
  EXPECT_EQ(a.mixer_period, "[KDA KDA KDA MLA+DSA] x 11, then KDA");
  // NoPE latent of 512: BF16 1024 B, FP8 512 + 4 scales x 4 B = 528 B, on 11 layers; one
  // 132-byte indexer key per pool of 4 tokens: 33 B per token and layer.
  EXPECT_EQ(a.mla_bytes_per_token_bf16, 11 * 1024);
  EXPECT_EQ(a.mla_bytes_per_token_fp8, 11 * 528);
  EXPECT_EQ(a.index_bytes_per_token, 11 * 33);
  // 64 KDA heads / 4 = 16 per rank: 16 x 128 x 128 x 4 B of state, 3 x 3 x 16 x 128 x 2 B of
  // conv rows, on 34 layers.
  EXPECT_EQ(a.state_bytes_per_sequence, 34 * (16 * 128 * 128 * 4 + 3 * 3 * 16 * 128 * 2));
  // mHC per main layer and sublayer: fn [4 x (2 + 4), 4 x 4096], base [24], scale [3].
  EXPECT_EQ(a.summary.by_component.at("hyper_connections").num_params,
            45 * 2 * (24 * 16384 + 24 + 3));
  EXPECT_TRUE(has_requirement(a, "model_type \"glm5_next\"", false));
  EXPECT_TRUE(has_requirement(a, "mHC hyper-connections", false));
  EXPECT_TRUE(has_requirement(a, "pooled-block DSA indexer", false));
  EXPECT_TRUE(has_requirement(a, "Kimi Delta Attention", true));
  EXPECT_TRUE(has_requirement(a, "vision tower", false));
}

TEST(Analyze, NamesWhatAPlanDoesNotDivide) {
  const Analysis a = analyze("kimi_linear", {.plan = {.tp = 5}});
  EXPECT_FALSE(a.plan_status.ok());
  EXPECT_NE(
      a.plan_status.message().find("num_attention_heads (MLA heads) 32 is not divisible by --tp 5"),
      std::string::npos)
      << a.plan_status.message();
  const Analysis experts = analyze("deepseek_v32", {.plan = {.ep = 3}});
  EXPECT_NE(experts.plan_status.message().find(
                "the 256 routed experts do not divide over tp x ep = 3 ranks"),
            std::string::npos)
      << experts.plan_status.message();
}

TEST(Analyze, ExpectedRemoteRanks) {
  // Two ranks of 2 experts each, one choice: the other rank holds it half the time.
  EXPECT_DOUBLE_EQ(expected_remote_ranks(4, 1, 2), 0.5);
  // All choices on one rank is impossible with k > E/ep: every other rank is hit.
  EXPECT_DOUBLE_EQ(expected_remote_ranks(4, 3, 2), 1.0);
  // E = 8, ep = 4, k = 2: P(a rank holds neither) = C(6,2)/C(8,2) = 15/28; 3 x 13/28.
  EXPECT_NEAR(expected_remote_ranks(8, 2, 4), 3.0 * 13.0 / 28.0, 1e-12);
  EXPECT_EQ(expected_remote_ranks(8, 2, 1), 0.0);
}

}  // namespace analyze_test
}  // namespace dz::model
