#pragma once
// The absorbed MLA projections around mla_attention_absorbed (docs/models.md §2.3), for a group of
// n query tokens (the decode rows of every absorbed sequence of a step). The weights are BF16 codes
// (the model's kv_b_proj is BF16-valued, §2.3), widened exactly: products and sums are FP32.
//   absorb_q:  q_abs[i, h, :] = Σ_k q_nope[i, h, k] · W_UK[h, k, :]     (W_UK [H, d_n, r_kv])
//   expand_o:  o[i, h, k]     = Σ_j W_UV[h, k, j] · o_lat[i, h, j]      (W_UV [H, d_v, r_kv])
// Both walk head by head over all tokens of the group, so each head's weight block (d·r_kv BF16)
// is read from memory once per call and reused from cache across tokens, instead of once per
// token; work items are (head, block of tokens), parallel over ctx.num_threads. The dispatchers
// pick the AVX-512 variant when the CPU has one and the shape allows it (kernels/cpu_features.h),
// else the plain loops, which are the reference (same arithmetic as the former per-token loops).

#include <cstdint>

#include "dayzero/core/parallel.h"

namespace dz::kernels {

struct MlaAbsorbDims {
  int64_t num_heads = 0;   // H
  int64_t nope_dim = 0;    // d_n
  int64_t latent_dim = 0;  // r_kv
  int64_t v_dim = 0;       // d_v
};

// q_nope row (i, h) starts at q_nope + i·token_stride + h·head_stride (d_n floats, the nope part
// of q [n, H, d_n + d_r] in MlaBlock); q_abs [n, H, r_kv] contiguous.
struct MlaAbsorbQ {
  const float* q_nope = nullptr;
  int64_t token_stride = 0;
  int64_t head_stride = 0;
  const uint16_t* w_uk = nullptr;  // [H, d_n, r_kv] BF16 codes
  float* q_abs = nullptr;          // [n, H, r_kv]
};

// o_lat [n, H, r_kv] and o [n, H, d_v], both contiguous.
struct MlaExpandO {
  const float* o_lat = nullptr;
  const uint16_t* w_uv = nullptr;  // [H, d_v, r_kv] BF16 codes
  float* o = nullptr;              // [n, H, d_v]
};

void mla_absorb_q(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaAbsorbQ& args,
                  int64_t num_tokens);
void mla_expand_o(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaExpandO& args,
                  int64_t num_tokens);

// The variants behind the dispatchers, for tests and benchmarks. The AVX-512 ones need
// mla_absorb_avx512_available(dims): cpu_features().avx512, r_kv % 64 == 0 and d_v % 4 == 0.
bool mla_absorb_avx512_available(const MlaAbsorbDims& dims);
void mla_absorb_q_plain(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaAbsorbQ& args,
                        int64_t num_tokens);
void mla_expand_o_plain(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaExpandO& args,
                        int64_t num_tokens);
void mla_absorb_q_avx512(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaAbsorbQ& args,
                         int64_t num_tokens);
void mla_expand_o_avx512(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaExpandO& args,
                         int64_t num_tokens);

// Tokens per work item of either variant: each item reads one head's weight block once for this
// many tokens; the (head, token block) items are the unit of parallelism.
inline constexpr int64_t kMlaAbsorbTokenBlock = 24;

}  // namespace dz::kernels
