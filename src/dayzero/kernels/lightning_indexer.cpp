#include "dayzero/kernels/lightning_indexer.h"

#include <algorithm>
#include <limits>

#include "dayzero/core/check.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/lightning_indexer_detail.h"

namespace dz::kernels {
namespace indexer_detail {
namespace {

size_t align64(size_t num_bytes) {
  return (num_bytes + 63) / 64 * 64;
}

}  // namespace

Avx512WorkerLayout avx512_worker_layout(int64_t num_heads, int64_t key_dim, int64_t top_k) {
  Avx512WorkerLayout layout;
  layout.padded_heads = (num_heads + 15) / 16 * 16;
  const auto heads = static_cast<size_t>(layout.padded_heads);
  const auto dim = static_cast<size_t>(key_dim);
  size_t offset = 0;
  layout.keys_offset = offset;
  offset += align64(static_cast<size_t>(kChunkKeys) * dim * sizeof(float));
  layout.c_tiles_offset = offset;
  offset += 4 * 16 * 16 * sizeof(float);
  layout.q_offset = offset;
  offset += align64(static_cast<size_t>(kTileQueries) * dim * heads * sizeof(float));
  layout.w_offset = offset;
  offset += align64(static_cast<size_t>(kTileQueries) * heads * sizeof(float));
  layout.kept_offset = offset;
  offset +=
      align64(static_cast<size_t>(kTileQueries * kept_buffer_entries(top_k)) * sizeof(ScoredPos));
  layout.worker_bytes = offset;
  return layout;
}

size_t ref_worker_bytes(int64_t num_heads, int64_t key_dim, int64_t max_visible) {
  return align64(static_cast<size_t>(num_heads * key_dim) * sizeof(float)) +
         align64(static_cast<size_t>(max_visible) * sizeof(ScoredPos));
}

int64_t max_visible_keys(const IndexerQueries& queries) {
  int32_t max_pos = -1;
  for (int32_t pos : queries.positions) max_pos = std::max(max_pos, pos);
  return int64_t{max_pos} + 1;
}

void write_selection_row(ScoredPos* chosen, int64_t num_chosen, int64_t top_k, int32_t* sel_row,
                         float* score_row) {
  std::sort(chosen, chosen + num_chosen, kRanksBefore);
  write_ranked_selection_row(chosen, num_chosen, top_k, sel_row, score_row);
}

void write_ranked_selection_row(const ScoredPos* ranked, int64_t num_chosen, int64_t top_k,
                                int32_t* sel_row, float* score_row) {
  for (int64_t i = 0; i < top_k; ++i) {
    const bool used = i < num_chosen;
    sel_row[i] = used ? ranked[i].pos : -1;
    if (score_row != nullptr)
      score_row[i] = used ? ranked[i].score : -std::numeric_limits<float>::infinity();
  }
}

}  // namespace indexer_detail

using indexer_detail::avx512_worker_layout;
using indexer_detail::max_visible_keys;
using indexer_detail::ref_worker_bytes;

size_t lightning_indexer_workspace_bytes(const ExecContext& ctx, const IndexKeyCache& keys,
                                         const IndexerQueries& queries, int64_t top_k) {
  return lightning_indexer_workspace_bound(ctx, queries.num_heads, keys.layout.key_dim,
                                           max_visible_keys(queries), top_k);
}

size_t lightning_indexer_workspace_bound(const ExecContext& ctx, int64_t num_heads, int64_t key_dim,
                                         int64_t max_visible_keys, int64_t top_k) {
  const size_t per_worker = std::max(ref_worker_bytes(num_heads, key_dim, max_visible_keys),
                                     avx512_worker_layout(num_heads, key_dim, top_k).worker_bytes);
  const auto num_threads = static_cast<size_t>(std::max(ctx.num_threads, 1));
  const size_t merge_bytes = std::min<size_t>(num_threads, indexer_detail::kMaxSplitWorkers) *
                             static_cast<size_t>(top_k) * sizeof(indexer_detail::ScoredPos);
  return per_worker * num_threads + merge_bytes;
}

bool lightning_indexer_avx512_available(const IndexKeyCache& keys) {
  return cpu_features().avx512_vbmi && keys.layout.key_dim % 64 == 0 &&
         keys.layout.block_size % indexer_detail::kChunkKeys == 0;
}

bool lightning_indexer_avx512_bf16_available(const IndexKeyCache& keys) {
  return cpu_features().avx512_bf16 && lightning_indexer_avx512_available(keys);
}

bool lightning_indexer_amx_available(const IndexKeyCache& keys) {
  return cpu_features().amx_bf16 && lightning_indexer_avx512_bf16_available(keys) &&
         keys.layout.key_dim % indexer_detail::kAmxTileDepth == 0;
}

void lightning_indexer(const ExecContext& ctx, const IndexKeyCache& keys,
                       const IndexerQueries& queries, int64_t top_k, std::span<int32_t> selection,
                       std::span<float> scores, std::span<std::byte> workspace,
                       IndexerVariant variant) {
  const int64_t num_queries = queries.num_queries();
  DZ_CHECK(queries.num_heads >= 1 && keys.layout.key_dim >= 1 && top_k >= 1,
           "num_heads {}, key_dim {}, top_k {}", queries.num_heads, keys.layout.key_dim, top_k);
  DZ_CHECK(keys.layout.block_size >= 1, "block_size {}", keys.layout.block_size);
  DZ_CHECK(static_cast<int64_t>(selection.size()) == num_queries * top_k,
           "selection holds {} values, expected {} x {}", selection.size(), num_queries, top_k);
  DZ_CHECK(scores.empty() || scores.size() == selection.size(), "scores holds {} values",
           scores.size());
  for (int32_t pos : queries.positions) DZ_CHECK(pos >= 0, "negative query position {}", pos);
  const int64_t max_visible = max_visible_keys(queries);
  const int64_t blocks_needed = (max_visible + keys.layout.block_size - 1) / keys.layout.block_size;
  DZ_CHECK(static_cast<int64_t>(keys.block_table.size()) >= blocks_needed,
           "block table has {} blocks, {} visible keys need {}", keys.block_table.size(),
           max_visible, blocks_needed);
  DZ_CHECK(workspace.size() >= lightning_indexer_workspace_bytes(ctx, keys, queries, top_k),
           "workspace of {} bytes is too small", workspace.size());
  if (num_queries == 0) return;

  if (variant == IndexerVariant::kAuto)
    variant = lightning_indexer_amx_available(keys)           ? IndexerVariant::kAmx
              : lightning_indexer_avx512_bf16_available(keys) ? IndexerVariant::kAvx512Bf16
              : lightning_indexer_avx512_available(keys)      ? IndexerVariant::kAvx512
                                                              : IndexerVariant::kRef;
  if (variant == IndexerVariant::kAmx) {
    DZ_CHECK(lightning_indexer_amx_available(keys),
             "the AMX indexer needs AMX-BF16 granted by the OS and the AVX-512 variant's shapes");
    lightning_indexer_amx(ctx, keys, queries, top_k, selection, scores, workspace);
  } else if (variant == IndexerVariant::kAvx512Bf16) {
    DZ_CHECK(lightning_indexer_avx512_bf16_available(keys),
             "the AVX-512 BF16 indexer needs AVX512-BF16 and the AVX-512 variant's shapes");
    lightning_indexer_avx512_bf16(ctx, keys, queries, top_k, selection, scores, workspace);
  } else if (variant == IndexerVariant::kAvx512) {
    DZ_CHECK(lightning_indexer_avx512_available(keys),
             "the AVX-512 indexer needs AVX-512 F/BW/VBMI, key_dim % 64 == 0 and block_size % 16 "
             "== 0 (key_dim {}, block_size {})",
             keys.layout.key_dim, keys.layout.block_size);
    lightning_indexer_avx512(ctx, keys, queries, top_k, selection, scores, workspace);
  } else {
    lightning_indexer_ref(ctx, keys, queries, top_k, selection, scores, workspace);
  }
}

}  // namespace dz::kernels
