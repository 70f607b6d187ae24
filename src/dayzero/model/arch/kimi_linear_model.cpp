// Builds the runnable kimi_linear / kimi_k3 model (models.md §7.2–7.3) as a HybridModel: KDA and
// NoPE-MLA layers, SwiGLU or SiTU FFNs, MoE or latent MoE, and AttnRes when the config asks. For
// dayzero_hybrid the MLA layers rotate their rope part and carry the DSA indexer.

#include <cmath>

#include <fmt/format.h>

#include "dayzero/kernels/rope.h"
#include "dayzero/model/arch/kimi_linear.h"
#include "dayzero/model/blocks/attn_res.h"
#include "dayzero/model/hybrid_model.h"

namespace dz::model {
namespace {

MlpActivation activation(const KimiLinearConfig& c) {
  if (c.hidden_act != "situ") return MlpActivation{};
  return MlpActivation{.kind = MlpActivation::Kind::kSitu,
                       .situ_beta = static_cast<float>(c.activation_situ_beta),
                       .situ_linear_beta = static_cast<float>(c.activation_situ_linear_beta)};
}

class KimiLoader {
 public:
  KimiLoader(const KimiLinearConfig& config, const std::string& model_type,
             const std::string& prefix, const WeightLoader& loader)
      : c_(config), model_type_(model_type), prefix_(prefix), loader_(loader) {}

  Result<DecoderLayer> layer(const LayerSpec& spec) const {
    const int64_t d = c_.hidden_size;
    const std::string p = fmt::format("{}model.layers.{}.", prefix_, spec.layer_id);
    DecoderLayer layer;
    layer.layer_id = spec.layer_id;
    layer.hidden_size = d;
    layer.norm_eps = static_cast<float>(c_.rms_norm_eps);
    DZ_ASSIGN_OR_RETURN(layer.input_layernorm, loader_.floats(p + "input_layernorm.weight", d));
    DZ_ASSIGN_OR_RETURN(layer.post_attention_layernorm,
                        loader_.floats(p + "post_attention_layernorm.weight", d));
    if (spec.attn_res) {
      DZ_ASSIGN_OR_RETURN(layer.attn_res_query, folded_query(p + "self_attention_res_proj",
                                                             p + "self_attention_res_norm"));
      DZ_ASSIGN_OR_RETURN(layer.ffn_res_query,
                          folded_query(p + "mlp_res_proj", p + "mlp_res_norm"));
      layer.attn_res_write = spec.attn_res_write;
    }
    if (spec.attention == AttentionKind::kKda) {
      DZ_ASSIGN_OR_RETURN(KdaWeights kda, kda_weights(p + "self_attn."));
      layer.kda = std::make_unique<KdaBlock>(kda_config(), std::move(kda));
    } else {
      DZ_ASSIGN_OR_RETURN(MlaWeights mla, mla_weights(p + "self_attn."));
      layer.mla = std::make_unique<MlaBlock>(mla_config(), std::move(mla));
      if (c_.rope_dsa) {
        DZ_ASSIGN_OR_RETURN(DsaIndexerWeights index, indexer_weights(p + "self_attn.indexer."));
        layer.indexer = std::make_unique<DsaIndexer>(indexer_config(), std::move(index));
      }
    }
    if (spec.ffn == FfnKind::kDenseMlp) {
      DZ_ASSIGN_OR_RETURN(layer.dense_mlp, loader_.gated_mlp(p + "mlp."));
      layer.dense_activation = activation(c_);
    } else {
      DZ_ASSIGN_OR_RETURN(MoeWeights moe, moe_weights(p + "block_sparse_moe.", spec.ffn));
      layer.moe = std::make_unique<MoeBlock>(moe_config(), std::move(moe));
    }
    return layer;
  }

  // cw = norm.weight ⊙ proj.weight[0] (models.md §5).
  Result<std::vector<float>> folded_query(const std::string& proj, const std::string& norm) const {
    DZ_ASSIGN_OR_RETURN(std::vector<float> w, loader_.floats(proj + ".weight", c_.hidden_size));
    DZ_ASSIGN_OR_RETURN(std::vector<float> n, loader_.floats(norm + ".weight", c_.hidden_size));
    return attn_res_folded_query(w, n);
  }

 private:
  KdaConfig kda_config() const {
    const KimiLinearAttnConfig& la = c_.linear_attn_config;
    KdaConfig k;
    k.hidden_size = c_.hidden_size;
    k.num_heads = la.num_heads;
    k.head_dim = la.head_dim;
    k.conv_width = la.short_conv_kernel_size;
    k.o_norm_eps = static_cast<float>(c_.rms_norm_eps);
    if (la.gate_lower_bound) k.gate_lower_bound = static_cast<float>(*la.gate_lower_bound);
    return k;
  }

  Result<KdaWeights> kda_weights(const std::string& a) const {
    const KimiLinearAttnConfig& la = c_.linear_attn_config;
    const int64_t width = la.num_heads * la.head_dim;
    KdaWeights w;
    DZ_ASSIGN_OR_RETURN(w.q_proj, loader_.linear(a + "q_proj"));
    DZ_ASSIGN_OR_RETURN(w.k_proj, loader_.linear(a + "k_proj"));
    DZ_ASSIGN_OR_RETURN(w.v_proj, loader_.linear(a + "v_proj"));
    const int64_t conv = width * la.short_conv_kernel_size;  // [H·d, 1, W] read as [H·d, W]
    DZ_ASSIGN_OR_RETURN(w.q_conv, loader_.floats(a + "q_conv1d.weight", conv));
    DZ_ASSIGN_OR_RETURN(w.k_conv, loader_.floats(a + "k_conv1d.weight", conv));
    DZ_ASSIGN_OR_RETURN(w.v_conv, loader_.floats(a + "v_conv1d.weight", conv));
    DZ_ASSIGN_OR_RETURN(w.f_a_proj, loader_.linear(a + "f_a_proj"));
    DZ_ASSIGN_OR_RETURN(w.f_b_proj, loader_.linear(a + "f_b_proj"));
    DZ_ASSIGN_OR_RETURN(w.b_proj, loader_.linear(a + "b_proj"));
    // The bounded gate's A_log is padded to head_dim; only the first num_heads are used.
    DZ_ASSIGN_OR_RETURN(
        w.a_log, loader_.floats(a + "A_log", la.gate_lower_bound ? la.head_dim : la.num_heads));
    w.a_log.resize(static_cast<size_t>(la.num_heads));
    DZ_ASSIGN_OR_RETURN(w.dt_bias, loader_.floats(a + "dt_bias", width));
    if (la.use_full_rank_gate) {
      DZ_ASSIGN_OR_RETURN(w.g_proj, loader_.linear(a + "g_proj"));
    } else {
      DZ_ASSIGN_OR_RETURN(w.g_a_proj, loader_.linear(a + "g_a_proj"));
      DZ_ASSIGN_OR_RETURN(w.g_b_proj, loader_.linear(a + "g_b_proj"));
    }
    DZ_ASSIGN_OR_RETURN(w.o_norm, loader_.floats(a + "o_norm.weight", la.head_dim));
    DZ_ASSIGN_OR_RETURN(w.o_proj, loader_.linear(a + "o_proj"));
    return w;
  }

  // dayzero_hybrid: plain frequencies rope_theta^(−2i/d_r), no YaRN (refused by the parser).
  std::optional<kernels::RopeFrequencies> rope() const {
    if (!c_.rope_dsa) return std::nullopt;
    return kernels::plain_rope_frequencies(c_.qk_rope_head_dim, c_.rope_dsa->rope_theta);
  }

  DsaIndexerConfig indexer_config() const {
    const RopeDsaConfig& r = *c_.rope_dsa;
    return DsaIndexerConfig{
        .hidden_size = c_.hidden_size,
        .q_lora_rank = *c_.q_lora_rank,
        .index_n_heads = r.index_n_heads,
        .index_head_dim = r.index_head_dim,
        .index_topk = r.index_topk,
        .rope = *rope(),
        .rope_layout = r.indexer_rope_interleave ? kernels::RopeLayout::kInterleaved
                                                 : kernels::RopeLayout::kRotateHalf,
        .k_norm_eps = 1e-6f,  // DeepSeek's LayerNorm default, as deepseek_v32
    };
  }

  Result<DsaIndexerWeights> indexer_weights(const std::string& a) const {
    const int64_t d_i = c_.rope_dsa->index_head_dim;
    DsaIndexerWeights w;
    DZ_ASSIGN_OR_RETURN(w.wq_b, loader_.linear(a + "wq_b"));
    DZ_ASSIGN_OR_RETURN(w.wk, loader_.linear(a + "wk"));
    DZ_ASSIGN_OR_RETURN(w.k_norm_weight, loader_.floats(a + "k_norm.weight", d_i));
    DZ_ASSIGN_OR_RETURN(w.k_norm_bias, loader_.floats(a + "k_norm.bias", d_i));
    DZ_ASSIGN_OR_RETURN(w.weights_proj, loader_.linear(a + "weights_proj"));
    return w;
  }

  MlaConfig mla_config() const {
    const auto eps = static_cast<float>(c_.rms_norm_eps);
    return MlaConfig{
        .hidden_size = c_.hidden_size,
        .num_heads = c_.num_attention_heads,
        .q_lora_rank = c_.q_lora_rank.value_or(0),
        .kv_lora_rank = c_.kv_lora_rank,
        .qk_nope_head_dim = c_.qk_nope_head_dim,
        .qk_rope_head_dim = c_.qk_rope_head_dim,
        .v_head_dim = c_.v_head_dim,
        // No YaRN factor (NoPE, or dayzero_hybrid's plain RoPE): (d_n + d_r)^(−1/2) (§2.5).
        .softmax_scale = static_cast<float>(
            std::pow(static_cast<double>(c_.qk_nope_head_dim + c_.qk_rope_head_dim), -0.5)),
        .q_norm_eps = eps,
        // Kimi-Linear's modeling file builds kv_a_layernorm with its default 1e-6; K3's and
        // dayzero_hybrid's use rms_norm_eps (models.md §2.5).
        .kv_norm_eps = model_type_ == "kimi_linear" ? 1e-6f : eps,
        .rope = rope(),
        .output_gate = c_.mla_use_output_gate,
    };
  }

  Result<MlaWeights> mla_weights(const std::string& a) const {
    MlaWeights w;
    if (c_.q_lora_rank) {
      DZ_ASSIGN_OR_RETURN(w.q_a_proj, loader_.linear(a + "q_a_proj"));
      DZ_ASSIGN_OR_RETURN(w.q_a_layernorm,
                          loader_.floats(a + "q_a_layernorm.weight", *c_.q_lora_rank));
      DZ_ASSIGN_OR_RETURN(w.q_b_proj, loader_.linear(a + "q_b_proj"));
    } else {
      DZ_ASSIGN_OR_RETURN(w.q_b_proj, loader_.linear(a + "q_proj"));
    }
    DZ_ASSIGN_OR_RETURN(w.kv_a_proj_with_mqa, loader_.linear(a + "kv_a_proj_with_mqa"));
    DZ_ASSIGN_OR_RETURN(w.kv_a_layernorm,
                        loader_.floats(a + "kv_a_layernorm.weight", c_.kv_lora_rank));
    DZ_ASSIGN_OR_RETURN(w.kv_b_proj, loader_.linear(a + "kv_b_proj"));
    if (c_.mla_use_output_gate) {
      DZ_ASSIGN_OR_RETURN(w.g_proj, loader_.linear(a + "g_proj"));
    }
    DZ_ASSIGN_OR_RETURN(w.o_proj, loader_.linear(a + "o_proj"));
    return w;
  }

  MoeConfig moe_config() const {
    return MoeConfig{
        .num_experts = c_.num_experts,
        .num_experts_per_tok = c_.num_experts_per_token,
        .n_group = c_.num_expert_group,
        .topk_group = c_.topk_group,
        .norm_topk_prob = c_.moe_renormalize,
        .routed_scaling_factor = static_cast<float>(c_.routed_scaling_factor),
        .renorm_epsilon = 1e-20f,  // Kimi adds it to the denominator (models.md §6.2)
        .activation = activation(c_),
        .latent_norm_eps = static_cast<float>(c_.rms_norm_eps),
    };
  }

  Result<MoeWeights> moe_weights(const std::string& m, FfnKind kind) const {
    const int64_t d = c_.hidden_size;
    MoeWeights w;
    DZ_ASSIGN_OR_RETURN(w.gate_weight, loader_.floats(m + "gate.weight", c_.num_experts * d));
    DZ_ASSIGN_OR_RETURN(w.e_score_correction_bias,
                        loader_.floats(m + "gate.e_score_correction_bias", c_.num_experts));
    if (kind == FfnKind::kLatentMoe) {
      DZ_ASSIGN_OR_RETURN(w.latent_down_proj, loader_.linear(m + "routed_expert_down_proj"));
      DZ_ASSIGN_OR_RETURN(w.latent_up_proj, loader_.linear(m + "routed_expert_up_proj"));
      if (c_.latent_moe_use_norm) {
        DZ_ASSIGN_OR_RETURN(w.latent_norm, loader_.floats(m + "routed_expert_norm.weight",
                                                          *c_.routed_expert_hidden_size));
      }
    }
    for (int64_t e = 0; e < c_.num_experts; ++e) {
      DZ_ASSIGN_OR_RETURN(MlpWeights expert, loader_.gated_mlp(fmt::format("{}experts.{}.", m, e),
                                                               WeightLoader::kW1W3W2Names));
      w.experts.push_back(std::move(expert));
    }
    if (c_.num_shared_experts > 0) {  // stored fused along the intermediate axis (§6.3)
      DZ_ASSIGN_OR_RETURN(MlpWeights shared, loader_.gated_mlp(m + "shared_experts."));
      w.shared_experts.push_back(std::move(shared));
    }
    return w;
  }

  const KimiLinearConfig& c_;
  const std::string& model_type_;
  const std::string& prefix_;
  const WeightLoader& loader_;
};

}  // namespace

Result<std::unique_ptr<CausalLm>> load_kimi_linear_model(
    const KimiLinearConfig& config, const std::string& model_type, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options) {
  const kernels::KvCacheDtype kv_dtype =
      options.kv_cache_dtype.value_or(kernels::KvCacheDtype::kBf16);
  if (kv_dtype == kernels::KvCacheDtype::kFp8 && config.kv_lora_rank % 128 != 0)
    return make_error(StatusCode::kInvalidArgument,
                      "--kv-cache-dtype fp8 quantizes the MLA latent in tiles of 128, but "
                      "kv_lora_rank is {}; use bf16",
                      config.kv_lora_rank);
  HybridModelParts parts;
  parts.vocab_size = config.vocab_size;
  parts.hidden_size = config.hidden_size;
  parts.final_norm_eps = static_cast<float>(config.rms_norm_eps);
  parts.attn_res_eps = static_cast<float>(config.rms_norm_eps);
  parts.kv_cache_dtype = kv_dtype;
  WeightLoader loader(*checkpoint, config.quantization_config);
  KimiLoader kimi(config, model_type, prefix, loader);
  DZ_ASSIGN_OR_RETURN(parts.embed_tokens, loader.embedding(prefix + "model.embed_tokens.weight"));
  DZ_ASSIGN_OR_RETURN(parts.final_norm,
                      loader.floats(prefix + "model.norm.weight", config.hidden_size));
  DZ_ASSIGN_OR_RETURN(
      parts.lm_head,
      loader.linear(prefix + (config.tie_word_embeddings ? "model.embed_tokens" : "lm_head")));
  if (config.attn_res_block_size) {
    // The final mix's prefix is (unverified) (models.md §7.3.3).
    DZ_ASSIGN_OR_RETURN(parts.final_attn_res_query,
                        kimi.folded_query(prefix + "model.output_attn_res_proj",
                                          prefix + "model.output_attn_res_norm"));
  }
  for (const LayerSpec& spec : kimi_linear_schedule(config).layers) {
    DZ_ASSIGN_OR_RETURN(DecoderLayer layer, kimi.layer(spec));
    parts.layers.push_back(std::move(layer));
  }
  parts.checkpoint = std::move(checkpoint);
  return std::unique_ptr<CausalLm>(std::make_unique<HybridModel>(std::move(parts)));
}

}  // namespace dz::model
