#include "dayzero/model/decoder_layer.h"

#include <algorithm>

#include "dayzero/core/check.h"
#include "dayzero/kernels/lightning_indexer.h"
#include "dayzero/kernels/norms.h"

namespace dz::model {
namespace {

// y = round_bf16(RMSNorm(x)) over num_rows rows of width dim (models.md §1.1: FP32, rounded once).
void rms_norm_bf16(const ExecContext& ctx, const float* x, const std::vector<float>& weight,
                   float* y, int64_t num_rows, int64_t dim, float eps) {
  kernels::rms_norm(ctx, x, dim, weight.data(), y, dim, num_rows, dim, eps);
  kernels::round_to_bf16(y, num_rows * dim);
}

// The indexer has no scratch_bytes(): its q, k, codes, scales and head weights, the tapped score
// and selection rows, each allocation padded to 64 bytes, plus the kernel's own workspace bound
// (per thread one scored row of every visible key, or the AVX-512 tiles and heaps).
size_t indexer_scratch_bytes(const ExecContext& ctx, const DsaIndexerConfig& c, int64_t max_tokens,
                             int64_t max_range) {
  const int64_t n_i = c.index_n_heads, d_i = c.index_head_dim, K = c.index_topk;
  const int64_t floats = max_tokens * (n_i * d_i * 2 + d_i * 2 + n_i * 3 + 2 + 2 * K);
  return static_cast<size_t>(floats) * 4 + 64 * 16 +
         kernels::lightning_indexer_workspace_bound(ctx, n_i, d_i, max_range, K) + 64;
}

}  // namespace

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
    bytes = std::max(bytes, indexer_scratch_bytes(ctx, indexer->config(), max_tokens, max_range));
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
  if (kda != nullptr) {
    kda->forward(ctx, batch, normed, cache.kda_layer(layer_id), out, scratch, taps, layer_id);
    return;
  }
  DZ_CHECK(mla != nullptr, "layer {} has no token mixer", layer_id);
  const int64_t r_q = mla->config().q_lora_rank;
  std::vector<float> c_q(static_cast<size_t>(T * r_q));  // [T, r_q]
  if (r_q > 0) {
    mla->q_latent(ctx, normed, T, c_q.data());
    tap(taps, layer_id, "q_latent", c_q.data(), {T, r_q});
  }
  TokenSelection attend;
  std::vector<int32_t> selection;
  if (indexer != nullptr) {
    // The indexer always runs: it fills the index cache for later tokens (models.md §3.6).
    const int64_t K = indexer->config().index_topk;
    selection.resize(static_cast<size_t>(T * K));  // [T, K], −1 padded
    indexer->select(ctx, batch, normed, c_q.data(), cache.index_layer(layer_id), selection, scratch,
                    taps, layer_id);  // taps "index_selection"
    scratch.reset();
    // While every token sees at most K positions the selection is the whole causal prefix
    // (models.md §3.3), so dense attention is the same set and cheaper.
    const bool sparse = std::any_of(batch.positions.begin(), batch.positions.end(),
                                    [K](int32_t pos) { return pos + 1 > K; });
    if (sparse) attend = TokenSelection{.positions = selection, .width = K};
  }
  mla->forward(ctx, batch, normed, r_q > 0 ? c_q.data() : nullptr, cache.mla_layer(layer_id),
               attend, out, scratch, taps, layer_id);  // rounded BF16, taps "attn_out"
}

void DecoderLayer::ffn(const ExecContext& ctx, const float* normed, int64_t num_tokens, float* out,
                       Arena& scratch, TapSink* taps) const {
  scratch.reset();
  if (moe != nullptr)
    moe->forward(ctx, normed, num_tokens, out, scratch, taps, layer_id);
  else
    gated_mlp_forward(ctx, *dense_mlp, dense_activation, normed, num_tokens, out, scratch);
  kernels::round_to_bf16(out, num_tokens * hidden_size);
  tap(taps, layer_id, "ffn_out", out, {num_tokens, hidden_size});
}

}  // namespace dz::model
