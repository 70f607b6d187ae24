#pragma once
// MLA attention over the paged latent cache, docs/models.md §2.2–2.3, dense causal or over
// per-query selections (§3.4). Both forms read every key back from the cache (write first, then
// attend), so the FP8 round trip of c_kv applies to both (docs/models.md §2.4). Scores and softmax
// are FP32; the outputs are FP32 and not rounded (the caller rounds where the model stores BF16).
//
//   absorbed (decode): S_h[s] = (q_abs_h·c_kv(s) + q_pe_h·k_pe(s))·scale,  o_lat_h = Σ_s
//   P_h[s]·c_kv(s) prefill:           S_h[s] = (q_nope_h·W_UK_h c_kv(s) + q_pe_h·k_pe(s))·scale,
//                      o_h = Σ_s P_h[s]·W_UV_h c_kv(s)
//
// The fast kernels stream keys in tiles with an online softmax (no [queries, keys] matrix) and read
// only the records a query attends to. The *_ref functions are the plain oracle: they gather each
// query's keys, accumulate in FP64 and take a two-pass softmax.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/kernels/paged_cache.h"

namespace dz::kernels {

// One sequence's latent records as the kernels read them: position p lives at slot
// block_table[p / block_size]·block_size + p % block_size (docs/formats.md §5.1).
struct MlaCacheView {
  MlaCacheLayout layout;
  const std::byte* pool = nullptr;
  int64_t block_size = 64;
  std::span<const int32_t> block_table;
};

// The keys each query attends to. selection_width == 0: the causal prefix 0 … positions[i].
// Otherwise the positions selection[i·width … (i+1)·width) (any order, −1 entries skipped, no
// duplicates, each ≤ positions[i]); a query needs at least one key.
struct MlaQueryKeys {
  std::span<const int32_t> positions;  // [num_queries]
  std::span<const int32_t> selection;  // [num_queries, selection_width]
  int64_t selection_width = 0;

  int64_t num_queries() const { return static_cast<int64_t>(positions.size()); }
};

struct MlaAbsorbedArgs {
  int64_t num_heads = 0;
  float softmax_scale = 0;
  const float* q_abs = nullptr;  // [num_queries, H, r_kv] = W_UK_hᵀ q_nope_h, contiguous
  const float* q_pe = nullptr;   // [num_queries, H, d_r] at q_pe_token_stride / q_pe_head_stride
  int64_t q_pe_token_stride = 0;
  int64_t q_pe_head_stride = 0;
  float* o_lat = nullptr;  // [num_queries, H, r_kv], contiguous
  // Optional [num_queries, H]: log Σ_s exp(S_h[s]), natural log of the scaled scores, so that
  // outputs over disjoint key sets merge exactly (context parallelism: docs/parallel.md §9.4).
  float* lse = nullptr;
};

struct MlaPrefillArgs {
  int64_t num_heads = 0;
  int64_t nope_dim = 0;  // d_n
  int64_t v_dim = 0;     // d_v
  float softmax_scale = 0;
  // q_nope [num_queries, H, d_n] and q_pe [num_queries, H, d_r], both at q_token_stride /
  // q_head_stride (e.g. one q buffer [num_queries, H, d_n + d_r] with q_pe = q + d_n).
  const float* q_nope = nullptr;
  const float* q_pe = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  const uint16_t* w_uk = nullptr;  // [H, d_n, r_kv] BF16 codes
  const uint16_t* w_uv = nullptr;  // [H, d_v, r_kv] BF16 codes
  float* out = nullptr;            // [num_queries, H, d_v], contiguous
};

// Scratch the fast kernels need (they never allocate); pass at least this many bytes, 64-aligned.
size_t mla_absorbed_workspace_bytes(const ExecContext& ctx, const MlaCacheLayout& layout,
                                    int64_t num_queries, int64_t num_heads);
size_t mla_prefill_workspace_bytes(const ExecContext& ctx, const MlaCacheLayout& layout,
                                   const MlaQueryKeys& keys, int64_t num_heads, int64_t nope_dim,
                                   int64_t v_dim);

void mla_attention_absorbed(const ExecContext& ctx, const MlaCacheView& cache,
                            const MlaQueryKeys& keys, const MlaAbsorbedArgs& args,
                            std::span<std::byte> workspace);
void mla_attention_prefill(const ExecContext& ctx, const MlaCacheView& cache,
                           const MlaQueryKeys& keys, const MlaPrefillArgs& args,
                           std::span<std::byte> workspace);

// Plain references (test oracles): same arguments, FP64 accumulation, allocate freely.
void mla_attention_absorbed_ref(const MlaCacheView& cache, const MlaQueryKeys& keys,
                                const MlaAbsorbedArgs& args);
void mla_attention_prefill_ref(const MlaCacheView& cache, const MlaQueryKeys& keys,
                               const MlaPrefillArgs& args);

// The key positions of query i in ascending order (the reference's and the tests' view of
// MlaQueryKeys).
void mla_query_key_positions(const MlaQueryKeys& keys, int64_t query, std::vector<int32_t>& out);

}  // namespace dz::kernels
