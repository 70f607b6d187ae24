#include "dayzero/model/arch/deepseek_v32_model.h"

#include <algorithm>
#include <cmath>

#include "dayzero/core/check.h"
#include "dayzero/kernels/rope.h"
#include "dayzero/model/tensor_table_builder.h"

namespace dz::model {
namespace {

kernels::RopeFrequencies rope_frequencies(const DeepseekV32Config& c) {
  if (!c.rope_scaling) return kernels::plain_rope_frequencies(c.qk_rope_head_dim, c.rope_theta);
  const formats::RopeScaling& r = *c.rope_scaling;
  return kernels::yarn_rope_frequencies(
      c.qk_rope_head_dim, c.rope_theta,
      {.factor = r.factor,
       .original_max_position_embeddings = r.original_max_position_embeddings,
       .beta_fast = r.beta_fast,
       .beta_slow = r.beta_slow,
       .mscale = r.mscale,
       .mscale_all_dim = r.mscale_all_dim});
}

}  // namespace

MlaConfig deepseek_v32_mla_config(const DeepseekV32Config& c) {
  // softmax_scale = (d_n + d_r)^(−1/2) · M(s, mscale_all_dim)², docs/models.md §1.3.
  double mscale = c.rope_scaling
                      ? kernels::yarn_mscale(c.rope_scaling->factor, c.rope_scaling->mscale_all_dim)
                      : 1.0;
  double scale = std::pow(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim), -0.5) *
                 mscale * mscale;
  return MlaConfig{
      .hidden_size = c.hidden_size,
      .num_heads = c.num_attention_heads,
      .q_lora_rank = c.q_lora_rank,
      .kv_lora_rank = c.kv_lora_rank,
      .qk_nope_head_dim = c.qk_nope_head_dim,
      .qk_rope_head_dim = c.qk_rope_head_dim,
      .v_head_dim = c.v_head_dim,
      .softmax_scale = static_cast<float>(scale),
      .q_norm_eps = static_cast<float>(c.rms_norm_eps),
      .kv_norm_eps = static_cast<float>(c.rms_norm_eps),
      .rope = rope_frequencies(c),
      .output_gate = false,
  };
}

DsaIndexerConfig deepseek_v32_indexer_config(const DeepseekV32Config& c) {
  return DsaIndexerConfig{
      .hidden_size = c.hidden_size,
      .q_lora_rank = c.q_lora_rank,
      .index_n_heads = c.index_n_heads,
      .index_head_dim = c.index_head_dim,
      .index_topk = c.index_topk,
      .rope = rope_frequencies(c),
      .rope_layout = c.indexer_rope_interleave ? kernels::RopeLayout::kInterleaved
                                               : kernels::RopeLayout::kRotateHalf,
      .k_norm_eps = 1e-6f,
  };
}

MoeConfig deepseek_v32_moe_config(const DeepseekV32Config& c) {
  return MoeConfig{
      .num_experts = c.n_routed_experts,
      .num_experts_per_tok = c.num_experts_per_tok,
      .n_group = c.n_group,
      .topk_group = c.topk_group,
      .norm_topk_prob = c.norm_topk_prob,
      .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor),
      .renorm_epsilon = 0.0f,
      .activation = MlpActivation{},  // SwiGLU
      .latent_norm_eps = 0.0f,        // no latent MoE
      .hidden_size = c.hidden_size,
      .intermediate_size = c.moe_intermediate_size,
      .num_shared_experts = c.n_shared_experts,
  };
}

namespace {

DecoderLayerConfig layer_config(const DeepseekV32Config& c, const LayerSpec& spec) {
  DecoderLayerConfig layer{.spec = spec,
                           .hidden_size = c.hidden_size,
                           .norm_eps = static_cast<float>(c.rms_norm_eps),
                           .mla = deepseek_v32_mla_config(c),
                           .indexer = deepseek_v32_indexer_config(c),
                           .dense_intermediate_size = c.intermediate_size};
  if (spec.ffn == FfnKind::kMoe) layer.moe = deepseek_v32_moe_config(c);
  return layer;
}

struct DeepseekV32Weights {
  HybridModelParts parts;                   // the globals
  std::vector<DecoderLayerWeights> layers;  // main layers, then the visited MTP layers
  std::vector<MtpLayer> mtp;                // the MTP layers' own tensors
};

// The model's tensors: globals, the main layers, then `num_mtp_layers` MTP layers, each a decoder
// layer plus its own tensors (eh_proj's dtype is (unverified): FP8 or plain accepted).
void visit_deepseek_v32(TensorVisitor& v, const DeepseekV32Config& c, const std::string& prefix,
                        int64_t num_mtp_layers, DeepseekV32Weights& w) {
  TensorVisitor::Scope root(v, {.prefix = prefix});
  visit_model_globals(v, c.vocab_size, c.hidden_size, c.tie_word_embeddings, w.parts);
  const LayerSchedule schedule = deepseek_v32_schedule(c);
  const auto num_layers = static_cast<size_t>(c.num_hidden_layers + num_mtp_layers);
  w.layers.resize(num_layers);
  w.mtp.resize(static_cast<size_t>(num_mtp_layers));
  for (size_t i = 0; i < num_layers; ++i) {
    const LayerSpec& spec = schedule.layers[i];
    visit_decoder_layer_tensors(v, layer_config(c, spec), w.layers[i]);
    if (spec.is_mtp)
      visit_mtp_tensors(v, spec.layer_id, c.vocab_size, c.hidden_size, c.tie_word_embeddings,
                        w.mtp[i - static_cast<size_t>(c.num_hidden_layers)]);
  }
}

}  // namespace

TensorTable deepseek_v32_tensors(const DeepseekV32Config& c, const std::string& prefix) {
  const formats::QuantizationConfig& q = c.quantization_config;
  const bool fp8 = q.method == formats::QuantMethod::kFp8Block;
  TensorTableBuilder builder(TensorTable(fp8 ? q.block_rows : 128, fp8 ? q.block_cols : 128, 32),
                             [fp8](Component component) {
                               if (!fp8) return WeightFormat::kPlain;
                               return component == Component::kMtp ? WeightFormat::kFp8BlockOrPlain
                                                                   : WeightFormat::kFp8Block;
                             });
  DeepseekV32Weights declared;
  visit_deepseek_v32(builder, c, prefix, c.num_nextn_predict_layers, declared);
  return std::move(builder).take();
}

Result<std::unique_ptr<CausalLm>> load_deepseek_v32_model(
    const DeepseekV32Config& config, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options) {
  const RankShard shard = RankShard::of(options.plan, options.rank);
  WeightLoader loader(*checkpoint, config.quantization_config, options.mxfp4_activations);
  WeightReader reader(loader, shard);
  DeepseekV32Weights w;
  const int64_t mtp_layers = std::min<int64_t>(config.num_nextn_predict_layers, 1);
  visit_deepseek_v32(reader, config, prefix, mtp_layers, w);
  DZ_RETURN_IF_ERROR(reader.status());

  HybridModelParts parts = std::move(w.parts);
  parts.vocab_size = config.vocab_size;
  parts.hidden_size = config.hidden_size;
  parts.final_norm_eps = static_cast<float>(config.rms_norm_eps);
  parts.kv_cache_dtype = options.kv_cache_dtype.value_or(kernels::KvCacheDtype::kFp8);
  const LayerSchedule schedule = deepseek_v32_schedule(config);
  parts.comm = options.tp_group();
  parts.cp_comm = options.cp_group();
  parts.cp_layout = options.cp_layout;
  for (size_t i = 0; i < static_cast<size_t>(config.num_hidden_layers); ++i)
    parts.layers.push_back(make_decoder_layer(layer_config(config, schedule.layers[i]),
                                              std::move(w.layers[i]), shard, options.tp_group(),
                                              options.expert_group()));
  if (!w.mtp.empty()) {
    parts.mtp = std::make_unique<MtpLayer>(std::move(w.mtp.front()));
    const auto l = static_cast<size_t>(config.num_hidden_layers);
    parts.mtp->layer =
        make_decoder_layer(layer_config(config, schedule.layers[l]), std::move(w.layers[l]), shard,
                           options.tp_group(), options.expert_group());
  }
  parts.checkpoint = std::move(checkpoint);
  return std::unique_ptr<CausalLm>(std::make_unique<HybridModel>(std::move(parts)));
}

}  // namespace dz::model
