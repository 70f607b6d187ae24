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

// x ← round_bf16(x + delta): the residual add in FP32, stored BF16 (notes/issue3.md).
void add_residual(float* x, const float* delta, int64_t num_elems) {
  for (int64_t i = 0; i < num_elems; ++i) x[i] += delta[i];
  kernels::round_to_bf16(x, num_elems);
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

struct DeepseekV32Model::Layer {
  std::vector<float> input_layernorm;           // [d]
  std::vector<float> post_attention_layernorm;  // [d]
  std::unique_ptr<MlaBlock> mla;
  std::unique_ptr<DsaIndexer> indexer;
  std::optional<MlpWeights> dense_mlp;  // layers < first_k_dense_replace
  std::unique_ptr<MoeBlock> moe;        // the others
};

struct DeepseekV32Model::Mtp {
  std::vector<float> enorm;             // [d], on the embedding of x_{t+1}
  std::vector<float> hnorm;             // [d], on the main hidden state h_t
  kernels::LinearWeight eh_proj;        // [d, 2d], input [enorm(e) ; hnorm(h)]
  std::vector<float> shared_head_norm;  // [d]
  // The published embed_tokens / shared_head.head are copies of the main ones (models.md §7.1):
  // loaded only when their bytes differ.
  std::optional<Embedding> embed_tokens;
  std::optional<kernels::LinearWeight> head;
  std::unique_ptr<Layer> layer;
};

DeepseekV32Model::DeepseekV32Model(DeepseekV32Config config, ModelOptions options,
                                   std::unique_ptr<formats::Checkpoint> checkpoint)
    : config_(std::move(config)), options_(options), checkpoint_(std::move(checkpoint)) {}

DeepseekV32Model::~DeepseekV32Model() = default;

Result<std::unique_ptr<DeepseekV32Model>> DeepseekV32Model::load(
    const DeepseekV32Config& config, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options) {
  std::unique_ptr<DeepseekV32Model> m(new DeepseekV32Model(config, options, std::move(checkpoint)));
  m->prefix_ = prefix;
  const int64_t d = config.hidden_size;
  WeightLoader loader(*m->checkpoint_, config.quantization_config);
  DZ_ASSIGN_OR_RETURN(m->embed_tokens_, loader.embedding(prefix + "model.embed_tokens.weight"));
  DZ_ASSIGN_OR_RETURN(m->final_norm_, loader.floats(prefix + "model.norm.weight", d));
  DZ_ASSIGN_OR_RETURN(
      m->lm_head_,
      loader.linear(prefix + (config.tie_word_embeddings ? "model.embed_tokens" : "lm_head")));
  for (const LayerSpec& spec : deepseek_v32_schedule(config).layers) {
    if (spec.is_mtp && m->mtp_ != nullptr) break;  // only the first MTP layer is run
    DZ_ASSIGN_OR_RETURN(std::unique_ptr<Layer> layer,
                        m->load_layer(loader, spec.layer_id, spec.ffn == FfnKind::kMoe));
    if (!spec.is_mtp) {
      m->layers_.push_back(std::move(layer));
      continue;
    }
    auto mtp = std::make_unique<Mtp>();
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
    m->mtp_ = std::move(mtp);
  }
  return m;
}

Result<std::unique_ptr<DeepseekV32Model::Layer>> DeepseekV32Model::load_layer(
    const WeightLoader& loader, int layer_id, bool is_moe) const {
  const DeepseekV32Config& c = config_;
  const int64_t d = c.hidden_size;
  const std::string p = fmt::format("{}model.layers.{}.", prefix_, layer_id);
  auto layer = std::make_unique<Layer>();
  DZ_ASSIGN_OR_RETURN(layer->input_layernorm, loader.floats(p + "input_layernorm.weight", d));
  DZ_ASSIGN_OR_RETURN(layer->post_attention_layernorm,
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
  layer->mla = std::make_unique<MlaBlock>(deepseek_v32_mla_config(c), std::move(mla));

  DsaIndexerWeights index;
  DZ_ASSIGN_OR_RETURN(index.wq_b, loader.linear(a + "indexer.wq_b"));
  DZ_ASSIGN_OR_RETURN(index.wk, loader.linear(a + "indexer.wk"));
  DZ_ASSIGN_OR_RETURN(index.k_norm_weight,
                      loader.floats(a + "indexer.k_norm.weight", c.index_head_dim));
  DZ_ASSIGN_OR_RETURN(index.k_norm_bias,
                      loader.floats(a + "indexer.k_norm.bias", c.index_head_dim));
  DZ_ASSIGN_OR_RETURN(index.weights_proj, loader.linear(a + "indexer.weights_proj"));
  layer->indexer = std::make_unique<DsaIndexer>(deepseek_v32_indexer_config(c), std::move(index));

  auto load_mlp = [&](const std::string& mlp_prefix) -> Result<MlpWeights> {
    MlpWeights w;
    DZ_ASSIGN_OR_RETURN(w.gate_proj, loader.linear(mlp_prefix + "gate_proj"));
    DZ_ASSIGN_OR_RETURN(w.up_proj, loader.linear(mlp_prefix + "up_proj"));
    DZ_ASSIGN_OR_RETURN(w.down_proj, loader.linear(mlp_prefix + "down_proj"));
    return w;
  };
  if (!is_moe) {
    DZ_ASSIGN_OR_RETURN(layer->dense_mlp, load_mlp(p + "mlp."));
    return layer;
  }
  MoeWeights moe;
  DZ_ASSIGN_OR_RETURN(moe.gate_weight,
                      loader.floats(p + "mlp.gate.weight", c.n_routed_experts * d));
  DZ_ASSIGN_OR_RETURN(moe.e_score_correction_bias,
                      loader.floats(p + "mlp.gate.e_score_correction_bias", c.n_routed_experts));
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    DZ_ASSIGN_OR_RETURN(MlpWeights expert, load_mlp(fmt::format("{}mlp.experts.{}.", p, e)));
    moe.experts.push_back(std::move(expert));
  }
  if (c.n_shared_experts > 0) {
    DZ_ASSIGN_OR_RETURN(MlpWeights shared, load_mlp(p + "mlp.shared_experts."));
    moe.shared_experts.push_back(std::move(shared));
  }
  layer->moe = std::make_unique<MoeBlock>(deepseek_v32_moe_config(c), std::move(moe));
  return layer;
}

std::vector<LayerCacheSpec> DeepseekV32Model::cache_layers() const {
  const int64_t num_layers = config_.num_hidden_layers + (mtp_ ? 1 : 0);
  LayerCacheSpec spec{.mla = {.latent_dim = config_.kv_lora_rank,
                              .rope_dim = config_.qk_rope_head_dim,
                              .dtype = options_.kv_cache_dtype},
                      .index_key_dim = config_.index_head_dim};
  return std::vector<LayerCacheSpec>(static_cast<size_t>(num_layers), spec);
}

Status DeepseekV32Model::check_batch(const ForwardBatch& batch, const KvCache& cache) const {
  const int64_t num_tokens = batch.num_tokens();
  if (static_cast<int64_t>(batch.positions.size()) != num_tokens ||
      static_cast<int64_t>(batch.slot_mapping.size()) != num_tokens)
    return make_error(StatusCode::kInvalidArgument,
                      "batch: {} tokens but {} positions and {} slots", num_tokens,
                      batch.positions.size(), batch.slot_mapping.size());
  if (batch.block_size != cache.block_size())
    return make_error(StatusCode::kInvalidArgument,
                      "batch: block size {} differs from the cache's {}", batch.block_size,
                      cache.block_size());
  if (cache.num_layers() < static_cast<int64_t>(cache_layers().size()))
    return make_error(StatusCode::kInvalidArgument, "KV cache has {} layers, the model needs {}",
                      cache.num_layers(), cache_layers().size());
  for (int64_t i = 0; i < num_tokens; ++i) {
    int32_t id = batch.token_ids[static_cast<size_t>(i)];
    if (id < 0 || id >= config_.vocab_size)
      return make_error(StatusCode::kInvalidArgument,
                        "token id {} at index {} is outside the vocabulary [0, {})", id, i,
                        config_.vocab_size);
  }
  int64_t covered = 0;
  for (const SequenceSlice& seq : batch.sequences) {
    if (seq.token_begin != covered || seq.num_tokens <= 0 || seq.pos_begin < 0)
      return make_error(StatusCode::kInvalidArgument,
                        "batch: sequences must tile the tokens in order (sequence at {} with {} "
                        "tokens, expected start {})",
                        seq.token_begin, seq.num_tokens, covered);
    covered += seq.num_tokens;
    const int64_t blocks_needed =
        (seq.num_cached_after() + batch.block_size - 1) / batch.block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed)
      return make_error(StatusCode::kInvalidArgument,
                        "batch: {} cached positions need {} blocks, the block table has {}",
                        seq.num_cached_after(), blocks_needed, seq.block_table.size());
    for (int32_t block_id : seq.block_table.first(static_cast<size_t>(blocks_needed)))
      if (block_id < 0 || block_id >= cache.num_blocks())
        return make_error(StatusCode::kInvalidArgument, "batch: block id {} outside [0, {})",
                          block_id, cache.num_blocks());
    for (int64_t i = 0; i < seq.num_tokens; ++i) {
      const auto t = static_cast<size_t>(seq.token_begin + i);
      if (batch.positions[t] != seq.pos_begin + i ||
          batch.slot_mapping[t] != slot_of(seq.block_table, batch.block_size, seq.pos_begin + i))
        return make_error(StatusCode::kInvalidArgument,
                          "batch: token {} has position {} and slot {}, its sequence implies {} "
                          "and {}",
                          t, batch.positions[t], batch.slot_mapping[t], seq.pos_begin + i,
                          slot_of(seq.block_table, batch.block_size, seq.pos_begin + i));
    }
  }
  if (covered != num_tokens)
    return make_error(StatusCode::kInvalidArgument, "batch: sequences cover {} of {} tokens",
                      covered, num_tokens);
  return Status::ok_status();
}

void DeepseekV32Model::ensure_scratch(const ExecContext& ctx, const ForwardBatch& batch) {
  const DeepseekV32Config& c = config_;
  const int64_t T = batch.num_tokens();
  int64_t max_range = 0;
  for (const SequenceSlice& seq : batch.sequences)
    max_range = std::max(max_range, seq.num_cached_after());
  const int64_t K = c.index_topk;
  // The indexer has no scratch_bytes(): its q, k, codes, scales and head weights, the tapped score
  // and selection rows, and the kernel workspace (bounded by one score row and a top-k heap per
  // thread, lightning_indexer.h), each allocation padded to 64 bytes.
  const int64_t n_i = c.index_n_heads, d_i = c.index_head_dim;
  const int64_t indexer_floats = T * (n_i * d_i * 2 + d_i * 2 + n_i * 3 + 2 + 2 * K) +
                                 ctx.num_threads * (max_range + 8 * K + 16 * 1024) + 64 * 1024;
  size_t bytes = static_cast<size_t>(indexer_floats) * 4 + 64 * 16;
  auto consider = [&](const Layer& layer) {
    bytes = std::max(bytes, layer.mla->scratch_bytes(ctx, T, K));
    if (layer.moe != nullptr) bytes = std::max(bytes, layer.moe->scratch_bytes(T));
    if (layer.dense_mlp) bytes = std::max(bytes, gated_mlp_scratch_bytes(*layer.dense_mlp, T));
  };
  for (const auto& layer : layers_) consider(*layer);
  if (mtp_ != nullptr) consider(*mtp_->layer);
  if (scratch_ == nullptr || scratch_->capacity_bytes() < bytes)
    scratch_ = std::make_unique<Arena>(bytes);
}

DeepseekV32Model::LayerBlocks DeepseekV32Model::layer_blocks(int layer_id) const {
  DZ_CHECK(layer_id >= 0 && layer_id < static_cast<int>(layers_.size()), "layer {} of {}", layer_id,
           layers_.size());
  const Layer& layer = *layers_[static_cast<size_t>(layer_id)];
  return LayerBlocks{.mla = layer.mla.get(),
                     .indexer = layer.indexer.get(),
                     .dense_mlp = layer.dense_mlp ? &*layer.dense_mlp : nullptr,
                     .moe = layer.moe.get()};
}

Arena& DeepseekV32Model::block_scratch(const ExecContext& ctx, const ForwardBatch& batch) {
  ensure_scratch(ctx, batch);
  return *scratch_;
}

void DeepseekV32Model::run_layer(const ExecContext& ctx, const Layer& layer, int layer_id,
                                 const ForwardBatch& batch, KvCache& cache, float* x,
                                 TapSink* taps) {
  const DeepseekV32Config& c = config_;
  const int64_t T = batch.num_tokens();
  const int64_t d = c.hidden_size;
  const auto eps = static_cast<float>(c.rms_norm_eps);
  std::vector<float> normed(static_cast<size_t>(T * d));  // [T, d]
  std::vector<float> delta(static_cast<size_t>(T * d));   // [T, d] sublayer output

  // Attention sublayer: indexer (always: it fills the index cache) then MLA.
  rms_norm_bf16(ctx, x, layer.input_layernorm, normed.data(), T, d, eps);
  tap(taps, layer_id, "attn_norm", normed.data(), {T, d});
  std::vector<float> c_q(static_cast<size_t>(T * c.q_lora_rank));  // [T, r_q]
  layer.mla->q_latent(ctx, normed.data(), T, c_q.data());
  tap(taps, layer_id, "q_latent", c_q.data(), {T, c.q_lora_rank});

  const int64_t K = c.index_topk;
  std::vector<int32_t> selection(static_cast<size_t>(T * K));  // [T, K], −1 padded
  scratch_->reset();
  layer.indexer->select(ctx, batch, normed.data(), c_q.data(), cache.index_layer(layer_id),
                        selection, *scratch_, taps, layer_id);  // taps "index_selection"
  // While every token sees at most K positions the selection is the whole causal prefix
  // (models.md §3.3), so dense attention is the same set and cheaper.
  bool sparse = false;
  for (int32_t pos : batch.positions) sparse = sparse || pos + 1 > K;
  TokenSelection attend =
      sparse ? TokenSelection{.positions = selection, .width = K} : TokenSelection{};
  scratch_->reset();
  layer.mla->forward(ctx, batch, normed.data(), c_q.data(), cache.mla_layer(layer_id), attend,
                     delta.data(), *scratch_, taps, layer_id);
  kernels::round_to_bf16(delta.data(), T * d);  // o_proj output; MLA taps "attn_out"
  add_residual(x, delta.data(), T * d);

  // FFN sublayer.
  rms_norm_bf16(ctx, x, layer.post_attention_layernorm, normed.data(), T, d, eps);
  tap(taps, layer_id, "ffn_norm", normed.data(), {T, d});
  scratch_->reset();
  if (layer.moe != nullptr)
    layer.moe->forward(ctx, normed.data(), T, delta.data(), *scratch_, taps, layer_id);
  else
    gated_mlp_forward(ctx, *layer.dense_mlp, MlpActivation{}, normed.data(), T, delta.data(),
                      *scratch_);
  kernels::round_to_bf16(delta.data(), T * d);
  tap(taps, layer_id, "ffn_out", delta.data(), {T, d});
  add_residual(x, delta.data(), T * d);
  tap(taps, layer_id, "layer_out", x, {T, d});
}

Status DeepseekV32Model::forward_hidden(const ExecContext& ctx, const ForwardBatch& batch,
                                        KvCache& cache, float* hidden, TapSink* taps) {
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  ensure_scratch(ctx, batch);
  embed_tokens_.lookup(batch.token_ids, hidden);  // BF16 values: already BF16-valued
  for (size_t i = 0; i < layers_.size(); ++i)
    run_layer(ctx, *layers_[i], static_cast<int>(i), batch, cache, hidden, taps);
  return Status::ok_status();
}

Status DeepseekV32Model::forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                                 std::span<const int64_t> logits_rows, float* out_logits,
                                 TapSink* taps) {
  const int64_t T = batch.num_tokens();
  const int64_t d = config_.hidden_size;
  for (int64_t row : logits_rows)
    if (row < 0 || row >= T)
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, T);
  std::vector<float> hidden(static_cast<size_t>(T * d));
  DZ_RETURN_IF_ERROR(forward_hidden(ctx, batch, cache, hidden.data(), taps));
  // model.norm over every row (cheap next to the layers): the MTP head reads all of them.
  final_norm(ctx, hidden.data(), T, hidden.data());
  tap(taps, -1, "final_norm", hidden.data(), {T, d});
  const auto num_rows = static_cast<int64_t>(logits_rows.size());
  std::vector<float> rows(static_cast<size_t>(num_rows * d));  // [rows, d]
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(rows.data() + r * d, hidden.data() + logits_rows[static_cast<size_t>(r)] * d,
                static_cast<size_t>(d) * sizeof(float));
  lm_head_.forward(ctx, rows.data(), num_rows, out_logits);
  tap(taps, -1, "logits", out_logits, {num_rows, config_.vocab_size});
  if (mtp_ != nullptr) {
    last_final_ = std::move(hidden);
    last_positions_.assign(batch.positions.begin(), batch.positions.end());
  }
  return Status::ok_status();
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

void DeepseekV32Model::final_norm(const ExecContext& ctx, const float* hidden, int64_t num_tokens,
                                  float* out) const {
  rms_norm_bf16(ctx, hidden, final_norm_, out, num_tokens, config_.hidden_size,
                static_cast<float>(config_.rms_norm_eps));
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
  ensure_scratch(ctx, batch);
  const int64_t T = batch.num_tokens();
  const int64_t d = config_.hidden_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  const int mtp_layer_id = static_cast<int>(config_.num_hidden_layers);

  // z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]), embedding first.
  std::vector<float> e(static_cast<size_t>(T * d));
  std::vector<float> h(static_cast<size_t>(T * d));
  (mtp_->embed_tokens ? *mtp_->embed_tokens : embed_tokens_).lookup(batch.token_ids, e.data());
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
  run_layer(ctx, *mtp_->layer, mtp_layer_id, batch, cache, z.data(), taps);

  const auto num_rows = static_cast<int64_t>(logits_rows.size());
  std::vector<float> normed(static_cast<size_t>(num_rows * d));
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(normed.data() + r * d, z.data() + logits_rows[static_cast<size_t>(r)] * d,
                static_cast<size_t>(d) * sizeof(float));
  rms_norm_bf16(ctx, normed.data(), mtp_->shared_head_norm, normed.data(), num_rows, d, eps);
  tap(taps, mtp_layer_id, "final_norm", normed.data(), {num_rows, d});
  (mtp_->head ? *mtp_->head : lm_head_).forward(ctx, normed.data(), num_rows, out_logits);
  tap(taps, mtp_layer_id, "logits", out_logits, {num_rows, config_.vocab_size});
  return Status::ok_status();
}

}  // namespace dz::model
