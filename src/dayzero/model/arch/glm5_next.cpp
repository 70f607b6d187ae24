#include "dayzero/model/arch/glm5_next.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "dayzero/model/arch/moe_config_checks.h"

namespace dz::model {
namespace {

#define READ(method, field, ...) \
  DZ_READ_CONFIG_FIELD(obj, c, method, field __VA_OPT__(, ) __VA_ARGS__)

// Field names as in text_config; linear_attn_config's layer lists are 0-based in this release
// (they hold 0 and 44 for 45 layers), unlike Kimi-Linear's.
struct Glm5NextConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_nextn_predict_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t index_kpool = 1;
  int64_t hc_mult = 1;
  int64_t kda_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t kda_conv_size = 0;
  std::vector<int64_t> kda_layers;
  formats::QuantizationConfig quantization_config;
};

Result<Glm5NextConfig> parse_config(const formats::ConfigObject& obj,
                                    const formats::ConfigObject& root) {
  Glm5NextConfig c;
  READ(required_positive_int, vocab_size);
  READ(required_positive_int, hidden_size);
  READ(required_positive_int, intermediate_size);
  READ(required_positive_int, num_hidden_layers);
  READ(optional_non_negative_int, num_nextn_predict_layers, 0);
  if (c.num_hidden_layers + c.num_nextn_predict_layers > kMaxLayers)
    return obj.field_error("num_hidden_layers",
                           fmt::format("{} exceeds the limit {}", c.num_hidden_layers, kMaxLayers));
  READ(required_positive_int, num_attention_heads);
  READ(required_positive_int, q_lora_rank);
  READ(required_positive_int, kv_lora_rank);
  READ(required_positive_int, qk_nope_head_dim);
  READ(required_non_negative_int, qk_rope_head_dim);
  READ(required_positive_int, v_head_dim);
  READ(required_positive_int, n_routed_experts);
  READ(optional_non_negative_int, n_shared_experts, 0);
  READ(required_positive_int, num_experts_per_tok);
  READ(required_positive_int, moe_intermediate_size);
  READ(required_positive_int, n_group);
  READ(required_positive_int, topk_group);
  READ(required_non_negative_int, first_k_dense_replace);
  READ(required_positive_int, index_n_heads);
  READ(required_positive_int, index_head_dim);
  READ(required_positive_int, index_topk);
  READ(required_positive_int, index_kpool);
  READ(required_positive_int, hc_mult);
  DZ_RETURN_IF_ERROR(check_moe_routing_fields(
      obj, {.num_experts = {"n_routed_experts", c.n_routed_experts},
            .experts_per_token = {"num_experts_per_tok", c.num_experts_per_tok},
            .num_groups = {"n_group", c.n_group},
            .topk_group = c.topk_group,
            .first_k_dense_replace = c.first_k_dense_replace,
            .num_hidden_layers = c.num_hidden_layers}));

  DZ_ASSIGN_OR_RETURN(formats::ConfigObject kda, obj.required_object("linear_attn_config"));
  DZ_ASSIGN_OR_RETURN(c.kda_heads, kda.required_positive_int("num_heads"));
  DZ_ASSIGN_OR_RETURN(c.kda_head_dim, kda.required_positive_int("head_dim"));
  DZ_ASSIGN_OR_RETURN(c.kda_conv_size, kda.required_positive_int("short_conv_kernel_size"));
  // kda_layers may hold 0, which required_positive_int_list refuses: read both lists as layer
  // ids through full_attn_layers' complement.
  DZ_ASSIGN_OR_RETURN(std::vector<int64_t> full,
                      kda.required_positive_int_list("full_attn_layers"));
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (std::find(full.begin(), full.end(), layer) == full.end()) c.kda_layers.push_back(layer);
  }
  for (int64_t layer : full) {
    if (layer >= c.num_hidden_layers)
      return kda.field_error("full_attn_layers",
                             fmt::format("layer {} is past num_hidden_layers {} (0-based)", layer,
                                         c.num_hidden_layers));
  }
  DZ_ASSIGN_OR_RETURN(auto quant, root.optional_object("quantization_config"));
  if (quant) {
    DZ_ASSIGN_OR_RETURN(c.quantization_config, formats::parse_quantization_config(*quant));
  }
  return c;
}

bool is_kda(const Glm5NextConfig& c, int64_t layer) {
  return std::find(c.kda_layers.begin(), c.kda_layers.end(), layer) != c.kda_layers.end();
}

class Glm5Next final : public Architecture {
 public:
  Glm5Next(Glm5NextConfig config, std::string model_type)
      : config_(std::move(config)), model_type_(std::move(model_type)) {}

  std::string_view recipe_name() const override { return "glm5_next (analysis only)"; }
  const std::string& model_type() const override { return model_type_; }
  const formats::QuantizationConfig& quantization() const override {
    return config_.quantization_config;
  }
  std::vector<std::pair<std::string, Component>> unchecked_prefixes() const override {
    return {{"model.visual.", Component::kVision}};
  }

  LayerSchedule schedule() const override {
    const Glm5NextConfig& c = config_;
    LayerSchedule schedule;
    for (int64_t i = 0; i < c.num_hidden_layers + c.num_nextn_predict_layers; ++i) {
      const bool mtp = i >= c.num_hidden_layers;
      schedule.layers.push_back(
          {.layer_id = static_cast<int>(i),
           .attention = !mtp && is_kda(c, i) ? AttentionKind::kKda : AttentionKind::kMlaDsa,
           .ffn = i < c.first_k_dense_replace ? FfnKind::kDenseMlp : FfnKind::kMoe,
           .is_mtp = mtp});
    }
    return schedule;
  }

  ModelDims dims() const override {
    const Glm5NextConfig& c = config_;
    return {.hidden_size = c.hidden_size,
            .vocab_size = c.vocab_size,
            .dense_intermediate_size = c.intermediate_size,
            .mla_heads = c.num_attention_heads,
            .kv_lora_rank = c.kv_lora_rank,
            .qk_rope_head_dim = c.qk_rope_head_dim,
            .mla_cache_fp8 = true,
            .mla_uses_rope = c.qk_rope_head_dim > 0,
            .index_n_heads = c.index_n_heads,
            .index_head_dim = c.index_head_dim,
            .index_topk = c.index_topk,
            .index_kpool = c.index_kpool,
            .kda_heads = c.kda_heads,
            .kda_head_dim = c.kda_head_dim,
            .kda_conv_size = c.kda_conv_size,
            .num_routed_experts = c.n_routed_experts,
            .num_experts_per_token = c.num_experts_per_tok,
            .num_shared_experts = c.n_shared_experts,
            .moe_intermediate_size = c.moe_intermediate_size,
            .routed_hidden_size = c.hidden_size,
            .num_expert_groups = c.n_group,
            .topk_groups = c.topk_group};
  }

  std::vector<std::pair<std::string, std::string>> missing() const override {
    return {{fmt::format("mHC hyper-connections ({} residual streams, Sinkhorn-mixed)",
                         config_.hc_mult),
             "hc_attn_* / hc_ffn_* on every main layer; not built"},
            {fmt::format("pooled-block DSA indexer (index_kpool {})", config_.index_kpool),
             "one key per pool of tokens, a softmax-gated compression; not built"},
            {"clamped SwiGLU (swiglu_limit)", "not built"}};
  }

  TensorTable tensor_table() const override;

 private:
  Glm5NextConfig config_;
  std::string model_type_;
};

// The published layout (docs/models.md §7.4): KDA, the indexer, kv_b_proj, routers, norms and the
// mHC mixers in BF16 (mHC base and scale F32); every other linear FP8 with 128x128 scales.
TensorTable Glm5Next::tensor_table() const {
  const Glm5NextConfig& c = config_;
  TensorTable table(128, 128, 32);
  const int64_t h = c.hidden_size;
  const WeightFormat fp8 = c.quantization_config.method == formats::QuantMethod::kFp8Block
                               ? WeightFormat::kFp8Block
                               : WeightFormat::kPlain;
  const WeightFormat bf16 = WeightFormat::kPlain;
  const std::string body = "model.language_model.";
  auto scope = [](Component component, int64_t layer, bool mtp) {
    return TensorTable::Scope{
        .component = component, .layer_id = static_cast<int>(layer), .is_mtp = mtp};
  };
  const TensorTable::Scope global{};
  table.add_float(body + "embed_tokens.weight", {c.vocab_size, h}, DType::kBF16, Split::kByVocab,
                  scope(Component::kEmbedding, -1, false));
  table.add_float(body + "norm.weight", {h}, DType::kBF16, Split::kReplicated, global);
  table.add_linear("lm_head", c.vocab_size, h, bf16, Split::kByVocab,
                   scope(Component::kLmHead, -1, false));

  const int64_t streams = c.hc_mult;
  for (int64_t i = 0; i < c.num_hidden_layers + c.num_nextn_predict_layers; ++i) {
    const bool mtp = i >= c.num_hidden_layers;
    const std::string p = fmt::format("{}layers.{}.", body, i);
    const auto norms = scope(Component::kNorms, i, mtp);
    table.add_float(p + "input_layernorm.weight", {h}, DType::kBF16, Split::kReplicated, norms);
    table.add_float(p + "post_attention_layernorm.weight", {h}, DType::kBF16, Split::kReplicated,
                    norms);
    if (mtp) {
      const auto s = scope(Component::kMtp, i, true);
      table.add_linear(p + "eh_proj", h, 2 * h, bf16, Split::kReplicated, s);
      for (const char* name : {"enorm.weight", "hnorm.weight", "shared_head.norm.weight"})
        table.add_float(p + name, {h}, DType::kBF16, Split::kReplicated, s);
    } else {
      // Per sublayer: pre (streams), post (streams) and comb (streams²) mixing weights.
      const auto s = scope(Component::kHyperConnections, i, false);
      const int64_t mixes = streams * (2 + streams);
      for (const char* site : {"attn", "ffn"}) {
        table.add_float(fmt::format("{}hc_{}_fn", p, site), {mixes, streams * h}, DType::kBF16,
                        Split::kReplicated, s);
        table.add_float(fmt::format("{}hc_{}_base", p, site), {mixes}, DType::kF32,
                        Split::kReplicated, s);
        table.add_float(fmt::format("{}hc_{}_scale", p, site), {3}, DType::kF32, Split::kReplicated,
                        s);
      }
    }
    const std::string a = p + "self_attn.";
    if (!mtp && is_kda(c, i)) {
      const auto s = scope(Component::kKda, i, false);
      const int64_t H = c.kda_heads, d = c.kda_head_dim, hd = H * d;
      for (const char* x : {"q", "k", "v"}) {
        table.add_linear(fmt::format("{}{}_proj", a, x), hd, h, bf16, Split::kColumn, s);
        table.add_float(fmt::format("{}{}_conv1d.weight", a, x), {hd, 1, c.kda_conv_size},
                        DType::kBF16, Split::kColumn, s);
      }
      table.add_linear(a + "f_a_proj", d, h, bf16, Split::kReplicated, s);
      table.add_linear(a + "f_b_proj", hd, d, bf16, Split::kColumn, s);
      table.add_linear(a + "g_a_proj", d, h, bf16, Split::kReplicated, s);
      table.add_linear(a + "g_b_proj", hd, d, bf16, Split::kColumn, s);
      table.add_linear(a + "b_proj", H, h, bf16, Split::kColumn, s);
      table.add_float(a + "A_log", {H}, DType::kF32, Split::kByHead, s);
      table.add_float(a + "dt_bias", {hd}, DType::kF32, Split::kColumn, s);
      table.add_float(a + "o_norm.weight", {d}, DType::kBF16, Split::kReplicated, s);
      table.add_linear(a + "o_proj", h, hd, bf16, Split::kRow, s);
    } else {
      const auto s = scope(Component::kAttention, i, mtp);
      const int64_t H = c.num_attention_heads;
      table.add_linear(a + "q_a_proj", c.q_lora_rank, h, fp8, Split::kReplicated, s);
      table.add_float(a + "q_a_layernorm.weight", {c.q_lora_rank}, DType::kBF16, Split::kReplicated,
                      s);
      table.add_linear(a + "q_b_proj", H * (c.qk_nope_head_dim + c.qk_rope_head_dim), c.q_lora_rank,
                       fp8, Split::kColumn, s);
      table.add_linear(a + "kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, h, fp8,
                       Split::kReplicated, s);
      table.add_float(a + "kv_a_layernorm.weight", {c.kv_lora_rank}, DType::kBF16,
                      Split::kReplicated, s);
      table.add_linear(a + "kv_b_proj", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank,
                       bf16, Split::kColumn, s);
      table.add_linear(a + "o_proj", h, H * c.v_head_dim, fp8, Split::kRow, s);
      const auto x = scope(Component::kIndexer, i, mtp);
      const std::string ix = a + "indexer.";
      const int64_t dI = c.index_head_dim;
      table.add_linear(ix + "wq_b", c.index_n_heads * dI, c.q_lora_rank, bf16, Split::kReplicated,
                       x);
      table.add_linear(ix + "wk", dI, h, bf16, Split::kReplicated, x);
      table.add_float(ix + "k_norm.weight", {dI}, DType::kBF16, Split::kReplicated, x);
      table.add_float(ix + "k_norm.bias", {dI}, DType::kBF16, Split::kReplicated, x);
      table.add_linear(ix + "weights_proj", c.index_n_heads, h, bf16, Split::kReplicated, x);
      table.add_float(ix + "index_kpool_compress_gate", {dI, h}, DType::kBF16, Split::kReplicated,
                      x);
      table.add_float(ix + "index_kpool_compress_ape", {c.index_kpool, dI}, DType::kBF16,
                      Split::kReplicated, x);
    }
    const std::string m = p + "mlp.";
    if (i < c.first_k_dense_replace) {
      const auto s = scope(Component::kDenseMlp, i, mtp);
      table.add_linear(m + "gate_proj", c.intermediate_size, h, fp8, Split::kColumn, s);
      table.add_linear(m + "up_proj", c.intermediate_size, h, fp8, Split::kColumn, s);
      table.add_linear(m + "down_proj", h, c.intermediate_size, fp8, Split::kRow, s);
      continue;
    }
    const auto router = scope(Component::kRouter, i, mtp);
    table.add_linear(m + "gate", c.n_routed_experts, h, bf16, Split::kReplicated, router);
    table.add_float(m + "gate.e_score_correction_bias", {c.n_routed_experts}, DType::kF32,
                    Split::kReplicated, router);
    const int64_t inter = c.moe_intermediate_size;
    const auto routed = scope(Component::kRoutedExperts, i, mtp);
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      const std::string x = fmt::format("{}experts.{}.", m, e);
      table.add_linear(x + "gate_proj", inter, h, fp8, Split::kByExpert, routed);
      table.add_linear(x + "up_proj", inter, h, fp8, Split::kByExpert, routed);
      table.add_linear(x + "down_proj", h, inter, fp8, Split::kByExpert, routed);
    }
    if (c.n_shared_experts > 0) {
      const auto shared = scope(Component::kSharedExperts, i, mtp);
      const int64_t shared_inter = inter * c.n_shared_experts;
      table.add_linear(m + "shared_experts.gate_proj", shared_inter, h, fp8, Split::kColumn,
                       shared);
      table.add_linear(m + "shared_experts.up_proj", shared_inter, h, fp8, Split::kColumn, shared);
      table.add_linear(m + "shared_experts.down_proj", h, shared_inter, fp8, Split::kRow, shared);
    }
  }
  return table;
}

}  // namespace

Result<std::unique_ptr<Architecture>> parse_glm5_next_for_analysis(const RecipeInput& input) {
  DZ_ASSIGN_OR_RETURN(Glm5NextConfig config, parse_config(input.text, input.root));
  return std::unique_ptr<Architecture>(new Glm5Next(std::move(config), input.model_type));
}

}  // namespace dz::model
