// The kimi_linear / kimi_k3 composition (docs/models.md §7.2–7.3) as a HybridModel: KDA and
// NoPE-MLA layers, SwiGLU or SiTU FFNs, MoE or latent MoE, and AttnRes when the config asks. For
// dayzero_hybrid the MLA layers rotate their rope part and carry the DSA indexer. One walk over
// the blocks gives both the tensor table and the loaded model.

#include <cmath>

#include "dayzero/kernels/rope.h"
#include "dayzero/model/arch/kimi_linear.h"
#include "dayzero/model/blocks/attn_res.h"
#include "dayzero/model/hybrid_model.h"
#include "dayzero/model/tensor_table_builder.h"
#include "dayzero/model/vision/image_input.h"

namespace dz::model {
namespace {

MlpActivation activation(const KimiLinearConfig& c) {
  if (c.hidden_act != "situ") return MlpActivation{};
  return MlpActivation{.kind = MlpActivation::Kind::kSitu,
                       .situ_beta = static_cast<float>(c.activation_situ_beta),
                       .situ_linear_beta = static_cast<float>(c.activation_situ_linear_beta)};
}

KdaConfig kda_config(const KimiLinearConfig& c) {
  const KimiLinearAttnConfig& la = c.linear_attn_config;
  KdaConfig k;
  k.hidden_size = c.hidden_size;
  k.num_heads = la.num_heads;
  k.head_dim = la.head_dim;
  k.conv_width = la.short_conv_kernel_size;
  k.o_norm_eps = static_cast<float>(c.rms_norm_eps);
  if (la.gate_lower_bound) k.gate_lower_bound = static_cast<float>(*la.gate_lower_bound);
  k.full_rank_gate = la.use_full_rank_gate;
  return k;
}

// dayzero_hybrid: plain frequencies rope_theta^(−2i/d_r), no YaRN (refused by the parser).
std::optional<kernels::RopeFrequencies> rope(const KimiLinearConfig& c) {
  if (!c.rope_dsa) return std::nullopt;
  return kernels::plain_rope_frequencies(c.qk_rope_head_dim, c.rope_dsa->rope_theta);
}

DsaIndexerConfig indexer_config(const KimiLinearConfig& c) {
  const RopeDsaConfig& r = *c.rope_dsa;
  return DsaIndexerConfig{
      .hidden_size = c.hidden_size,
      .q_lora_rank = *c.q_lora_rank,
      .index_n_heads = r.index_n_heads,
      .index_head_dim = r.index_head_dim,
      .index_topk = r.index_topk,
      .rope = *rope(c),
      .rope_layout = r.indexer_rope_interleave ? kernels::RopeLayout::kInterleaved
                                               : kernels::RopeLayout::kRotateHalf,
      .k_norm_eps = 1e-6f,  // DeepSeek's LayerNorm default, as deepseek_v32
  };
}

MlaConfig mla_config(const KimiLinearConfig& c) {
  const auto eps = static_cast<float>(c.rms_norm_eps);
  return MlaConfig{
      .hidden_size = c.hidden_size,
      .num_heads = c.num_attention_heads,
      .q_lora_rank = c.q_lora_rank.value_or(0),
      .kv_lora_rank = c.kv_lora_rank,
      .qk_nope_head_dim = c.qk_nope_head_dim,
      .qk_rope_head_dim = c.qk_rope_head_dim,
      .v_head_dim = c.v_head_dim,
      // No YaRN factor (NoPE, or dayzero_hybrid's plain RoPE): (d_n + d_r)^(−1/2) (§2.5).
      .softmax_scale = static_cast<float>(
          std::pow(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim), -0.5)),
      .q_norm_eps = eps,
      .kv_norm_eps = static_cast<float>(c.kv_a_layernorm_eps.value_or(c.rms_norm_eps)),
      .rope = rope(c),
      .output_gate = c.mla_use_output_gate,
  };
}

MoeConfig moe_config(const KimiLinearConfig& c, FfnKind kind) {
  const bool latent = kind == FfnKind::kLatentMoe;
  return MoeConfig{
      .num_experts = c.num_experts,
      .num_experts_per_tok = c.num_experts_per_token,
      .n_group = c.num_expert_group,
      .topk_group = c.topk_group,
      .norm_topk_prob = c.moe_renormalize,
      .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor),
      .renorm_epsilon = 1e-20f,  // Kimi adds it to the denominator (docs/models.md §6.2)
      .activation = activation(c),
      .latent_norm_eps = static_cast<float>(c.rms_norm_eps),
      .hidden_size = c.hidden_size,
      .intermediate_size = c.moe_intermediate_size,
      .num_shared_experts = c.num_shared_experts,  // fused along the intermediate axis (§6.3)
      .latent_size = latent ? *c.routed_expert_hidden_size : 0,
      .latent_norm = latent && c.latent_moe_use_norm,
      .expert_names = kW1W3W2Names,
  };
}

DecoderLayerConfig layer_config(const KimiLinearConfig& c, const LayerSpec& spec) {
  DecoderLayerConfig layer{.spec = spec,
                           .hidden_size = c.hidden_size,
                           .norm_eps = static_cast<float>(c.rms_norm_eps),
                           .dense_intermediate_size = c.intermediate_size,
                           .dense_activation = activation(c),
                           .moe_prefix = "block_sparse_moe."};
  if (spec.attention == AttentionKind::kKda) {
    layer.kda = kda_config(c);
  } else {
    layer.mla = mla_config(c);
    if (spec.attention == AttentionKind::kMlaDsa) layer.indexer = indexer_config(c);
  }
  if (spec.ffn != FfnKind::kDenseMlp) layer.moe = moe_config(c, spec.ffn);
  return layer;
}

struct KimiWeights {
  HybridModelParts parts;                   // the globals
  AttnResQueryWeights final_res;            // AttnRes' final mix
  std::vector<DecoderLayerWeights> layers;  // in schedule order (main layers, then MTP)
  std::vector<MtpLayer> mtp;                // the MTP layer's own tensors (dayzero_hybrid)
  MoonVitWeights vision;                    // K3's tower and projector, when it has them
};

void visit_kimi_linear(TensorVisitor& v, const KimiLinearConfig& c, const std::string& prefix,
                       KimiWeights& w) {
  if (c.vision) visit_moonvit_tensors(v, *c.vision, w.vision);  // at the top, not under prefix
  TensorVisitor::Scope root(v, {.prefix = prefix});
  visit_model_globals(v, c.vocab_size, c.hidden_size, c.tie_word_embeddings, w.parts);
  if (c.attn_res_block_size) {
    // The final mix's prefix is (unverified) (docs/models.md §7.3.3).
    TensorVisitor::Scope res(v, {.prefix = "model.", .component = Component::kAttnRes});
    visit_attn_res_tensors(v, "output_attn_res", c.hidden_size, w.final_res);
  }
  const LayerSchedule schedule = kimi_linear_schedule(c);
  w.layers.resize(schedule.layers.size());
  w.mtp.resize(static_cast<size_t>(schedule.num_mtp_layers()));
  for (size_t i = 0; i < schedule.layers.size(); ++i) {
    const LayerSpec& spec = schedule.layers[i];
    visit_decoder_layer_tensors(v, layer_config(c, spec), w.layers[i]);
    if (spec.is_mtp)
      visit_mtp_tensors(v, spec.layer_id, c.vocab_size, c.hidden_size, c.tie_word_embeddings,
                        w.mtp[i - static_cast<size_t>(c.num_hidden_layers)]);
  }
}

}  // namespace

TensorTable kimi_linear_tensors(const KimiLinearConfig& c, const std::string& prefix) {
  const formats::QuantizationConfig& q = c.quantization_config;
  const bool mxfp4 = q.method == formats::QuantMethod::kMxfp4CompressedTensors;
  // Only routed experts are quantized (docs/models.md §7.3); everything else is a plain linear.
  TensorTableBuilder builder(
      TensorTable(128, 128, mxfp4 ? q.group_size : 32), [mxfp4](Component component) {
        return mxfp4 && component == Component::kRoutedExperts ? WeightFormat::kMxfp4
                                                               : WeightFormat::kPlain;
      });
  KimiWeights declared;
  visit_kimi_linear(builder, c, prefix, declared);
  return std::move(builder).take();
}

Result<std::unique_ptr<CausalLm>> load_kimi_linear_model(
    const KimiLinearConfig& config, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options) {
  const kernels::KvCacheDtype kv_dtype =
      options.kv_cache_dtype.value_or(kernels::KvCacheDtype::kBf16);
  if (kv_dtype == kernels::KvCacheDtype::kFp8 && config.kv_lora_rank % 128 != 0)
    return make_error(StatusCode::kInvalidArgument,
                      "--kv-cache-dtype fp8 quantizes the MLA latent in tiles of 128, but "
                      "kv_lora_rank is {}; use bf16",
                      config.kv_lora_rank);
  const RankShard shard = RankShard::of(options.plan, options.rank);
  WeightLoader loader(*checkpoint, config.quantization_config, options.mxfp4_activations);
  WeightReader reader(loader, shard);
  KimiWeights w;
  visit_kimi_linear(reader, config, prefix, w);
  DZ_RETURN_IF_ERROR(reader.status());

  HybridModelParts parts = std::move(w.parts);
  parts.vocab_size = config.vocab_size;
  parts.hidden_size = config.hidden_size;
  parts.final_norm_eps = static_cast<float>(config.rms_norm_eps);
  parts.attn_res_eps = static_cast<float>(config.rms_norm_eps);
  parts.kv_cache_dtype = kv_dtype;
  if (config.attn_res_block_size)
    parts.final_attn_res_query = attn_res_folded_query(w.final_res.proj, w.final_res.norm);
  const LayerSchedule schedule = kimi_linear_schedule(config);
  parts.comm = options.tp_group();
  parts.cp_comm = options.cp_group();
  parts.cp_layout = options.cp_layout;
  for (size_t i = 0; i < schedule.layers.size(); ++i) {
    DecoderLayer layer =
        make_decoder_layer(layer_config(config, schedule.layers[i]), std::move(w.layers[i]), shard,
                           options.tp_group(), options.expert_group());
    if (!schedule.layers[i].is_mtp) {
      parts.layers.push_back(std::move(layer));
      continue;
    }
    parts.mtp = std::make_unique<MtpLayer>(std::move(w.mtp.front()));
    parts.mtp->layer = std::move(layer);
  }
  if (config.vision) {
    DZ_ASSIGN_OR_RETURN(ImageProcessorConfig processor,
                        load_image_processor_config(checkpoint->dir(), config.vision->patch_size));
    parts.vision = std::make_unique<VisionEncoder>(MoonVit(*config.vision, std::move(w.vision)),
                                                   processor, config.media_placeholder_token_id);
  }
  parts.checkpoint = std::move(checkpoint);
  return std::unique_ptr<CausalLm>(std::make_unique<HybridModel>(std::move(parts)));
}

}  // namespace dz::model
