#pragma once
// Kimi Delta Attention recurrence (docs/models.md §4.4) and its chunked prefill form (§4.7), FP32.
//
// Per head, with sc = d^−1/2 and the state S stored V-first [d_v, d_k] (docs/formats.md §5.5):
//   S' = Diag(exp(g_t)) · S_{t−1}            (decay key channel d by exp(g_t[d]))
//   u_t = β_t · (v_t − S'ᵀ k_t)
//   S_t = S' + k_t u_tᵀ
//   o_t = S_tᵀ (sc · q_t)                     (the state after this token)
//
// kda_recurrent walks tokens one by one (decode). kda_chunked processes chunks of chunk_size
// tokens aligned to absolute positions (a chunk boundary at every multiple of chunk_size, so the
// first chunk of a call starting at pos_begin has chunk_size − pos_begin % chunk_size rows). Within
// a chunk every decay D(r, c) = exp(Γ_r − Γ_c) is formed from the pair's own token range (plain:
// exp of the running sum of g from c; AVX-512: the running product of exp(g_i) ≤ 1), never as
// exp(Γ_r) · exp(−Γ_c), which overflows for the unbounded gate; (I + L) is solved by forward
// substitution. Both read and write the same state layout, so a prefill may be continued by
// decode steps or by further chunked calls with identical results up to FP32 rounding.
//
// Both kernels parallelise over heads and pick an AVX-512 variant when the CPU has one
// (kernels/cpu_features.h); kda_recurrent_ref is the scalar oracle with double accumulation. With
// chunk_size ≥ 32 on a CPU with AMX-BF16 (granted by the OS), kda_chunked runs its three state
// products (S0ᵀ kg, S0ᵀ qg, the state update) as BF16×3 on AMX tiles: each FP32 operand split into
// two BF16 parts, hi·hi + hi·lo + lo·hi accumulated in FP32, ≈ 4e-6 relative RMS against the FP64
// oracle (FP32 FMA: ≈ 2e-7), inside docs/models.md §4.8's 1e-5; everything else stays FP32.

#include <cstddef>
#include <cstdint>

#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"

namespace dz::kernels {

struct KdaDims {
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // d_k = d_v = head_dim
};

// One sequence, token-major FP32: q, k [T, H, d] (L2-normalised), v [T, H, d], g [T, H, d]
// (natural-log decay, ≤ 0, finite, may be very negative), beta [T, H]; state [H, d_v, d_k]
// V-first, read and updated in place; out [T, H, d] = o_t (the kernel multiplies q by d^−1/2).
// state_in, when given, is read instead of `state` by the first token (which writes `state`): a
// speculative row keeps the state after each draft in its own slot without copying it
// (docs/serving.md §1.8); the arithmetic is the in-place one's.
void kda_recurrent(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                   const float* v, const float* g, const float* beta, int64_t num_tokens,
                   float* state, float* out, const float* state_in = nullptr);

// Bytes of scratch kda_chunked allocates from its Arena for these dims and chunk size (per-thread
// chunk buffers, 64-byte aligned), whatever the number of tokens.
size_t kda_chunked_scratch_bytes(const ExecContext& ctx, const KdaDims& dims, int64_t chunk_size);

// docs/models.md §4.7. pos_begin is token 0's absolute position; chunk boundaries sit at multiples
// of chunk_size (1 ≤ chunk_size ≤ 64). Same data contract as kda_recurrent. Each call allocates
// kda_chunked_scratch_bytes() from `scratch` and keeps it; a caller running several sequences
// in one step gives it back between calls with Arena::mark() / release().
void kda_chunked(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                 const float* v, const float* g, const float* beta, int64_t num_tokens,
                 int64_t pos_begin, int64_t chunk_size, float* state, float* out, Arena& scratch);

// The oracle (kda_ref.cpp): the naive recurrence with double accumulation, same contract.
void kda_recurrent_ref(const KdaDims& dims, const float* q, const float* k, const float* v,
                       const float* g, const float* beta, int64_t num_tokens, float* state,
                       float* out);

// The variants behind the dispatchers, for tests and benchmarks (kda_avx512.cpp needs
// cpu_features().avx512 and head_dim % 16 == 0).
void kda_recurrent_plain(const ExecContext& ctx, const KdaDims& dims, const float* q,
                         const float* k, const float* v, const float* g, const float* beta,
                         int64_t num_tokens, float* state, float* out,
                         const float* state_in = nullptr);
void kda_chunked_plain(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                       const float* v, const float* g, const float* beta, int64_t num_tokens,
                       int64_t pos_begin, int64_t chunk_size, float* state, float* out,
                       Arena& scratch);
bool kda_avx512_available(const KdaDims& dims);

}  // namespace dz::kernels
