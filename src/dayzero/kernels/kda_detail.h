#pragma once
// Pieces shared by the KDA kernel variants (kda.cpp, kda_avx512.cpp). Everything with external
// linkage here is defined in kda.cpp (compiled without AVX-512 flags).

#include <cstddef>
#include <cstdint>

#include "dayzero/core/parallel.h"
#include "dayzero/kernels/kda.h"

namespace dz::kernels::kda_detail {

// chunk_size rounded up to 16: the chunk axis of the transposed buffers is one or more zmm.
inline int64_t padded_chunk(int64_t chunk_size) {
  return (chunk_size + 15) / 16 * 16;
}

// One worker's chunk buffers (FP32, each 64-byte aligned). C = chunk_size, Cp = padded_chunk(C).
struct ChunkBuffers {
  float* kg = nullptr;     // [Cp, d] exp(Γ_r) ⊙ k_r (AVX-512: then S0ᵀ kg back in rows)
  float* qg = nullptr;     // [Cp, d] sc · exp(Γ_r) ⊙ q_r (AVX-512: then S0ᵀ qg in rows)
  float* kd = nullptr;     // [C, d]  exp(Γ_last − Γ_c) ⊙ k_c
  float* vn = nullptr;     // [C, d]  B_r, then Vn_r (the u_r of the recurrence)
  float* kg_t = nullptr;   // [d, Cp] kg transposed (AVX-512 state products)
  float* qg_t = nullptr;   // [d, Cp]
  float* bt = nullptr;     // [d, Cp] S0ᵀ kg, per state row v
  float* ot = nullptr;     // [d, Cp] S0ᵀ qg
  float* l = nullptr;      // [Cp, Cp] β_r Σ k_r k_c D(r, c), c < r (plain: [r, c] stride C;
                           //          AVX-512: transposed, [c, r] stride Cp)
  float* a = nullptr;      // [Cp, Cp] sc Σ q_r k_c D(r, c), c ≤ r (same layouts as l)
  float* decay = nullptr;  // [d]    exp(Γ_last)
  float* run = nullptr;    // [d]    plain: running Σ g over part of the chunk; AVX-512: β_r
};

size_t chunk_buffer_bytes(const KdaDims& dims, int64_t chunk_size);
ChunkBuffers carve_chunk_buffers(std::byte* base, const KdaDims& dims, int64_t chunk_size);

// Workers (and scratch slices) kda_chunked uses: min(ctx.num_threads, H), at least 1.
int64_t num_workers(const ExecContext& ctx, const KdaDims& dims);

// The AVX-512 variants (kda_avx512.cpp); callers check kda_avx512_available first.
void kda_recurrent_avx512(const ExecContext& ctx, const KdaDims& dims, const float* q,
                          const float* k, const float* v, const float* g, const float* beta,
                          int64_t num_tokens, float* state, float* out);
void kda_chunked_avx512(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                        const float* v, const float* g, const float* beta, int64_t num_tokens,
                        int64_t pos_begin, int64_t chunk_size, float* state, float* out,
                        Arena& scratch);

}  // namespace dz::kernels::kda_detail
