#include "dayzero/model/decoder_layer.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "dayzero/core/check.h"
#include "dayzero/kernels/norms.h"

namespace dz::model {

void rms_norm_bf16(const ExecContext& ctx, const float* x, const std::vector<float>& weight,
                   float* y, int64_t num_rows, int64_t dim, float eps) {
  kernels::rms_norm(ctx, x, dim, weight.data(), y, dim, num_rows, dim, eps);
  kernels::round_to_bf16(y, num_rows * dim);
}

AttentionKind DecoderLayer::attention_kind() const {
  if (kda != nullptr) return AttentionKind::kKda;
  return indexer != nullptr ? AttentionKind::kMlaDsa : AttentionKind::kMla;
}

FfnKind DecoderLayer::ffn_kind() const {
  if (moe == nullptr) return FfnKind::kDenseMlp;
  return moe->weights().latent_down_proj ? FfnKind::kLatentMoe : FfnKind::kMoe;
}

LayerCacheSpec DecoderLayer::cache_spec(kernels::KvCacheDtype kv_cache_dtype) const {
  LayerCacheSpec spec;
  if (kda != nullptr) {
    const KdaConfig& c = kda->config();
    spec.kda = KdaStateLayout{
        .num_heads = c.num_heads, .head_dim = c.head_dim, .conv_width = c.conv_width};
    return spec;
  }
  const MlaConfig& c = mla->config();
  spec.mla = {
      .latent_dim = c.kv_lora_rank, .rope_dim = c.qk_rope_head_dim, .dtype = kv_cache_dtype};
  if (indexer != nullptr) spec.index_key_dim = indexer->config().index_head_dim;
  return spec;
}

size_t DecoderLayer::scratch_bytes(const ExecContext& ctx, int64_t max_tokens,
                                   int64_t max_range) const {
  size_t bytes = 0;
  if (kda != nullptr) bytes = std::max(bytes, kda->scratch_bytes(ctx, max_tokens));
  if (mla != nullptr) {
    const int64_t width = indexer != nullptr ? indexer->config().index_topk : 0;
    bytes = std::max(bytes, mla->scratch_bytes(ctx, max_tokens, width));
  }
  if (indexer != nullptr)
    bytes = std::max(bytes, indexer->scratch_bytes(ctx, max_tokens, max_range));
  if (moe != nullptr) bytes = std::max(bytes, moe->scratch_bytes(max_tokens));
  if (dense_mlp) bytes = std::max(bytes, gated_mlp_scratch_bytes(*dense_mlp, max_tokens));
  return bytes;
}

void DecoderLayer::attention_norm(const ExecContext& ctx, const float* h, int64_t num_tokens,
                                  float* normed) const {
  rms_norm_bf16(ctx, h, input_layernorm, normed, num_tokens, hidden_size, norm_eps);
}

void DecoderLayer::ffn_norm(const ExecContext& ctx, const float* h, int64_t num_tokens,
                            float* normed) const {
  rms_norm_bf16(ctx, h, post_attention_layernorm, normed, num_tokens, hidden_size, norm_eps);
}

void DecoderLayer::attention(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                             const float* normed, float* out, Arena& scratch, TapSink* taps) const {
  const int64_t T = batch.num_tokens();
  scratch.reset();
  auto start = std::chrono::steady_clock::now();
  if (kda != nullptr) {
    kda->forward(ctx, batch, normed, cache.kda_layer(layer_id), out, scratch, taps, layer_id);
    mixer_seconds().kda += seconds_since(start);
    if (kda->config().output_is_partial) sum_partial_output(out, T, taps);
    return;
  }
  DZ_CHECK(mla != nullptr, "layer {} has no token mixer", layer_id);
  const int64_t r_q = mla->config().q_lora_rank;
  std::vector<float> c_q(static_cast<size_t>(T * r_q));  // [T, r_q]
  if (r_q > 0) {
    mla->q_latent(ctx, normed, T, c_q.data());
    tap(taps, layer_id, "q_latent", c_q.data(), {T, r_q});
    if (const float* given = substitute(taps, layer_id, "q_latent", {T, r_q}))
      std::copy(given, given + T * r_q, c_q.begin());
  }
  TokenSelection attend;
  std::vector<int32_t> selection;
  if (indexer != nullptr) {
    // The indexer always runs: it fills the index cache for later tokens (docs/models.md §3.6).
    const int64_t K = indexer->config().index_topk;
    selection.resize(static_cast<size_t>(T * K));  // [T, K], −1 padded
    indexer->select(ctx, batch, normed, c_q.data(), cache.index_layer(layer_id), selection, scratch,
                    taps, layer_id);  // taps "index_selection"
    mixer_seconds().indexer += seconds_since(start);
    if (const float* given = substitute(taps, layer_id, "index_selection", {T, K}))
      for (size_t i = 0; i < selection.size(); ++i) selection[i] = static_cast<int32_t>(given[i]);
    scratch.reset();
    // While every token sees at most K positions the selection is the whole causal prefix
    // (docs/models.md §3.3), so dense attention is the same set and cheaper.
    const bool sparse = std::any_of(batch.positions.begin(), batch.positions.end(),
                                    [K](int32_t pos) { return pos + 1 > K; });
    if (sparse) attend = TokenSelection{.positions = selection, .width = K};
  }
  start = std::chrono::steady_clock::now();
  mla->forward(ctx, batch, normed, r_q > 0 ? c_q.data() : nullptr, cache.mla_layer(layer_id),
               attend, out, scratch, taps, layer_id);  // rounded BF16, taps "attn_out"
  mixer_seconds().mla += seconds_since(start);
  if (mla->config().output_is_partial) sum_partial_output(out, T, taps);
}

void DecoderLayer::sum_partial_output(float* out, int64_t num_tokens, TapSink* taps) const {
  comm->all_reduce_sum(std::span(out, static_cast<size_t>(num_tokens * hidden_size)), layer_id);
  kernels::round_to_bf16(out, num_tokens * hidden_size);
  tap(taps, layer_id, "attn_out", out, {num_tokens, hidden_size});
}

void DecoderLayer::ffn(const ExecContext& ctx, const float* normed, int64_t num_tokens, float* out,
                       Arena& scratch, TapSink* taps) const {
  scratch.reset();
  if (moe != nullptr)
    moe->forward(ctx, normed, num_tokens, out, scratch, taps, layer_id);
  else
    gated_mlp_forward(ctx, *dense_mlp, dense_activation, normed, num_tokens, out, scratch);
  // Under a plan the output is this rank's columns and experts: summed over the ranks first.
  if (comm != nullptr && comm->size() > 1)
    comm->all_reduce_sum(std::span(out, static_cast<size_t>(num_tokens * hidden_size)), layer_id);
  kernels::round_to_bf16(out, num_tokens * hidden_size);
  tap(taps, layer_id, "ffn_out", out, {num_tokens, hidden_size});
}

void DecoderLayer::ffn_without_tokens(const ExecContext& ctx, Arena& scratch) const {
  scratch.reset();
  if (moe != nullptr) moe->forward(ctx, nullptr, 0, nullptr, scratch, nullptr, layer_id);
}

std::string decoder_layer_prefix(int layer_id) {
  return fmt::format("model.layers.{}.", layer_id);
}

void visit_decoder_layer_tensors(TensorVisitor& v, const DecoderLayerConfig& c,
                                 DecoderLayerWeights& w) {
  using Scope = TensorVisitor::Scope;
  const int64_t d = c.hidden_size;
  const LayerSpec& spec = c.spec;
  Scope layer(v, {.prefix = decoder_layer_prefix(spec.layer_id),
                  .component = Component::kNorms,
                  .layer_id = spec.layer_id,
                  .is_mtp = spec.is_mtp});
  v.floats("input_layernorm.weight", {d}, DType::kBF16, Split::kReplicated, w.input_layernorm);
  v.floats("post_attention_layernorm.weight", {d}, DType::kBF16, Split::kReplicated,
           w.post_attention_layernorm);
  if (spec.attn_res) {
    Scope res(v, {.component = Component::kAttnRes});
    visit_attn_res_tensors(v, "self_attention_res", d, w.attn_res);
    visit_attn_res_tensors(v, "mlp_res", d, w.ffn_res);
  }
  {
    Scope attention(v, {.prefix = "self_attn."});
    if (spec.attention == AttentionKind::kKda) {
      Scope kda(v, {.component = Component::kKda});
      visit_kda_tensors(v, *c.kda, w.kda);
    } else {
      Scope mla(v, {.component = Component::kAttention});
      visit_mla_tensors(v, *c.mla, w.mla);
      if (spec.attention == AttentionKind::kMlaDsa) {
        Scope indexer(v, {.prefix = "indexer.", .component = Component::kIndexer});
        visit_dsa_indexer_tensors(v, *c.indexer, w.indexer);
      }
    }
  }
  if (spec.ffn == FfnKind::kDenseMlp) {
    Scope mlp(v, {.prefix = "mlp.", .component = Component::kDenseMlp});
    visit_gated_mlp_tensors(v, kProjNames, c.dense_intermediate_size, d, MlpSplit::kTensorParallel,
                            w.dense_mlp);
  } else {
    Scope moe(v, {.prefix = c.moe_prefix});
    visit_moe_tensors(v, *c.moe, w.moe);
  }
}

DecoderLayer make_decoder_layer(const DecoderLayerConfig& c, DecoderLayerWeights w,
                                const RankShard& shard, dist::Comm* tp_comm,
                                dist::Comm* expert_comm) {
  const LayerSpec& spec = c.spec;
  const bool split = shard.tp > 1;  // heads, columns and (at --ep 1) experts over the TP group
  DZ_CHECK(!split || (tp_comm != nullptr && tp_comm->size() == shard.tp),
           "layer {}: tp {} needs its TP group", spec.layer_id, shard.tp);
  DZ_CHECK((shard.expert_ranks > shard.tp) == (expert_comm != nullptr),
           "layer {}: experts over {} ranks need the expert ranks' communicator", spec.layer_id,
           shard.expert_ranks);
  DecoderLayer layer;
  layer.comm = split ? tp_comm : nullptr;
  layer.layer_id = spec.layer_id;
  layer.hidden_size = c.hidden_size;
  layer.norm_eps = c.norm_eps;
  layer.input_layernorm = std::move(w.input_layernorm);
  layer.post_attention_layernorm = std::move(w.post_attention_layernorm);
  if (spec.attn_res) {
    layer.attn_res_query = attn_res_folded_query(w.attn_res.proj, w.attn_res.norm);
    layer.ffn_res_query = attn_res_folded_query(w.ffn_res.proj, w.ffn_res.norm);
    layer.attn_res_write = spec.attn_res_write;
  }
  if (spec.attention == AttentionKind::kKda) {
    KdaConfig kda = *c.kda;
    if (shard.tp > 1) {  // this rank's heads; their states stay on this rank
      kda.num_heads /= shard.tp;
      kda.head_offset = kda.num_heads * shard.tp_rank;
      kda.output_is_partial = true;
    }
    layer.kda = std::make_unique<KdaBlock>(kda, std::move(w.kda));
  } else {
    MlaConfig mla = *c.mla;
    if (shard.tp > 1) {
      mla.num_heads /= shard.tp;  // this rank's heads (validate_plan checked the division)
      mla.output_is_partial = true;
    }
    layer.mla = std::make_unique<MlaBlock>(mla, std::move(w.mla));
    if (spec.attention == AttentionKind::kMlaDsa)
      layer.indexer = std::make_unique<DsaIndexer>(*c.indexer, std::move(w.indexer));
  }
  if (spec.ffn == FfnKind::kDenseMlp) {
    layer.dense_mlp = std::move(w.dense_mlp);
    layer.dense_activation = c.dense_activation;
  } else {
    MoeConfig moe = *c.moe;
    moe.output_is_partial = split;
    if (split && spec.ffn == FfnKind::kLatentMoe) moe.latent_comm = tp_comm;
    moe.expert_comm = expert_comm;
    moe.token_share = {.index = shard.tp_rank, .count = shard.tp};
    layer.moe = std::make_unique<MoeBlock>(moe, std::move(w.moe));
  }
  return layer;
}

}  // namespace dz::model
