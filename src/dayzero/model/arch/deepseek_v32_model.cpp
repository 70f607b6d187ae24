#include "dayzero/model/arch/deepseek_v32_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "dayzero/core/check.h"
#include "dayzero/kernels/norms.h"
#include "dayzero/kernels/rope.h"

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

// y = round_bf16(RMSNorm(x)) over num_rows rows of width dim (models.md §1.1: FP32, rounded once).
void rms_norm_bf16(const ExecContext& ctx, const float* x, const std::vector<float>& weight,
                   float* y, int64_t num_rows, int64_t dim, float eps) {
  kernels::rms_norm(ctx, x, dim, weight.data(), y, dim, num_rows, dim, eps);
  kernels::round_to_bf16(y, num_rows * dim);
}

// One decoder layer (main or MTP) as blocks: MLA + indexer, then a dense MLP or the MoE.
Result<DecoderLayer> load_layer(const DeepseekV32Config& c, const WeightLoader& loader,
                                const std::string& prefix, int layer_id, bool is_moe) {
  const int64_t d = c.hidden_size;
  const std::string p = fmt::format("{}model.layers.{}.", prefix, layer_id);
  DecoderLayer layer;
  layer.layer_id = layer_id;
  layer.hidden_size = d;
  layer.norm_eps = static_cast<float>(c.rms_norm_eps);
  DZ_ASSIGN_OR_RETURN(layer.input_layernorm, loader.floats(p + "input_layernorm.weight", d));
  DZ_ASSIGN_OR_RETURN(layer.post_attention_layernorm,
                      loader.floats(p + "post_attention_layernorm.weight", d));

  const std::string a = p + "self_attn.";
  MlaWeights mla;
  DZ_ASSIGN_OR_RETURN(mla.q_a_proj, loader.linear(a + "q_a_proj"));
  DZ_ASSIGN_OR_RETURN(mla.q_a_layernorm, loader.floats(a + "q_a_layernorm.weight", c.q_lora_rank));
  DZ_ASSIGN_OR_RETURN(mla.q_b_proj, loader.linear(a + "q_b_proj"));
  DZ_ASSIGN_OR_RETURN(mla.kv_a_proj_with_mqa, loader.linear(a + "kv_a_proj_with_mqa"));
  DZ_ASSIGN_OR_RETURN(mla.kv_a_layernorm,
                      loader.floats(a + "kv_a_layernorm.weight", c.kv_lora_rank));
  DZ_ASSIGN_OR_RETURN(mla.kv_b_proj, loader.linear(a + "kv_b_proj"));
  DZ_ASSIGN_OR_RETURN(mla.o_proj, loader.linear(a + "o_proj"));
  layer.mla = std::make_unique<MlaBlock>(deepseek_v32_mla_config(c), std::move(mla));

  DsaIndexerWeights index;
  DZ_ASSIGN_OR_RETURN(index.wq_b, loader.linear(a + "indexer.wq_b"));
  DZ_ASSIGN_OR_RETURN(index.wk, loader.linear(a + "indexer.wk"));
  DZ_ASSIGN_OR_RETURN(index.k_norm_weight,
                      loader.floats(a + "indexer.k_norm.weight", c.index_head_dim));
  DZ_ASSIGN_OR_RETURN(index.k_norm_bias,
                      loader.floats(a + "indexer.k_norm.bias", c.index_head_dim));
  DZ_ASSIGN_OR_RETURN(index.weights_proj, loader.linear(a + "indexer.weights_proj"));
  layer.indexer = std::make_unique<DsaIndexer>(deepseek_v32_indexer_config(c), std::move(index));

  if (!is_moe) {
    DZ_ASSIGN_OR_RETURN(layer.dense_mlp, loader.gated_mlp(p + "mlp."));
    return layer;
  }
  MoeWeights moe;
  DZ_ASSIGN_OR_RETURN(moe.gate_weight,
                      loader.floats(p + "mlp.gate.weight", c.n_routed_experts * d));
  DZ_ASSIGN_OR_RETURN(moe.e_score_correction_bias,
                      loader.floats(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts));
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    DZ_ASSIGN_OR_RETURN(MlpWeights expert,
                        loader.gated_mlp(fmt::format("{}mlp.experts.{}.", p, e)));
    moe.experts.push_back(std::move(expert));
  }
  if (c.n_shared_experts > 0) {
    DZ_ASSIGN_OR_RETURN(MlpWeights shared, loader.gated_mlp(p + "mlp.shared_experts."));
    moe.shared_experts.push_back(std::move(shared));
  }
  layer.moe = std::make_unique<MoeBlock>(deepseek_v32_moe_config(c), std::move(moe));
  return layer;
}

}  // namespace

MlaConfig deepseek_v32_mla_config(const DeepseekV32Config& c) {
  // softmax_scale = (d_n + d_r)^(−1/2) · M(s, mscale_all_dim)², models.md §1.3.
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
  };
}

struct DeepseekV32Model::Mtp {
  std::vector<float> enorm;             // [d], on the embedding of x_{t+1}
  std::vector<float> hnorm;             // [d], on the main hidden state h_t
  kernels::LinearWeight eh_proj;        // [d, 2d], input [enorm(e) ; hnorm(h)]
  std::vector<float> shared_head_norm;  // [d]
  // The published embed_tokens / shared_head.head are copies of the main ones (models.md §7.1):
  // loaded only when their bytes differ.
  std::optional<Embedding> embed_tokens;
  std::optional<kernels::LinearWeight> head;
  DecoderLayer layer;
};

DeepseekV32Model::DeepseekV32Model(HybridModelParts parts, DeepseekV32Config config)
    : HybridModel(std::move(parts)), config_(std::move(config)) {}

DeepseekV32Model::~DeepseekV32Model() = default;

Result<std::unique_ptr<DeepseekV32Model>> DeepseekV32Model::load(
    const DeepseekV32Config& config, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options) {
  const int64_t d = config.hidden_size;
  WeightLoader loader(*checkpoint, config.quantization_config);
  HybridModelParts parts;
  parts.vocab_size = config.vocab_size;
  parts.hidden_size = d;
  parts.final_norm_eps = static_cast<float>(config.rms_norm_eps);
  parts.kv_cache_dtype = options.kv_cache_dtype.value_or(kernels::KvCacheDtype::kFp8);
  DZ_ASSIGN_OR_RETURN(parts.embed_tokens, loader.embedding(prefix + "model.embed_tokens.weight"));
  DZ_ASSIGN_OR_RETURN(parts.final_norm, loader.floats(prefix + "model.norm.weight", d));
  DZ_ASSIGN_OR_RETURN(
      parts.lm_head,
      loader.linear(prefix + (config.tie_word_embeddings ? "model.embed_tokens" : "lm_head")));
  std::unique_ptr<Mtp> mtp;
  for (const LayerSpec& spec : deepseek_v32_schedule(config).layers) {
    if (spec.is_mtp && mtp != nullptr) break;  // only the first MTP layer is run
    DZ_ASSIGN_OR_RETURN(DecoderLayer layer, load_layer(config, loader, prefix, spec.layer_id,
                                                       spec.ffn == FfnKind::kMoe));
    if (!spec.is_mtp) {
      parts.layers.push_back(std::move(layer));
      continue;
    }
    mtp = std::make_unique<Mtp>();
    const std::string p = fmt::format("{}model.layers.{}.", prefix, spec.layer_id);
    DZ_ASSIGN_OR_RETURN(mtp->enorm, loader.floats(p + "enorm.weight", d));
    DZ_ASSIGN_OR_RETURN(mtp->hnorm, loader.floats(p + "hnorm.weight", d));
    DZ_ASSIGN_OR_RETURN(mtp->eh_proj, loader.linear(p + "eh_proj"));
    DZ_ASSIGN_OR_RETURN(mtp->shared_head_norm, loader.floats(p + "shared_head.norm.weight", d));
    if (!loader.same_bytes(p + "embed_tokens.weight", prefix + "model.embed_tokens.weight")) {
      DZ_ASSIGN_OR_RETURN(mtp->embed_tokens, loader.embedding(p + "embed_tokens.weight"));
    }
    const std::string main_head =
        prefix + (config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    if (!loader.same_bytes(p + "shared_head.head.weight", main_head)) {
      DZ_ASSIGN_OR_RETURN(mtp->head, loader.linear(p + "shared_head.head"));
    }
    mtp->layer = std::move(layer);
  }
  parts.checkpoint = std::move(checkpoint);
  std::unique_ptr<DeepseekV32Model> m(new DeepseekV32Model(std::move(parts), config));
  if (mtp != nullptr) {
    m->add_extra_layer(&mtp->layer);  // its caches follow the main layers'
    m->mtp_ = std::move(mtp);
  }
  return m;
}

void DeepseekV32Model::keep_final_norm(const ForwardBatch& batch, std::vector<float>& normed) {
  if (mtp_ == nullptr) return;
  last_final_ = std::move(normed);
  last_positions_.assign(batch.positions.begin(), batch.positions.end());
}

Status DeepseekV32Model::forward_mtp(const ExecContext& ctx, const ForwardBatch& batch,
                                     KvCache& cache, std::span<const int64_t> logits_rows,
                                     float* out_logits, TapSink* taps) {
  const int64_t T = batch.num_tokens();
  if (T > static_cast<int64_t>(last_positions_.size()) ||
      !std::equal(batch.positions.begin(), batch.positions.end(), last_positions_.begin()))
    return make_error(StatusCode::kInvalidArgument,
                      "forward_mtp: the batch's {} tokens must sit at the positions of the last "
                      "forward()'s first tokens ({} kept)",
                      T, last_positions_.size());
  return mtp_logits(ctx, batch, cache, last_final_.data(), logits_rows, out_logits, taps);
}

Status DeepseekV32Model::mtp_logits(const ExecContext& ctx, const ForwardBatch& batch,
                                    KvCache& cache, const float* main_final,
                                    std::span<const int64_t> logits_rows, float* out_logits,
                                    TapSink* taps) {
  if (mtp_ == nullptr)
    return make_error(StatusCode::kUnsupported,
                      "this checkpoint has no MTP layer "
                      "(num_nextn_predict_layers 0)");
  for (int64_t row : logits_rows)
    if (row < 0 || row >= batch.num_tokens())
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, batch.num_tokens());
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  const int64_t T = batch.num_tokens();
  const int64_t d = config_.hidden_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  const int mtp_layer_id = mtp_->layer.layer_id;

  // z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]), embedding first.
  std::vector<float> e(static_cast<size_t>(T * d));
  std::vector<float> h(static_cast<size_t>(T * d));
  (mtp_->embed_tokens ? *mtp_->embed_tokens : embed_tokens()).lookup(batch.token_ids, e.data());
  rms_norm_bf16(ctx, e.data(), mtp_->enorm, e.data(), T, d, eps);
  rms_norm_bf16(ctx, main_final, mtp_->hnorm, h.data(), T, d, eps);
  std::vector<float> eh(static_cast<size_t>(T * 2 * d));  // [T, 2d]
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(eh.data() + t * 2 * d, e.data() + t * d, static_cast<size_t>(d) * sizeof(float));
    std::memcpy(eh.data() + t * 2 * d + d, h.data() + t * d,
                static_cast<size_t>(d) * sizeof(float));
  }
  std::vector<float> z(static_cast<size_t>(T * d));
  mtp_->eh_proj.forward(ctx, eh.data(), T, z.data());
  kernels::round_to_bf16(z.data(), T * d);
  tap(taps, mtp_layer_id, "mtp_input", z.data(), {T, d});
  run_extra_layer(ctx, mtp_->layer, batch, cache, z.data(), taps);

  const auto num_rows = static_cast<int64_t>(logits_rows.size());
  std::vector<float> normed(static_cast<size_t>(num_rows * d));
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(normed.data() + r * d, z.data() + logits_rows[static_cast<size_t>(r)] * d,
                static_cast<size_t>(d) * sizeof(float));
  rms_norm_bf16(ctx, normed.data(), mtp_->shared_head_norm, normed.data(), num_rows, d, eps);
  tap(taps, mtp_layer_id, "final_norm", normed.data(), {num_rows, d});
  if (mtp_->head) {
    mtp_->head->forward(ctx, normed.data(), num_rows, out_logits);
  } else {
    std::vector<int64_t> rows(static_cast<size_t>(num_rows));
    for (int64_t r = 0; r < num_rows; ++r) rows[static_cast<size_t>(r)] = r;
    lm_head(ctx, normed.data(), rows, out_logits);
  }
  tap(taps, mtp_layer_id, "logits", out_logits, {num_rows, config_.vocab_size});
  return Status::ok_status();
}

}  // namespace dz::model
