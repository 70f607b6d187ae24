#pragma once
// The DSA lightning-indexer scoring and top-k selection, docs/models.md §3.2 step 6 and §3.3: for
// each query token t of one sequence, every visible cached key s ∈ [0, pos_t] is scored
//   I[t, s] = sk(s) · Σ_h w_h(t) · ReLU(q8_h(t) · k8(s))
// on E4M3 codes decoded to FP32 (exact), with FP32 accumulation, and the top k_t = min(top_k,
// pos_t + 1) positions are kept (ties: higher score first, then lower position). Keys are read
// from the paged, block-planar FP8 index cache (docs/formats.md §5.4) through the block table.
//
// Variants: lightning_indexer_ref computes each query's full score row and sorts it (test oracle
// and fallback); lightning_indexer_avx512 streams key blocks, keeps each query's best in a bounded
// buffer (no L×L matrix), its dots on FMA, on VDPBF16PS (lightning_indexer_avx512_bf16) or on
// AMX-BF16 tiles (lightning_indexer_amx). Their
// summation orders differ, so scores agree within FP32 rounding, not bit for bit (see the test for
// the bound).

#include <cstddef>
#include <cstdint>
#include <span>

#include "dayzero/core/parallel.h"
#include "dayzero/kernels/paged_cache.h"

namespace dz::kernels {

// One sequence's keys in a layer's index cache.
struct IndexKeyCache {
  IndexCacheLayout layout;
  const std::byte* pool = nullptr;
  // Position p lives at slot block_table[p / block_size] · block_size + p % block_size.
  std::span<const int32_t> block_table;
};

// The queries of one sequence (prefill chunk, decode token or verification rows).
struct IndexerQueries {
  const uint8_t* q_codes = nullptr;  // [num_queries, num_heads, key_dim] E4M3 codes
  const float* head_weights = nullptr;  // [num_queries, num_heads]: w_h, already · sq_h · n^-½ d^-½
  std::span<const int32_t> positions;  // [num_queries]; query i sees keys [0, positions[i]]
  int64_t num_heads = 0;               // n_I

  int64_t num_queries() const { return static_cast<int64_t>(positions.size()); }
};

enum class IndexerVariant { kAuto, kRef, kAvx512, kAmx, kAvx512Bf16 };

// Scratch bytes any variant needs for this call (ref: one score row per thread; avx512: a decoded
// key chunk, a tile of decoded queries and their selection buffers per thread).
size_t lightning_indexer_workspace_bytes(const ExecContext& ctx, const IndexKeyCache& keys,
                                         const IndexerQueries& queries, int64_t top_k);
// The same for any call whose queries see at most max_visible_keys keys (a bound the model
// sizes its scratch with before it has the batch's queries).
size_t lightning_indexer_workspace_bound(const ExecContext& ctx, int64_t num_heads, int64_t key_dim,
                                         int64_t max_visible_keys, int64_t top_k);

// True when this CPU runs the AVX-512 variant (F, BW, VBMI) and the shape suits it (key_dim and
// block_size multiples of 16).
bool lightning_indexer_avx512_available(const IndexKeyCache& keys);

// True when, in addition, the CPU has AVX512-BF16 (VDPBF16PS).
bool lightning_indexer_avx512_bf16_available(const IndexKeyCache& keys);

// True when, in addition, the CPU has AMX-BF16 and the OS grants this process the tile state.
bool lightning_indexer_amx_available(const IndexKeyCache& keys);

// kAuto picks AMX, else AVX-512 BF16, else AVX-512 FMA, else the reference.
// selection [num_queries, top_k]: the k_t chosen positions of each query in rank order (score
// descending, then position ascending: as torch.topk and python/dayzero_ref), then −1. scores
// [num_queries, top_k] (optional, may be empty): I[t, s] of each chosen position, −inf in the
// padding. NaN scores rank as −∞. workspace: lightning_indexer_workspace_bytes(), 64-byte aligned.
void lightning_indexer(const ExecContext& ctx, const IndexKeyCache& keys,
                       const IndexerQueries& queries, int64_t top_k, std::span<int32_t> selection,
                       std::span<float> scores, std::span<std::byte> workspace,
                       IndexerVariant variant = IndexerVariant::kAuto);

void lightning_indexer_ref(const ExecContext& ctx, const IndexKeyCache& keys,
                           const IndexerQueries& queries, int64_t top_k,
                           std::span<int32_t> selection, std::span<float> scores,
                           std::span<std::byte> workspace);
void lightning_indexer_avx512(const ExecContext& ctx, const IndexKeyCache& keys,
                              const IndexerQueries& queries, int64_t top_k,
                              std::span<int32_t> selection, std::span<float> scores,
                              std::span<std::byte> workspace);
// The AVX-512 variant with the dots on VDPBF16PS (E4M3 values are exact BF16 numbers).
void lightning_indexer_avx512_bf16(const ExecContext& ctx, const IndexKeyCache& keys,
                                   const IndexerQueries& queries, int64_t top_k,
                                   std::span<int32_t> selection, std::span<float> scores,
                                   std::span<std::byte> workspace);
// The AVX-512 variant with the dots on AMX-BF16 tiles (E4M3 values are exact BF16 numbers).
void lightning_indexer_amx(const ExecContext& ctx, const IndexKeyCache& keys,
                           const IndexerQueries& queries, int64_t top_k,
                           std::span<int32_t> selection, std::span<float> scores,
                           std::span<std::byte> workspace);

}  // namespace dz::kernels
