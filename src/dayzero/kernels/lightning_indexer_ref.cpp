// Scalar reference of the lightning indexer: for each query, the full score row over its visible
// keys in a fixed order (per head: d ascending; heads ascending; then × sk), then a selection by
// the tie rule. The test oracle and the fallback on CPUs without AVX-512.

#include <algorithm>
#include <cstring>

#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/lightning_indexer.h"
#include "dayzero/kernels/lightning_indexer_detail.h"

namespace dz::kernels {

using indexer_detail::ScoredPos;

void lightning_indexer_ref(const ExecContext& ctx, const IndexKeyCache& keys,
                           const IndexerQueries& queries, int64_t top_k,
                           std::span<int32_t> selection, std::span<float> scores,
                           std::span<std::byte> workspace) {
  const int64_t num_queries = queries.num_queries();
  const int64_t num_heads = queries.num_heads;
  const int64_t key_dim = keys.layout.key_dim;
  const int64_t block_size = keys.layout.block_size;
  const size_t worker_bytes = indexer_detail::ref_worker_bytes(
      num_heads, key_dim, indexer_detail::max_visible_keys(queries));
  const int64_t num_workers = std::min<int64_t>(std::max(ctx.num_threads, 1), num_queries);

  parallel_for(ctx, num_workers, 1, [&](int64_t worker_begin, int64_t worker_end) {
    for (int64_t worker = worker_begin; worker < worker_end; ++worker) {
      std::byte* base = workspace.data() + static_cast<size_t>(worker) * worker_bytes;
      auto* q = reinterpret_cast<float*>(base);  // [num_heads, key_dim], decoded
      auto* row = reinterpret_cast<ScoredPos*>(
          base + (static_cast<size_t>(num_heads * key_dim) * sizeof(float) + 63) / 64 * 64);
      // Queries round-robin over workers: causal rows grow with the position.
      for (int64_t t = worker; t < num_queries; t += num_workers) {
        const uint8_t* q_codes = queries.q_codes + t * num_heads * key_dim;
        for (int64_t i = 0; i < num_heads * key_dim; ++i) q[i] = formats::decode_e4m3(q_codes[i]);
        const float* w = queries.head_weights + t * num_heads;
        const int64_t num_visible = int64_t{queries.positions[static_cast<size_t>(t)]} + 1;
        for (int64_t s = 0; s < num_visible; ++s) {
          const int64_t slot =
              int64_t{keys.block_table[static_cast<size_t>(s / block_size)]} * block_size +
              s % block_size;
          const auto* k_codes =
              reinterpret_cast<const uint8_t*>(keys.pool + keys.layout.key_offset_bytes(slot));
          float k_scale;
          std::memcpy(&k_scale, keys.pool + keys.layout.scale_offset_bytes(slot), sizeof(float));
          float head_sum = 0.0f;
          for (int64_t h = 0; h < num_heads; ++h) {
            float dot = 0.0f;
            for (int64_t d = 0; d < key_dim; ++d)
              dot += q[h * key_dim + d] * formats::decode_e4m3(k_codes[d]);
            head_sum += w[h] * std::max(dot, 0.0f);
          }
          row[s] = ScoredPos{k_scale * head_sum, static_cast<int32_t>(s)};
        }
        const int64_t num_chosen = std::min(top_k, num_visible);
        std::partial_sort(row, row + num_chosen, row + num_visible, indexer_detail::kRanksBefore);
        indexer_detail::write_selection_row(row, num_chosen, top_k, selection.data() + t * top_k,
                                            scores.empty() ? nullptr : scores.data() + t * top_k);
      }
    }
  });
}

}  // namespace dz::kernels
