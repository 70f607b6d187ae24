// DSA lightning indexer, docs/models.md §3.2–3.3 with the numerics policy of issue 3 (the same
// rounding points as python/dayzero_ref/deepseek_v32.py, _indexer): every linear output, the
// LayerNorm output, the RoPE outputs and the Hadamard outputs are rounded to BF16; act_quant
// (ue8m0) takes those BF16 values; head weights stay FP32.
#include "dayzero/model/blocks/dsa_indexer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/hadamard.h"
#include "dayzero/kernels/lightning_indexer.h"
#include "dayzero/kernels/norms.h"
#include "dayzero/model/context_parallel.h"

namespace dz::model {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

template <typename T>
T* take(Arena& scratch, int64_t num_elems) {
  return reinterpret_cast<T*>(scratch.allocate(static_cast<size_t>(num_elems) * sizeof(T)).data());
}

// Hadamard_n on each row, output rounded to BF16, then act_quant (ue8m0) of each row (n = 128: one
// group, one scale per row).
void rotate_and_quantize(const ExecContext& ctx, float* rows, int64_t num_rows, int64_t n,
                         uint8_t* codes, float* scales) {
  parallel_for(ctx, num_rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<uint16_t> bf16(static_cast<size_t>(n));
    for (int64_t r = begin; r < end; ++r) {
      float* row = rows + r * n;
      kernels::hadamard(std::span<float>(row, static_cast<size_t>(n)), n);
      for (int64_t i = 0; i < n; ++i) bf16[static_cast<size_t>(i)] = formats::encode_bf16(row[i]);
      formats::act_quant(bf16, formats::ActScaleFormat::kUe8m0,
                         std::span<uint8_t>(codes + r * n, static_cast<size_t>(n)),
                         std::span<float>(scales + r, 1));
    }
  });
}

}  // namespace

void visit_dsa_indexer_tensors(TensorVisitor& v, const DsaIndexerConfig& c, DsaIndexerWeights& w) {
  const int64_t n_i = c.index_n_heads, d_i = c.index_head_dim;
  constexpr Split kAll = Split::kReplicated;
  v.linear("wq_b", n_i * d_i, c.q_lora_rank, kAll, Quantizable::kYes, w.wq_b);
  v.linear("wk", d_i, c.hidden_size, kAll, Quantizable::kYes, w.wk);
  v.floats("k_norm.weight", {d_i}, DType::kF32, kAll, w.k_norm_weight);
  v.floats("k_norm.bias", {d_i}, DType::kF32, kAll, w.k_norm_bias);
  v.linear("weights_proj", n_i, c.hidden_size, kAll, Quantizable::kNo, w.weights_proj);
}

DsaIndexer::DsaIndexer(DsaIndexerConfig config, DsaIndexerWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  const DsaIndexerConfig& c = config_;
  const int64_t n_heads = c.index_n_heads, head_dim = c.index_head_dim;
  DZ_CHECK(n_heads >= 1 && c.index_topk >= 1, "index_n_heads {}, index_topk {}", n_heads,
           c.index_topk);
  // act_quant groups are 128 wide: one scale per (token, head) and per key needs head_dim 128.
  DZ_CHECK(head_dim == formats::kActQuantGroupElems, "index_head_dim {} is not 128", head_dim);
  DZ_CHECK(c.rope.rope_dim > 0 && c.rope.rope_dim <= head_dim && c.rope.rope_dim % 2 == 0,
           "indexer rope_dim {} for index_head_dim {}", c.rope.rope_dim, head_dim);
  DZ_CHECK(weights_.wq_b.out_features() == n_heads * head_dim &&
               weights_.wq_b.in_features() == c.q_lora_rank,
           "indexer.wq_b is [{}, {}], want [{}, {}]", weights_.wq_b.out_features(),
           weights_.wq_b.in_features(), n_heads * head_dim, c.q_lora_rank);
  DZ_CHECK(weights_.wk.out_features() == head_dim && weights_.wk.in_features() == c.hidden_size,
           "indexer.wk is [{}, {}], want [{}, {}]", weights_.wk.out_features(),
           weights_.wk.in_features(), head_dim, c.hidden_size);
  DZ_CHECK(weights_.weights_proj.out_features() == n_heads &&
               weights_.weights_proj.in_features() == c.hidden_size,
           "indexer.weights_proj is [{}, {}], want [{}, {}]", weights_.weights_proj.out_features(),
           weights_.weights_proj.in_features(), n_heads, c.hidden_size);
  DZ_CHECK(static_cast<int64_t>(weights_.k_norm_weight.size()) == head_dim &&
               static_cast<int64_t>(weights_.k_norm_bias.size()) == head_dim,
           "indexer.k_norm weight/bias hold {}/{} values, want {}", weights_.k_norm_weight.size(),
           weights_.k_norm_bias.size(), head_dim);
}

void DsaIndexer::select(const ExecContext& ctx, const ForwardBatch& batch, const float* x,
                        const float* c_q, const IndexLayerCache& cache,
                        std::span<int32_t> selection, Arena& scratch, TapSink* taps,
                        int layer_id) const {
  const DsaIndexerConfig& c = config_;
  const int64_t T = batch.num_tokens();
  const int64_t n_heads = c.index_n_heads, head_dim = c.index_head_dim, K = c.index_topk;
  DZ_CHECK(static_cast<int64_t>(selection.size()) == T * K, "selection holds {}, want {} x {}",
           selection.size(), T, K);
  DZ_CHECK(cache.layout.key_dim == head_dim && cache.layout.block_size == batch.block_size,
           "index cache key_dim {} / block_size {} vs index_head_dim {} / batch block_size {}",
           cache.layout.key_dim, cache.layout.block_size, head_dim, batch.block_size);
  if (T == 0) return;

  // 1. q = wq_b(c_q) [T, n_I, d_I], head = [rope (first d_r) ; nope]; RoPE on the rope part.
  float* q = take<float>(scratch, T * n_heads * head_dim);
  weights_.wq_b.forward(ctx, c_q, T, q);
  kernels::round_to_bf16(q, T * n_heads * head_dim);
  kernels::apply_rope(ctx, c.rope, c.rope_layout, batch.positions, q, n_heads * head_dim, n_heads,
                      head_dim);
  // 2. k = LayerNorm(wk(x)) [T, d_I], RoPE on its first d_r values. The rotated values are
  // rounded (the reference rotates BF16 tensors and returns BF16); the nope part already is.
  float* k = take<float>(scratch, T * head_dim);
  weights_.wk.forward(ctx, x, T, k);
  kernels::round_to_bf16(k, T * head_dim);
  kernels::layer_norm(ctx, k, head_dim, weights_.k_norm_weight.data(), weights_.k_norm_bias.data(),
                      k, head_dim, T, head_dim, c.k_norm_eps);
  kernels::round_to_bf16(k, T * head_dim);
  kernels::apply_rope(ctx, c.rope, c.rope_layout, batch.positions, k, head_dim, 1, head_dim);
  // Only the rotated parts change here; the rest is BF16 already, so rounding it is a no-op.
  kernels::round_to_bf16(q, T * n_heads * head_dim);
  kernels::round_to_bf16(k, T * head_dim);
  // 3–4. Hadamard, BF16, act_quant: q per (token, head), k per token.
  auto* q_codes = take<uint8_t>(scratch, T * n_heads * head_dim);
  float* q_scales = take<float>(scratch, T * n_heads);
  auto* k_codes = take<uint8_t>(scratch, T * head_dim);
  float* k_scales = take<float>(scratch, T);
  rotate_and_quantize(ctx, q, T * n_heads, head_dim, q_codes, q_scales);
  rotate_and_quantize(ctx, k, T, head_dim, k_codes, k_scales);
  // Every key is cached before any scoring: token t sees itself (§3.3).
  const ContextSplit* split = batch.context;
  for (int64_t t = 0; t < T; ++t) {
    int64_t slot = batch.slot_mapping[static_cast<size_t>(t)];
    if (split != nullptr) slot = split->shard().stored_slot(slot, batch.block_size);
    if (slot < 0) continue;  // another CP rank stores it
    kernels::write_index_key(
        cache.layout, cache.pool, slot,
        std::span<const uint8_t>(k_codes + t * head_dim, static_cast<size_t>(head_dim)),
        k_scales[t]);
  }
  // Context parallelism: the pieces score their sequence's whole history.
  ContextSplit::History history;
  if (split != nullptr) {
    const auto key = static_cast<size_t>(head_dim);
    std::vector<std::byte> fresh(static_cast<size_t>(T) * (key + 4));
    for (int64_t t = 0; t < T; ++t) {
      std::byte* row = fresh.data() + static_cast<size_t>(t) * (key + 4);
      std::memcpy(row, k_codes + t * head_dim, key);
      std::memcpy(row + key, k_scales + t, 4);
    }
    history = split->index_history(cache.layout, cache.pool, fresh, layer_id);
  }

  // 5. w_h = weights_proj(x)_h · n_I^-½ · sq_h · d_I^-½ (the reference's order; sq_h is a power of
  // two, so only the constant factors round).
  float* w = take<float>(scratch, T * n_heads);
  weights_.weights_proj.forward(ctx, x, T, w);
  const auto head_factor = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n_heads)));
  const auto dim_factor = static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
  for (int64_t i = 0; i < T * n_heads; ++i) w[i] = w[i] * head_factor * q_scales[i] * dim_factor;

  // 6. Scores and top-k per sequence, keys from the paged cache; one workspace, sized for the
  // largest sequence, serves them in turn.
  float* scores = taps != nullptr ? take<float>(scratch, T * K) : nullptr;
  auto queries_of = [&](const SequenceSlice& seq) {
    return kernels::IndexerQueries{
        .q_codes = q_codes + seq.token_begin * n_heads * head_dim,
        .head_weights = w + seq.token_begin * n_heads,
        .positions = batch.positions.subspan(static_cast<size_t>(seq.token_begin),
                                             static_cast<size_t>(seq.num_tokens)),
        .num_heads = n_heads};
  };
  size_t workspace_bytes = 0;
  for (const SequenceSlice& seq : batch.sequences)
    workspace_bytes = std::max(
        workspace_bytes, kernels::lightning_indexer_workspace_bytes(
                             ctx, kernels::IndexKeyCache{cache.layout, cache.pool, seq.block_table},
                             queries_of(seq), K));
  const std::span<std::byte> workspace = scratch.allocate(workspace_bytes);
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& seq = batch.sequences[i];
    kernels::IndexKeyCache keys{cache.layout, cache.pool, seq.block_table};
    if (split != nullptr) {
      const std::optional<ContextPiece> piece = split->piece_of_slice(i);
      if (!piece) continue;  // a whole sequence: select_sharded below
      keys = {cache.layout, history.pool, history.tables[static_cast<size_t>(piece->sequence)]};
    }
    const auto rows = static_cast<size_t>(seq.token_begin * K);
    const auto num_values = static_cast<size_t>(seq.num_tokens * K);
    kernels::lightning_indexer(
        ctx, keys, queries_of(seq), K, selection.subspan(rows, num_values),
        scores != nullptr ? std::span<float>(scores + rows, num_values) : std::span<float>(),
        workspace);
  }
  if (split != nullptr) select_sharded(ctx, batch, q_codes, w, cache, selection, scores, layer_id);
  if (taps != nullptr) {
    float* as_float = take<float>(scratch, T * K);
    for (int64_t i = 0; i < T * K; ++i) as_float[i] = static_cast<float>(selection[i]);
    tap(taps, layer_id, "index_selection", as_float, {T, K});
    tap(taps, layer_id, "index_scores", scores, {T, K});
  }
}

void DsaIndexer::select_sharded(const ExecContext& ctx, const ForwardBatch& batch,
                                const uint8_t* q_codes, const float* head_weights,
                                const IndexLayerCache& cache, std::span<int32_t> selection,
                                float* scores, int layer_id) const {
  const ContextSplit& split = *batch.context;
  const int64_t n_heads = config_.index_n_heads, head_dim = config_.index_head_dim;
  const int64_t K = config_.index_topk, B = batch.block_size;
  // This rank's candidates of every sharded row: K (score, position) pairs, −inf / −1 padded.
  struct Candidate {
    float score;
    int32_t position;
  };
  std::vector<int64_t> rows;  // local token index of each sharded row
  for (size_t i = 0; i < batch.sequences.size(); ++i)
    if (split.shards_keys(i))
      for (int64_t t = 0; t < batch.sequences[i].num_tokens; ++t)
        rows.push_back(batch.sequences[i].token_begin + t);
  if (rows.empty()) return;
  std::vector<Candidate> mine(rows.size() * static_cast<size_t>(K), {-kInf, -1});
  std::vector<int32_t> picked(static_cast<size_t>(K));
  std::vector<float> picked_scores(static_cast<size_t>(K));
  std::vector<std::byte> workspace;
  size_t row = 0;
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    if (!split.shards_keys(i)) continue;
    const SequenceSlice& seq = batch.sequences[i];
    // The stored blocks, as a block table of their own into this rank's pool: position p' in it
    // is position owned[p' / B]·B + p' % B of the sequence.
    std::vector<int32_t> owned, table;
    for (int64_t b = 0; b * B < seq.num_cached_after(); ++b)
      if (split.owns_key(seq.block_table, b * B)) {
        owned.push_back(static_cast<int32_t>(b));
        table.push_back(split.shard().stored_block(seq.block_table[static_cast<size_t>(b)]));
      }
    const kernels::IndexKeyCache keys{cache.layout, cache.pool, table};
    for (int64_t t = seq.token_begin; t < seq.token_begin + seq.num_tokens; ++t, ++row) {
      const int32_t pos = batch.positions[static_cast<size_t>(t)];
      int64_t visible = 0;  // owned keys at positions ≤ pos
      for (int32_t b : owned) visible += std::clamp<int64_t>(pos + 1 - int64_t{b} * B, 0, B);
      if (visible == 0) continue;
      const int32_t last = static_cast<int32_t>(visible - 1);
      const kernels::IndexerQueries query{.q_codes = q_codes + t * n_heads * head_dim,
                                          .head_weights = head_weights + t * n_heads,
                                          .positions = std::span(&last, 1),
                                          .num_heads = n_heads};
      // Beside select()'s own workspace, which scratch_bytes() sized the arena for.
      const size_t bytes = kernels::lightning_indexer_workspace_bytes(ctx, keys, query, K);
      if (workspace.size() < bytes + 64) workspace.resize(bytes + 64);
      const auto offset =
          static_cast<size_t>((64 - reinterpret_cast<uintptr_t>(workspace.data()) % 64) % 64);
      kernels::lightning_indexer(ctx, keys, query, K, picked, picked_scores,
                                 std::span(workspace.data() + offset, bytes));
      for (int64_t j = 0; j < K && picked[static_cast<size_t>(j)] >= 0; ++j) {
        const int32_t p = picked[static_cast<size_t>(j)];
        mine[row * static_cast<size_t>(K) + static_cast<size_t>(j)] = {
            picked_scores[static_cast<size_t>(j)],
            owned[static_cast<size_t>(p / B)] * static_cast<int32_t>(B) +
                p % static_cast<int32_t>(B)};
      }
    }
  }
  // Every rank's candidates; each row's top k_t of their union is its top k_t over all keys,
  // since each of those is among its owner's top K. Same order as the kernel: score descending
  // (NaN as −inf), then position ascending.
  const std::vector<std::byte> all = split.gather_equal(std::as_bytes(std::span(mine)), layer_id);
  const auto* every = reinterpret_cast<const Candidate*>(all.data());
  std::vector<Candidate> merged;
  for (size_t r = 0; r < rows.size(); ++r) {
    merged.clear();
    for (int rank = 0; rank < split.ranks(); ++rank)
      for (int64_t j = 0; j < K; ++j) {
        Candidate c = every[(static_cast<size_t>(rank) * rows.size() + r) * static_cast<size_t>(K) +
                            static_cast<size_t>(j)];
        if (c.position < 0) continue;
        if (std::isnan(c.score)) c.score = -kInf;
        merged.push_back(c);
      }
    std::sort(merged.begin(), merged.end(), [](const Candidate& a, const Candidate& b) {
      return a.score != b.score ? a.score > b.score : a.position < b.position;
    });
    const int64_t t = rows[r];
    const int64_t keep = std::min<int64_t>(
        {K, batch.positions[static_cast<size_t>(t)] + 1, static_cast<int64_t>(merged.size())});
    for (int64_t j = 0; j < K; ++j) {
      const bool taken = j < keep;
      selection[static_cast<size_t>(t * K + j)] =
          taken ? merged[static_cast<size_t>(j)].position : -1;
      if (scores != nullptr)
        scores[t * K + j] = taken ? merged[static_cast<size_t>(j)].score : -kInf;
    }
  }
}

// select()'s allocations in its order, each padded to the arena's 64-byte alignment: q, k, their
// codes and scales, the head weights, the tapped scores, the kernel's workspace (bounded for the
// widest visible range), the tapped selection.
size_t DsaIndexer::scratch_bytes(const ExecContext& ctx, int64_t max_tokens,
                                 int64_t max_range) const {
  const DsaIndexerConfig& c = config_;
  const int64_t T = max_tokens, n_i = c.index_n_heads, d_i = c.index_head_dim, K = c.index_topk;
  const auto padded = [](int64_t bytes) { return static_cast<size_t>((bytes + 63) / 64 * 64); };
  return padded(T * n_i * d_i * 4) + padded(T * d_i * 4) + padded(T * n_i * d_i) +
         padded(T * n_i * 4) + padded(T * d_i) + padded(T * 4) + padded(T * n_i * 4) +
         padded(T * K * 4) +
         padded(static_cast<int64_t>(
             kernels::lightning_indexer_workspace_bound(ctx, n_i, d_i, max_range, K))) +
         padded(T * K * 4);
}

}  // namespace dz::model
