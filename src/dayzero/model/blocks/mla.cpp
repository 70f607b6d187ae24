// MLA block, docs/models.md §2 with the numerics policy of issue 3: every linear output and norm
// output rounded to BF16, k_pe and q_pe rounded after RoPE, c_kv cached (fp8 round trip or bf16)
// and read back by both attention forms, scores/softmax FP32, per-head output rounded to BF16
// before o_proj.
#include "dayzero/model/blocks/mla.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/mla_absorb.h"
#include "dayzero/kernels/mla_attention.h"
#include "dayzero/kernels/norms.h"
#include "dayzero/model/context_parallel.h"

namespace dz::model {
namespace {

// Keys the prefill form up-projects together (mla_attention.cpp's kKeyBlock): with a selection
// it up-projects every block some query selected from, whole.
constexpr int64_t kPrefillKeyBlock = 64;
// The prefill form holds per-query state [H, d_v + 2]; longer sequences run in query chunks of
// this many tokens (each chunk up-projects its key range once).
constexpr int64_t kPrefillQueryChunk = 1024;

// FP32 buffers of forward(): q, kv, o, the gate, q_abs and o_lat (one query chunk).
int64_t buffer_floats(const MlaConfig& c, int64_t num_tokens) {
  const int64_t H = c.num_heads, chunk = std::min(num_tokens, kPrefillQueryChunk);
  return num_tokens * (H * (c.qk_nope_head_dim + c.qk_rope_head_dim) + c.kv_lora_rank +
                       c.qk_rope_head_dim + H * c.v_head_dim * (c.output_gate ? 2 : 1)) +
         2 * chunk * H * c.kv_lora_rank;
}

// Workspace of the attention kernels for one query chunk of either form.
size_t attention_workspace_bytes(const ExecContext& ctx, const MlaConfig& c, int64_t num_tokens,
                                 int64_t selection_width) {
  const kernels::MlaCacheLayout layout{.latent_dim = c.kv_lora_rank,
                                       .rope_dim = c.qk_rope_head_dim};
  const int64_t chunk = std::min(num_tokens, kPrefillQueryChunk);
  std::vector<int32_t> positions(static_cast<size_t>(chunk));
  const kernels::MlaQueryKeys keys{
      .positions = positions, .selection = {}, .selection_width = selection_width};
  return std::max(kernels::mla_absorbed_workspace_bytes(ctx, layout, chunk, c.num_heads),
                  kernels::mla_prefill_workspace_bytes(ctx, layout, keys, c.num_heads,
                                                       c.qk_nope_head_dim, c.v_head_dim));
}

}  // namespace

MlaFormFlops mla_form_flops(const MlaConfig& c, const kernels::MlaQueryKeys& keys) {
  const double H = static_cast<double>(c.num_heads), r_kv = static_cast<double>(c.kv_lora_rank);
  const double d_n = static_cast<double>(c.qk_nope_head_dim);
  const double d_r = static_cast<double>(c.qk_rope_head_dim),
               d_v = static_cast<double>(c.v_head_dim);
  const int64_t n = keys.num_queries();
  // (query, key) pairs and the keys the prefill form up-projects.
  int64_t pairs = 0, up_keys = 0;
  if (keys.selection_width == 0) {
    int64_t key_end = 0;
    for (int32_t pos : keys.positions) {
      pairs += int64_t{pos} + 1;
      key_end = std::max<int64_t>(key_end, int64_t{pos} + 1);
    }
    up_keys = key_end;
  } else {
    int64_t key_end = 0;
    for (int32_t pos : keys.selection) {
      if (pos < 0) continue;
      ++pairs;
      key_end = std::max<int64_t>(key_end, int64_t{pos} + 1);
    }
    std::vector<char> needed(
        static_cast<size_t>((key_end + kPrefillKeyBlock - 1) / kPrefillKeyBlock));
    for (int32_t pos : keys.selection)
      if (pos >= 0) needed[static_cast<size_t>(pos / kPrefillKeyBlock)] = 1;
    for (size_t b = 0; b < needed.size(); ++b)
      if (needed[b])
        up_keys += std::min<int64_t>(kPrefillKeyBlock,
                                     key_end - static_cast<int64_t>(b) * kPrefillKeyBlock);
  }
  // W_UK and W_UV applied once per query (absorbed: q_abs and o) or once per key (prefill: k_nope
  // and v): the same 2·H·r_kv·(d_n + d_v) each. Per pair: scores over d_n + d_r (prefill) or
  // r_kv + d_r (absorbed), values over d_v or r_kv, 2 FLOPs per MAC.
  const double projection = 2 * H * r_kv * (d_n + d_v);
  return {.absorbed = static_cast<double>(n) * projection +
                      static_cast<double>(pairs) * 2 * H * (2 * r_kv + d_r),
          .prefill = static_cast<double>(up_keys) * projection +
                     static_cast<double>(pairs) * 2 * H * (d_n + d_r + d_v)};
}

void visit_mla_tensors(TensorVisitor& v, const MlaConfig& c, MlaWeights& w) {
  const int64_t d = c.hidden_size, H = c.num_heads;
  const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
  constexpr auto kYes = Quantizable::kYes;
  if (c.q_lora_rank > 0) {
    v.linear("q_a_proj", c.q_lora_rank, d, Split::kReplicated, kYes, w.q_a_proj.emplace());
    v.floats("q_a_layernorm.weight", {c.q_lora_rank}, DType::kBF16, Split::kReplicated,
             w.q_a_layernorm);
    v.linear("q_b_proj", H * qk_head, c.q_lora_rank, Split::kColumn, kYes, w.q_b_proj);
  } else {
    v.linear("q_proj", H * qk_head, d, Split::kColumn, kYes, w.q_b_proj);
  }
  v.linear("kv_a_proj_with_mqa", c.kv_lora_rank + c.qk_rope_head_dim, d, Split::kReplicated, kYes,
           w.kv_a_proj_with_mqa);
  v.floats("kv_a_layernorm.weight", {c.kv_lora_rank}, DType::kBF16, Split::kReplicated,
           w.kv_a_layernorm);
  v.linear("kv_b_proj", H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, Split::kColumn,
           kYes, w.kv_b_proj);
  if (c.output_gate)
    v.linear("g_proj", H * c.v_head_dim, d, Split::kColumn, kYes, w.g_proj.emplace());
  v.linear("o_proj", d, H * c.v_head_dim, Split::kRow, kYes, w.o_proj);
}

MlaBlock::MlaBlock(MlaConfig config, MlaWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  const MlaConfig& c = config_;
  const int64_t H = c.num_heads, d_n = c.qk_nope_head_dim, d_v = c.v_head_dim;
  const int64_t r_kv = c.kv_lora_rank;
  DZ_CHECK(weights_.kv_b_proj.out_features() == H * (d_n + d_v) &&
               weights_.kv_b_proj.in_features() == r_kv,
           "kv_b_proj is [{}, {}], want [{}, {}]", weights_.kv_b_proj.out_features(),
           weights_.kv_b_proj.in_features(), H * (d_n + d_v), r_kv);
  DZ_CHECK((c.q_lora_rank > 0) == weights_.q_a_proj.has_value(), "q_lora_rank {} but q_a_proj {}",
           c.q_lora_rank, weights_.q_a_proj ? "present" : "absent");
  DZ_CHECK(c.output_gate == weights_.g_proj.has_value(), "output_gate {} but g_proj {}",
           c.output_gate, weights_.g_proj ? "present" : "absent");
  DZ_CHECK(!c.rope || c.rope->rope_dim == c.qk_rope_head_dim, "rope_dim {} vs qk_rope_head_dim {}",
           c.rope ? c.rope->rope_dim : 0, c.qk_rope_head_dim);
  // kv_b_proj viewed as [H, d_n + d_v, r_kv]; both forms use its BF16 dequantization (§2.3), so
  // that they compute the same function, and keep it as BF16 codes.
  std::vector<float> kv_b(static_cast<size_t>(H * (d_n + d_v) * r_kv));
  weights_.kv_b_proj.dequantize(kv_b.data());
  w_uk_ = AlignedBuffer::for_weights(static_cast<size_t>(H * d_n * r_kv) * sizeof(uint16_t));
  w_uv_ = AlignedBuffer::for_weights(static_cast<size_t>(H * d_v * r_kv) * sizeof(uint16_t));
  auto* w_uk_codes = reinterpret_cast<uint16_t*>(w_uk_.data());
  auto* w_uv_codes = reinterpret_cast<uint16_t*>(w_uv_.data());
  for (int64_t h = 0; h < H; ++h) {
    const float* head = kv_b.data() + h * (d_n + d_v) * r_kv;
    for (int64_t e = 0; e < d_n * r_kv; ++e)
      w_uk_codes[h * d_n * r_kv + e] = formats::encode_bf16(head[e]);
    for (int64_t e = 0; e < d_v * r_kv; ++e)
      w_uv_codes[h * d_v * r_kv + e] = formats::encode_bf16(head[d_n * r_kv + e]);
  }
}

void MlaBlock::q_latent(const ExecContext& ctx, const float* x, int64_t num_tokens,
                        float* c_q) const {
  DZ_CHECK(config_.q_lora_rank > 0, "q_latent needs q LoRA");
  const int64_t r_q = config_.q_lora_rank;
  weights_.q_a_proj->forward(ctx, x, num_tokens, c_q);
  kernels::round_to_bf16(c_q, num_tokens * r_q);
  kernels::rms_norm(ctx, c_q, r_q, weights_.q_a_layernorm.data(), c_q, r_q, num_tokens, r_q,
                    config_.q_norm_eps);
  kernels::round_to_bf16(c_q, num_tokens * r_q);
}

size_t MlaBlock::scratch_bytes(const ExecContext& ctx, int64_t max_tokens,
                               int64_t max_selection_width) const {
  return static_cast<size_t>(buffer_floats(config_, max_tokens)) * 4 + 8 * kBufferAlignment +
         attention_workspace_bytes(ctx, config_, max_tokens, max_selection_width);
}

void MlaBlock::forward(const ExecContext& ctx, const ForwardBatch& batch, const float* x,
                       const float* c_q, const MlaLayerCache& cache,
                       const TokenSelection& selection, float* out, Arena& scratch, TapSink* taps,
                       int layer_id) const {
  const MlaConfig& c = config_;
  const int64_t T = batch.num_tokens(), H = c.num_heads;
  const int64_t d_n = c.qk_nope_head_dim, d_r = c.qk_rope_head_dim, d_v = c.v_head_dim;
  const int64_t r_kv = c.kv_lora_rank, q_width = d_n + d_r;
  DZ_CHECK(cache.layout.latent_dim == r_kv && cache.layout.rope_dim == d_r,
           "cache records {} + {}, block wants {} + {}", cache.layout.latent_dim,
           cache.layout.rope_dim, r_kv, d_r);
  DZ_CHECK((c.q_lora_rank > 0) == (c_q != nullptr), "c_q must be given exactly with q LoRA");
  if (T == 0) return;

  // q [T, H, d_n + d_r] from c_q (q LoRA) or x (q_proj); kv [T, r_kv + d_r] = [c_raw ; k_raw].
  float* q = scratch.allocate_floats(T * H * q_width);
  weights_.q_b_proj.forward(ctx, c.q_lora_rank > 0 ? c_q : x, T, q);
  kernels::round_to_bf16(q, T * H * q_width);
  float* kv = scratch.allocate_floats(T * (r_kv + d_r));
  weights_.kv_a_proj_with_mqa.forward(ctx, x, T, kv);
  kernels::round_to_bf16(kv, T * (r_kv + d_r));
  // c_kv = RMSNorm(c_raw) in place; the rope part is not normalized.
  kernels::rms_norm(ctx, kv, r_kv + d_r, weights_.kv_a_layernorm.data(), kv, r_kv + d_r, T, r_kv,
                    c.kv_norm_eps);
  for (int64_t t = 0; t < T; ++t) kernels::round_to_bf16(kv + t * (r_kv + d_r), r_kv);
  if (c.rope) {  // interleaved (DeepSeek MLA); NoPE models leave both parts unrotated
    kernels::apply_rope(ctx, *c.rope, kernels::RopeLayout::kInterleaved, batch.positions, q + d_n,
                        H * q_width, H, q_width);
    kernels::apply_rope(ctx, *c.rope, kernels::RopeLayout::kInterleaved, batch.positions, kv + r_kv,
                        r_kv + d_r, 1, 0);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) kernels::round_to_bf16(q + (t * H + h) * q_width + d_n, d_r);
      kernels::round_to_bf16(kv + t * (r_kv + d_r) + r_kv, d_r);
    }
  }
  // Every token's record first, so that each query reads its own key back from the cache.
  const ContextSplit* split = batch.context;
  std::vector<std::byte> fresh;  // context parallelism: every local token's record
  if (split != nullptr) fresh.resize(static_cast<size_t>(T * cache.layout.record_bytes()));
  for (int64_t t = 0; t < T; ++t) {
    const float* row = kv + t * (r_kv + d_r);
    if (split != nullptr) kernels::write_mla_record(cache.layout, fresh.data(), t, row, row + r_kv);
    int64_t slot = batch.slot_mapping[static_cast<size_t>(t)];
    if (slot >= 0 && split != nullptr) slot = split->shard().stored_slot(slot, batch.block_size);
    if (slot < 0) continue;  // −1: a padding token (docs/formats.md §5.1) or another CP rank's
    kernels::write_mla_record(cache.layout, cache.pool, slot, row, row + r_kv);
  }
  // Context parallelism: the pieces attend over their sequence's whole history.
  const ContextSplit::History history =
      split != nullptr ? split->mla_history(cache.layout, cache.pool, fresh, layer_id)
                       : ContextSplit::History{};

  float* o = scratch.allocate_floats(T * H * d_v);  // [T, H, d_v]
  float* q_abs = scratch.allocate_floats(std::min(T, kPrefillQueryChunk) * H * r_kv);
  float* o_lat = scratch.allocate_floats(std::min(T, kPrefillQueryChunk) * H * r_kv);
  std::span<std::byte> workspace =
      scratch.allocate(attention_workspace_bytes(ctx, c, T, selection.width));

  // The absorbed form runs in groups of consecutive tokens (the decode rows of many sequences,
  // at most kPrefillQueryChunk, the size of q_abs and o_lat): q_abs = W_UKᵀ q_nope for the whole
  // group, attention per sequence, then o = W_UV o_lat for the whole group, so that each head's
  // W_UK / W_UV block is read once per group rather than once per token (§2.3, FP32).
  struct AbsorbedPiece {
    kernels::MlaCacheView view;
    kernels::MlaQueryKeys keys;
    int64_t t0 = 0;
  };
  const kernels::MlaAbsorbDims absorb_dims{
      .num_heads = H, .nope_dim = d_n, .latent_dim = r_kv, .v_dim = d_v};
  std::vector<AbsorbedPiece> group;
  group.reserve(batch.sequences.size());
  int64_t group_begin = 0, group_tokens = 0;
  const auto flush_group = [&] {
    if (group_tokens == 0) return;
    kernels::mla_absorb_q(ctx, absorb_dims,
                          {.q_nope = q + group_begin * H * q_width,
                           .token_stride = H * q_width,
                           .head_stride = q_width,
                           .w_uk = w_uk(),
                           .q_abs = q_abs},
                          group_tokens);
    for (const AbsorbedPiece& piece : group) {
      const int64_t offset = (piece.t0 - group_begin) * H * r_kv;
      kernels::mla_attention_absorbed(ctx, piece.view, piece.keys,
                                      {.num_heads = H,
                                       .softmax_scale = c.softmax_scale,
                                       .q_abs = q_abs + offset,
                                       .q_pe = q + piece.t0 * H * q_width + d_n,
                                       .q_pe_token_stride = H * q_width,
                                       .q_pe_head_stride = q_width,
                                       .o_lat = o_lat + offset},
                                      workspace);
    }
    kernels::mla_expand_o(ctx, absorb_dims,
                          {.o_lat = o_lat, .w_uv = w_uv(), .o = o + group_begin * H * d_v},
                          group_tokens);
    group.clear();
    group_tokens = 0;
  };

  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& seq = batch.sequences[i];
    kernels::MlaCacheView view{.layout = cache.layout,
                               .pool = cache.pool,
                               .block_size = batch.block_size,
                               .block_table = seq.block_table};
    if (split != nullptr) {
      const std::optional<ContextPiece> piece = split->piece_of_slice(i);
      if (!piece) continue;  // a whole sequence: attend_sharded below
      view.pool = history.pool;
      view.block_table = history.tables[static_cast<size_t>(piece->sequence)];
    }
    for (int64_t chunk = 0; chunk < seq.num_tokens; chunk += kPrefillQueryChunk) {
      const int64_t t0 = seq.token_begin + chunk;
      const int64_t n = std::min(kPrefillQueryChunk, seq.num_tokens - chunk);
      kernels::MlaQueryKeys keys{
          .positions = batch.positions.subspan(static_cast<size_t>(t0), static_cast<size_t>(n)),
          .selection = {},
          .selection_width = 0};
      if (selection.width > 0) {
        keys.selection = selection.positions.subspan(static_cast<size_t>(t0 * selection.width),
                                                     static_cast<size_t>(n * selection.width));
        keys.selection_width = selection.width;
      }
      // The form with fewer FLOPs for this chunk (mla_form_flops): the absorbed one for decode
      // rows and short chunks over a long cached range, the prefill form for long fresh chunks.
      const MlaFormFlops flops = mla_form_flops(c, keys);
      if (flops.prefill < flops.absorbed) {
        kernels::mla_attention_prefill(ctx, view, keys,
                                       {.num_heads = H,
                                        .nope_dim = d_n,
                                        .v_dim = d_v,
                                        .softmax_scale = c.softmax_scale,
                                        .q_nope = q + t0 * H * q_width,
                                        .q_pe = q + t0 * H * q_width + d_n,
                                        .q_token_stride = H * q_width,
                                        .q_head_stride = q_width,
                                        .w_uk = w_uk(),
                                        .w_uv = w_uv(),
                                        .out = o + t0 * H * d_v},
                                       workspace);
        continue;
      }
      if (group_tokens > 0 &&
          (t0 != group_begin + group_tokens || group_tokens + n > kPrefillQueryChunk))
        flush_group();
      if (group_tokens == 0) group_begin = t0;
      group.push_back({.view = view, .keys = keys, .t0 = t0});
      group_tokens += n;
    }
  }
  flush_group();
  if (split != nullptr) attend_sharded(ctx, batch, q, cache, selection, o, workspace, layer_id);

  if (c.output_gate) {  // K3: o_h ⊙ σ(Linear(x; g_proj))_h, the gate logits rounded like any linear
    float* gate = scratch.allocate_floats(T * H * d_v);
    weights_.g_proj->forward(ctx, x, T, gate);
    kernels::round_to_bf16(gate, T * H * d_v);
    for (int64_t i = 0; i < T * H * d_v; ++i) o[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  }
  kernels::round_to_bf16(o, T * H * d_v);
  weights_.o_proj.forward(ctx, o, T, out);
  if (c.output_is_partial) return;
  kernels::round_to_bf16(out, T * c.hidden_size);
  tap(taps, layer_id, "attn_out", out, Shape{T, c.hidden_size});
}

void MlaBlock::attend_sharded(const ExecContext& ctx, const ForwardBatch& batch, const float* q,
                              const MlaLayerCache& cache, const TokenSelection& selection, float* o,
                              std::span<std::byte> workspace, int layer_id) const {
  const ContextSplit& split = *batch.context;
  const MlaConfig& c = config_;
  const int64_t H = c.num_heads, r_kv = c.kv_lora_rank, d_n = c.qk_nope_head_dim;
  const int64_t d_v = c.v_head_dim, q_width = d_n + c.qk_rope_head_dim;
  std::vector<std::pair<size_t, int64_t>> rows;  // (slice, local token) of every sharded row
  for (size_t i = 0; i < batch.sequences.size(); ++i)
    if (split.shards_keys(i))
      for (int64_t t = 0; t < batch.sequences[i].num_tokens; ++t)
        rows.emplace_back(i, batch.sequences[i].token_begin + t);
  if (rows.empty()) return;
  const auto R = static_cast<int64_t>(rows.size());
  const kernels::MlaAbsorbDims dims{
      .num_heads = H, .nope_dim = d_n, .latent_dim = r_kv, .v_dim = d_v};
  // This rank's partial of every row over the keys it owns: o_lat [R, H, r_kv], then lse [R, H]
  // (−inf: no owned key, weight 0 in the merge).
  std::vector<float> partial(static_cast<size_t>(R * H * (r_kv + 1)), 0.0f);
  float* lse = partial.data() + R * H * r_kv;
  std::fill_n(lse, R * H, -std::numeric_limits<float>::infinity());
  std::vector<float> q_abs(static_cast<size_t>(H * r_kv));
  std::vector<int32_t> keys, stored_table;
  for (int64_t r = 0; r < R; ++r) {
    const auto [slice, t] = rows[static_cast<size_t>(r)];
    const SequenceSlice& seq = batch.sequences[slice];
    const int32_t pos = batch.positions[static_cast<size_t>(t)];
    keys.clear();
    if (selection.width > 0) {
      for (int32_t p : selection.positions.subspan(static_cast<size_t>(t * selection.width),
                                                   static_cast<size_t>(selection.width)))
        if (p >= 0 && split.owns_key(seq.block_table, p)) keys.push_back(p);
    } else {
      for (int32_t p = 0; p <= pos; ++p)
        if (split.owns_key(seq.block_table, p)) keys.push_back(p);
    }
    if (keys.empty()) continue;
    stored_table = split.shard().stored_table(seq.block_table);
    kernels::mla_absorb_q(ctx, dims,
                          {.q_nope = q + t * H * q_width,
                           .token_stride = H * q_width,
                           .head_stride = q_width,
                           .w_uk = w_uk(),
                           .q_abs = q_abs.data()},
                          1);
    const kernels::MlaCacheView view{.layout = cache.layout,
                                     .pool = cache.pool,
                                     .block_size = batch.block_size,
                                     .block_table = stored_table};
    kernels::mla_attention_absorbed(ctx, view,
                                    {.positions = std::span(&pos, 1),
                                     .selection = keys,
                                     .selection_width = static_cast<int64_t>(keys.size())},
                                    {.num_heads = H,
                                     .softmax_scale = c.softmax_scale,
                                     .q_abs = q_abs.data(),
                                     .q_pe = q + t * H * q_width + d_n,
                                     .q_pe_token_stride = H * q_width,
                                     .q_pe_head_stride = q_width,
                                     .o_lat = partial.data() + r * H * r_kv,
                                     .lse = lse + r * H},
                                    workspace);
  }
  // The ranks' partials merged by log-sum-exp, in rank order (the same bits on every rank):
  // o = Σ_k e^(lse_k − lse*)·o_k with lse* = log Σ_k e^(lse_k).
  const std::vector<std::byte> all =
      split.gather_equal(std::as_bytes(std::span(partial)), layer_id);
  const auto* every = reinterpret_cast<const float*>(all.data());
  const int64_t per_rank = R * H * (r_kv + 1);
  std::vector<float> merged(static_cast<size_t>(H * r_kv));
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t h = 0; h < H; ++h) {
      float max_lse = -std::numeric_limits<float>::infinity();
      for (int k = 0; k < split.ranks(); ++k)
        max_lse = std::max(max_lse, every[k * per_rank + R * H * r_kv + r * H + h]);
      float total = 0;
      float* out = merged.data() + h * r_kv;
      std::fill_n(out, r_kv, 0.0f);
      for (int k = 0; k < split.ranks(); ++k) {
        const float lse_k = every[k * per_rank + R * H * r_kv + r * H + h];
        if (lse_k == -std::numeric_limits<float>::infinity()) continue;
        const float weight = std::exp(lse_k - max_lse);
        total += weight;
        const float* o_k = every + k * per_rank + (r * H + h) * r_kv;
        for (int64_t i = 0; i < r_kv; ++i) out[i] += weight * o_k[i];
      }
      for (int64_t i = 0; i < r_kv; ++i) out[i] /= total;
    }
    kernels::mla_expand_o(ctx, dims,
                          {.o_lat = merged.data(),
                           .w_uv = w_uv(),
                           .o = o + rows[static_cast<size_t>(r)].second * H * d_v},
                          1);
  }
}

}  // namespace dz::model
