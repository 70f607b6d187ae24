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

// chunk_size rounded up to 32: the AMX tiles' depth over the chunk axis (32 BF16 per tile row).
inline int64_t amx_padded_chunk(int64_t chunk_size) {
  return (chunk_size + 31) / 32 * 32;
}

// One worker's chunk buffers (FP32, each 64-byte aligned). C = chunk_size, Cp = padded_chunk(C).
struct ChunkBuffers {
  float* kg = nullptr;      // [Cp, d] exp(Γ_r) ⊙ k_r (AVX-512: then S0ᵀ kg back in rows)
  float* qg = nullptr;      // [Cp, d] sc · exp(Γ_r) ⊙ q_r (AVX-512: then S0ᵀ qg in rows)
  float* kd = nullptr;      // [C32, d] exp(Γ_last − Γ_c) ⊙ k_c (C32 = amx_padded_chunk(C))
  float* vn = nullptr;      // [C32, d] B_r, then Vn_r (the u_r of the recurrence)
  float* kg_t = nullptr;    // [d, Cp] kg transposed (AVX-512 state products)
  float* qg_t = nullptr;    // [d, Cp]
  float* bt = nullptr;      // [d, Cp] S0ᵀ kg, per state row v
  float* ot = nullptr;      // [d, Cp] S0ᵀ qg
  float* l = nullptr;       // [Cp, Cp] β_r Σ k_r k_c D(r, c), c < r (plain: [r, c] stride C;
                            //          AVX-512: transposed, [c, r] stride Cp)
  float* a = nullptr;       // [Cp, Cp] sc Σ q_r k_c D(r, c), c ≤ r (same layouts as l)
  float* decay = nullptr;   // [d]    exp(Γ_last)
  float* run = nullptr;     // [d]    plain: running Σ g over part of the chunk; AVX-512: β_r
  float* vt = nullptr;      // [d, C32] AMX: Vnᵀ
  uint16_t* amx = nullptr;  // AMX: the BF16 hi/lo operands (carved in kda_avx512.cpp)
};

// BF16 elements of ChunkBuffers::amx: kg, qg hi/lo [Cp, d]; S0 hi/lo as VNNI tiles [d, d]; Vnᵀ
// hi/lo [d, C32]; kd hi/lo as VNNI tiles [C32, d].
inline size_t amx_buffer_elems(const KdaDims& dims, int64_t chunk_size) {
  const auto d = static_cast<size_t>(dims.head_dim);
  const auto cp = static_cast<size_t>(padded_chunk(chunk_size));
  const auto c32 = static_cast<size_t>(amx_padded_chunk(chunk_size));
  return 4 * cp * d + 2 * d * d + 4 * c32 * d;
}

size_t chunk_buffer_bytes(const KdaDims& dims, int64_t chunk_size);
ChunkBuffers carve_chunk_buffers(std::byte* base, const KdaDims& dims, int64_t chunk_size);

// Workers (and scratch slices) kda_chunked uses: min(ctx.num_threads, H), at least 1.
int64_t num_workers(const ExecContext& ctx, const KdaDims& dims);

// The AVX-512 variants (kda_avx512.cpp); callers check kda_avx512_available first.
void kda_recurrent_avx512(const ExecContext& ctx, const KdaDims& dims, const float* q,
                          const float* k, const float* v, const float* g, const float* beta,
                          int64_t num_tokens, float* state, float* out, const float* state_in);
// use_amx: the three state products as BF16×3 on AMX tiles (callers check amx_available()).
void kda_chunked_avx512(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                        const float* v, const float* g, const float* beta, int64_t num_tokens,
                        int64_t pos_begin, int64_t chunk_size, float* state, float* out,
                        Arena& scratch, bool use_amx);

// AMX-BF16 present and granted by the OS, and the AVX-512 variant usable for these dims.
bool amx_available(const KdaDims& dims);

}  // namespace dz::kernels::kda_detail
