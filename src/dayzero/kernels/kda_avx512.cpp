// AVX-512 variants of the KDA kernels (kda.h), vectorised over the contiguous d_k axis of the
// V-first state and of q, k, g, for head_dim = 64 or 128 (NB = head_dim / 16 zmm per row).
//
// Chunked: per chunk and head, (1) the pairwise decays column by column, k_c ⊙ exp(Σ_{c<i≤r} g_i)
// carried down the rows in registers (one multiply per pair and channel), giving L, A,
// exp(Γ_r) ⊙ k_r and q_r (transposed by 16 × 16 register blocks, chunk axis in lanes) and
// exp(Γ_last − Γ_c) ⊙ k_c; (2) S0ᵀ kg and S0ᵀ qg as one register-blocked GEMM over the state rows
// (8 rows × 16 chunk rows per tile, the state element broadcast); (3) forward substitution and the
// intra-chunk output over v; (4) the state update as a GEMM of Vn and kd.
// GCC 12 reports its own _mm512_undefined_ps() inside the intrinsics headers as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "dayzero/core/check.h"
#include "dayzero/kernels/amx_tiles.h"
#include "dayzero/kernels/exp_avx512.h"
#include "dayzero/kernels/kda_detail.h"
#include "dayzero/kernels/transpose_avx512.h"

namespace dz::kernels::kda_detail {
namespace {

using detail::exp_ps;
using detail::transpose16;

struct ChunkArgs {
  const float *q, *k, *v, *g, *beta;
  int64_t num_heads;
  float sc;
};

// Lane j of the result = the sum of the 16 floats of row j (rows 16 floats apart): a pairwise
// tree, 45 shuffles and adds for 16 sums where 16 separate reductions take 128.
inline __m512 hsum16(const float* rows) {
  __m512 t[8], u[4];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    const __m512 a = _mm512_load_ps(rows + 32 * i), b = _mm512_load_ps(rows + 32 * i + 16);
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // u[i], block b: the partial sums over block b of rows 4i … 4i + 3.
  const __m512 x0 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 x1 =
      _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD));
}

// ---------------------------------------------------------------- AMX-BF16×3 state products
// Each FP32 operand x is split into hi = bf16(x) and lo = bf16(x − hi); a product is taken as
// hi·hi + hi·lo + lo·hi with FP32 accumulation in the tiles. The dropped lo·lo term and the
// rounding of lo are each ≤ 2^−16 relative, so the products carry ≈ 2^−17 relative error (RMS):
// ≈ 4e-6 relative RMS on the outputs at d = 128 (simulated against FP64), inside the 1e-5 of
// docs/models.md §4.8, where plain BF16 products (≈ 2e-3) are not. All 8 tiles are 16 rows × 64
// bytes.

// hi = bf16(x), lo = bf16(x − hi) for 16 floats (round to nearest even).
inline void split16(__m512 x, __m256i& hi, __m256i& lo) {
  hi = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(x));
  const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(hi), 16));
  lo = std::bit_cast<__m256i>(_mm512_cvtneps_pbh(_mm512_sub_ps(x, hf)));
}

// Rows of FP32 (row stride `stride`, `cols` a multiple of 16) to BF16 hi/lo rows (stride cols).
void split_rows(const float* x, int64_t rows, int64_t cols, int64_t stride, uint16_t* hi,
                uint16_t* lo) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += 16) {
      __m256i h, l;
      split16(_mm512_loadu_ps(x + r * stride + c), h, l);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + r * cols + c), h);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + r * cols + c), l);
    }
  }
}

// One 1-KiB VNNI tile of B: 16 rows (pairs of the depth axis) × 16 columns × 2 BF16.
inline uint16_t* vnni_tile(uint16_t* base, int64_t depth_block, int64_t col_block,
                           int64_t col_blocks) {
  return base + (depth_block * col_blocks + col_block) * 512;
}

// S0 (V-first [d_v, d_k], FP32) as the B operand of Σ_k X[r, k] S0[v, k]: depth k, columns v.
// Tile (kb, vb) row j holds, for each v of the block, the pair S0[v, 32 kb + 2j … + 1], i.e. the
// 32-bit transpose of the state's BF16 pairs. Then S ← decay ⊙ S0 in place (the update's start).
template <int NB>
void pack_state(float* s, const float* decay, uint16_t* s_hi, uint16_t* s_lo) {
  constexpr int64_t d = NB * 16;
  alignas(64) uint32_t th[256], tl[256];
  for (int64_t vb = 0; vb < d / 16; ++vb) {
    for (int64_t kb = 0; kb < d / 32; ++kb) {
      const __m512 d0 = _mm512_load_ps(decay + 32 * kb), d1 = _mm512_load_ps(decay + 32 * kb + 16);
      for (int64_t vr = 0; vr < 16; ++vr) {
        float* srow = s + (16 * vb + vr) * d + 32 * kb;
        const __m512 x0 = _mm512_loadu_ps(srow), x1 = _mm512_loadu_ps(srow + 16);
        __m256i h0, l0, h1, l1;
        split16(x0, h0, l0);
        split16(x1, h1, l1);
        _mm512_store_si512(th + 16 * vr, _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1));
        _mm512_store_si512(tl + 16 * vr, _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1));
        _mm512_storeu_ps(srow, _mm512_mul_ps(x0, d0));
        _mm512_storeu_ps(srow + 16, _mm512_mul_ps(x1, d1));
      }
      transpose16(reinterpret_cast<const float*>(th), 16,
                  reinterpret_cast<float*>(vnni_tile(s_hi, kb, vb, d / 16)), 16);
      transpose16(reinterpret_cast<const float*>(tl), 16,
                  reinterpret_cast<float*>(vnni_tile(s_lo, kb, vb, d / 16)), 16);
    }
  }
}

// kd [c32, d] (FP32 rows, zero beyond the chunk) as the B operand of Σ_c Vnᵀ[v, c] kd[c, k]:
// depth c, columns k; tile (cb, kb) row j interleaves rows 32 cb + 2j and + 1.
template <int NB>
void pack_kd(const float* kd, int64_t c32, uint16_t* kd_hi, uint16_t* kd_lo) {
  constexpr int64_t d = NB * 16;
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t c = 0; c < c32; c += 2) {
    const int64_t cb = c / 32, j = (c % 32) / 2;
    for (int64_t kb = 0; kb < d / 16; ++kb) {
      __m256i h0, l0, h1, l1;
      split16(_mm512_load_ps(kd + c * d + 16 * kb), h0, l0);
      split16(_mm512_load_ps(kd + (c + 1) * d + 16 * kb), h1, l1);
      _mm512_store_si512(vnni_tile(kd_hi, cb, kb, d / 16) + 32 * j,
                         _mm512_permutexvar_epi16(
                             interleave, _mm512_inserti64x4(_mm512_castsi256_si512(h0), h1, 1)));
      _mm512_store_si512(vnni_tile(kd_lo, cb, kb, d / 16) + 32 * j,
                         _mm512_permutexvar_epi16(
                             interleave, _mm512_inserti64x4(_mm512_castsi256_si512(l0), l1, 1)));
    }
  }
}

// btr[r, v] = Σ_k kg[r, k] S0[v, k] and otr[r, v] = Σ_k qg[r, k] S0[v, k] (A: kg, qg hi/lo rows
// [cp, d] BF16; B: the packed state), 2 × 2 accumulator tiles per step.
__attribute__((target("amx-tile,amx-bf16"))) void amx_state_reads(
    const uint16_t* kg_hi, const uint16_t* kg_lo, const uint16_t* qg_hi, const uint16_t* qg_lo,
    const uint16_t* s_hi, const uint16_t* s_lo, int64_t d, int64_t cp, float* btr, float* otr) {
  const int64_t a_stride = d * 2, c_stride = d * 4, vbs = d / 16;
  auto tile = [&](const uint16_t* base, int64_t kb, int64_t vb) {
    return base + (kb * vbs + vb) * 512;
  };
  for (int64_t rb = 0; rb < cp / 16; ++rb) {
    for (int64_t vb = 0; vb < vbs; vb += 2) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb = 0; kb < d / 32; ++kb) {
        const int64_t a_off = rb * 16 * d + kb * 32;
        _tile_loadd(4, kg_hi + a_off, a_stride);
        _tile_loadd(5, qg_hi + a_off, a_stride);
        _tile_loadd(6, tile(s_hi, kb, vb), 64);
        _tile_loadd(7, tile(s_hi, kb, vb + 1), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(6, tile(s_lo, kb, vb), 64);
        _tile_loadd(7, tile(s_lo, kb, vb + 1), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(4, kg_lo + a_off, a_stride);
        _tile_loadd(5, qg_lo + a_off, a_stride);
        _tile_loadd(6, tile(s_hi, kb, vb), 64);
        _tile_loadd(7, tile(s_hi, kb, vb + 1), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      float* b0 = btr + rb * 16 * d + vb * 16;
      float* o0 = otr + rb * 16 * d + vb * 16;
      _tile_stored(0, b0, c_stride);
      _tile_stored(1, b0 + 16, c_stride);
      _tile_stored(2, o0, c_stride);
      _tile_stored(3, o0 + 16, c_stride);
    }
  }
}

// S[v, k] += Σ_c Vnᵀ[v, c] kd[c, k] on the decayed state (A: Vnᵀ hi/lo [d, c32]; B: packed kd).
__attribute__((target("amx-tile,amx-bf16"))) void amx_state_update(const uint16_t* vt_hi,
                                                                   const uint16_t* vt_lo,
                                                                   const uint16_t* kd_hi,
                                                                   const uint16_t* kd_lo, int64_t d,
                                                                   int64_t c32, float* s) {
  const int64_t a_stride = c32 * 2, c_stride = d * 4, kbs = d / 16;
  auto tile = [&](const uint16_t* base, int64_t cb, int64_t kb) {
    return base + (cb * kbs + kb) * 512;
  };
  for (int64_t vb = 0; vb < d / 16; vb += 2) {
    for (int64_t kb = 0; kb < kbs; kb += 2) {
      float* s0 = s + vb * 16 * d + kb * 16;
      float* s1 = s0 + 16 * d;
      _tile_loadd(0, s0, c_stride);
      _tile_loadd(1, s0 + 16, c_stride);
      _tile_loadd(2, s1, c_stride);
      _tile_loadd(3, s1 + 16, c_stride);
      for (int64_t cb = 0; cb < c32 / 32; ++cb) {
        const int64_t a_off = vb * 16 * c32 + cb * 32;
        _tile_loadd(4, vt_hi + a_off, a_stride);
        _tile_loadd(5, vt_hi + a_off + 16 * c32, a_stride);
        _tile_loadd(6, tile(kd_hi, cb, kb), 64);
        _tile_loadd(7, tile(kd_hi, cb, kb + 1), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(6, tile(kd_lo, cb, kb), 64);
        _tile_loadd(7, tile(kd_lo, cb, kb + 1), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
        _tile_loadd(4, vt_lo + a_off, a_stride);
        _tile_loadd(5, vt_lo + a_off + 16 * c32, a_stride);
        _tile_loadd(6, tile(kd_hi, cb, kb), 64);
        _tile_loadd(7, tile(kd_hi, cb, kb + 1), 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, s0, c_stride);
      _tile_stored(1, s0 + 16, c_stride);
      _tile_stored(2, s1, c_stride);
      _tile_stored(3, s1 + 16, c_stride);
    }
  }
}

// Runs with FTZ/DAZ set by the caller: decay products that fall below FLT_MIN become 0 instead of
// slow subnormals (their terms are negligible, ≤ 2^−126 of the leading ones).
// Head h's rows of tokens [t_begin, t_end) of q, k, v and g towards L2. Rows of one head are
// H·d floats apart (16 KiB at Kimi-Linear's dims): every row sits on its own page, which the
// hardware prefetchers do not cross, so without this each row's first touch waits on DRAM.
inline void prefetch_rows(const ChunkArgs& a, int64_t d, int64_t h, int64_t t_begin,
                          int64_t t_end) {
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int64_t off = (t * a.num_heads + h) * d;
    for (int64_t i = 0; i < d; i += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(a.q + off + i), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(a.k + off + i), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(a.v + off + i), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(a.g + off + i), _MM_HINT_T1);
    }
  }
}

// kAmx: the three state products on AMX tiles (BF16×3), the rest as below.
template <int NB, bool kAmx>
void chunk_avx512(const ChunkArgs& a, int64_t t0, int64_t n, int64_t h, float* s, float* out,
                  const ChunkBuffers& b) {
  constexpr int64_t d = NB * 16;
  const int64_t H = a.num_heads, cp = padded_chunk(n), c32 = amx_padded_chunk(n);
  uint16_t* kg_hi = b.amx;
  uint16_t* kg_lo = kg_hi + cp * d;
  uint16_t* qg_hi = kg_lo + cp * d;
  uint16_t* qg_lo = qg_hi + cp * d;
  uint16_t* s_hi = qg_lo + cp * d;
  uint16_t* s_lo = s_hi + d * d;
  uint16_t* vt_hi = s_lo + d * d;
  uint16_t* vt_lo = vt_hi + d * c32;
  uint16_t* kd_hi = vt_lo + d * c32;
  uint16_t* kd_lo = kd_hi + c32 * d;
  auto row = [&](const float* x, int64_t r) { return x + ((t0 + r) * H + h) * d; };
  const __m512 sc = _mm512_set1_ps(a.sc);
  float* bet = b.run;  // β of the chunk's rows, contiguous
  for (int64_t r = 0; r < n; ++r) bet[r] = a.beta[(t0 + r) * H + h];

  // (1) α_r = exp(g_r) ≤ 1, one exponential per token and channel. kd holds α first: row c of α
  // is last read by column c − 1, before kd_c replaces it.
  float* alpha = b.kd;
  for (int64_t r = 0; r < n; ++r) {
    const float* gr = row(a.g, r);
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      _mm512_store_ps(alpha + r * d + 16 * i, exp_ps(_mm512_loadu_ps(gr + 16 * i)));
    }
  }
  // Column c = −1 (the chunk start): kg_r = exp(Γ_r) ⊙ k_r and qg_r = sc · exp(Γ_r) ⊙ q_r as the
  // running product of α from the chunk start, row-major with zero padding rows n … cp − 1, then
  // transposed (chunk axis in lanes) for the state products.
  {
    __m512 p[NB];
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) p[i] = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < n; ++r) {
      const float *kr = row(a.k, r), *qr = row(a.q, r);
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        p[i] = _mm512_mul_ps(p[i], _mm512_load_ps(alpha + r * d + 16 * i));
        _mm512_store_ps(b.kg + r * d + 16 * i, _mm512_mul_ps(p[i], _mm512_loadu_ps(kr + 16 * i)));
        _mm512_store_ps(b.qg + r * d + 16 * i,
                        _mm512_mul_ps(_mm512_mul_ps(p[i], sc), _mm512_loadu_ps(qr + 16 * i)));
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) _mm512_store_ps(b.decay + 16 * i, p[i]);
    std::fill(b.kg + n * d, b.kg + cp * d, 0.0f);
    std::fill(b.qg + n * d, b.qg + cp * d, 0.0f);
    for (int64_t r0 = 0; r0 < (kAmx ? 0 : cp); r0 += 16) {
      for (int64_t k0 = 0; k0 < d; k0 += 16) {
        transpose16(b.kg + r0 * d + k0, d, b.kg_t + k0 * cp + r0, cp);
        transpose16(b.qg + r0 * d + k0, d, b.qg_t + k0 * cp + r0, cp);
      }
    }
  }
  // Columns c ≥ 0: t = k_c ⊙ D(r, c) carried down the rows (t ← t ⊙ α_r), so each pair costs one
  // multiply and two FMAs per channel vector; the per-row partial sums of L and A go to lk/aq
  // (16 floats per row) and are reduced 16 rows at a time. L and A are stored transposed
  // (lt[c·cp + r]), so a column is one vector store. kd_c = k_c ⊙ D(last, c) is t at the end.
  float* lk = b.bt;  // free until (2)
  float* aq = b.ot;
  for (int64_t c = 0; c < n; ++c) {
    const float *kc = row(a.k, c), *qc = row(a.q, c);
    __m512 t[NB];
    __m512 diag = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      t[i] = _mm512_loadu_ps(kc + 16 * i);
      diag = _mm512_fmadd_ps(t[i], _mm512_loadu_ps(qc + 16 * i), diag);
    }
    b.a[c * cp + c] = a.sc * _mm512_reduce_add_ps(diag);
    for (int64_t r = c + 1; r < n; ++r) {
      const float *kr = row(a.k, r), *qr = row(a.q, r);
      __m512 l0 = _mm512_setzero_ps(), l1 = _mm512_setzero_ps();
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int i = 0; i < NB; i += 2) {
        t[i] = _mm512_mul_ps(t[i], _mm512_load_ps(alpha + r * d + 16 * i));
        t[i + 1] = _mm512_mul_ps(t[i + 1], _mm512_load_ps(alpha + r * d + 16 * i + 16));
        l0 = _mm512_fmadd_ps(_mm512_loadu_ps(kr + 16 * i), t[i], l0);
        l1 = _mm512_fmadd_ps(_mm512_loadu_ps(kr + 16 * i + 16), t[i + 1], l1);
        a0 = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * i), t[i], a0);
        a1 = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * i + 16), t[i + 1], a1);
      }
      _mm512_store_ps(lk + (r - c - 1) * 16, _mm512_add_ps(l0, l1));
      _mm512_store_ps(aq + (r - c - 1) * 16, _mm512_add_ps(a0, a1));
    }
    for (int64_t r0 = c + 1; r0 < n; r0 += 16) {
      const auto live =
          static_cast<__mmask16>(n - r0 >= 16 ? 0xFFFF : (1u << static_cast<unsigned>(n - r0)) - 1);
      const __m512 bv = _mm512_maskz_loadu_ps(live, bet + r0);
      _mm512_mask_storeu_ps(b.l + c * cp + r0, live,
                            _mm512_mul_ps(bv, hsum16(lk + (r0 - c - 1) * 16)));
      _mm512_mask_storeu_ps(b.a + c * cp + r0, live,
                            _mm512_mul_ps(sc, hsum16(aq + (r0 - c - 1) * 16)));
    }
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) _mm512_store_ps(b.kd + c * d + 16 * i, t[i]);
  }

  float* btr = b.kg;
  float* otr = b.qg;
  if constexpr (kAmx) {
    // (2, AMX) btr = kg S0ᵀ, otr = qg S0ᵀ straight into rows; the state is packed, then decayed.
    split_rows(b.kg, cp, d, d, kg_hi, kg_lo);
    split_rows(b.qg, cp, d, d, qg_hi, qg_lo);
    pack_state<NB>(s, b.decay, s_hi, s_lo);
    amx_state_reads(kg_hi, kg_lo, qg_hi, qg_lo, s_hi, s_lo, d, cp, btr, otr);
  } else {
    // (2) bt[v, r] = Σ_k S0[v, k] kg[r, k], ot[v, r] = Σ_k S0[v, k] qg[r, k]: tiles of 8 state rows
    // × 16 chunk rows, 16 accumulators.
    constexpr int kRows = 8;
    for (int64_t v0 = 0; v0 < d; v0 += kRows) {
      for (int64_t r0 = 0; r0 < cp; r0 += 16) {
        __m512 acc_b[kRows], acc_o[kRows];
#pragma GCC unroll 16
        for (int i = 0; i < kRows; ++i) acc_b[i] = acc_o[i] = _mm512_setzero_ps();
        const float* srows = s + v0 * d;
        for (int64_t kk = 0; kk < d; ++kk) {
          const __m512 kt = _mm512_load_ps(b.kg_t + kk * cp + r0);
          const __m512 qt = _mm512_load_ps(b.qg_t + kk * cp + r0);
#pragma GCC unroll 16
          for (int i = 0; i < kRows; ++i) {
            const __m512 sv = _mm512_set1_ps(srows[i * d + kk]);
            acc_b[i] = _mm512_fmadd_ps(sv, kt, acc_b[i]);
            acc_o[i] = _mm512_fmadd_ps(sv, qt, acc_o[i]);
          }
        }
#pragma GCC unroll 16
        for (int i = 0; i < kRows; ++i) {
          _mm512_store_ps(b.bt + (v0 + i) * cp + r0, acc_b[i]);
          _mm512_store_ps(b.ot + (v0 + i) * cp + r0, acc_o[i]);
        }
      }
    }
    // Back to rows (kg, qg are free now): btr[r, v] = bt[v, r], otr[r, v] = ot[v, r].
    for (int64_t v0 = 0; v0 < d; v0 += 16) {
      for (int64_t r0 = 0; r0 < cp; r0 += 16) {
        transpose16(b.bt + v0 * cp + r0, cp, btr + r0 * d + v0, d);
        transpose16(b.ot + v0 * cp + r0, cp, otr + r0 * d + v0, d);
      }
    }
  }

  // (3) Vn_r = β_r (v_r − btr_r) − Σ_{c<r} L[r, c] Vn_c, then O_r = otr_r + Σ_{c≤r} A[r, c] Vn_c,
  // both over v in registers.
  for (int64_t r = 0; r < n; ++r) {
    const float* vr = row(a.v, r);
    const __m512 br = _mm512_set1_ps(bet[r]);
    __m512 x[NB], o[NB];
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      x[i] = _mm512_mul_ps(
          br, _mm512_sub_ps(_mm512_loadu_ps(vr + 16 * i), _mm512_load_ps(btr + r * d + 16 * i)));
      o[i] = _mm512_load_ps(otr + r * d + 16 * i);
    }
    for (int64_t c = 0; c < r; ++c) {
      const __m512 lrc = _mm512_set1_ps(b.l[c * cp + r]);
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        x[i] = _mm512_fnmadd_ps(lrc, _mm512_load_ps(b.vn + c * d + 16 * i), x[i]);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) _mm512_store_ps(b.vn + r * d + 16 * i, x[i]);
    for (int64_t c = 0; c <= r; ++c) {
      const __m512 arc = _mm512_set1_ps(b.a[c * cp + r]);
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        o[i] = _mm512_fmadd_ps(arc, _mm512_load_ps(b.vn + c * d + 16 * i), o[i]);
      }
    }
    float* orow = out + ((t0 + r) * H + h) * d;
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) _mm512_storeu_ps(orow + 16 * i, o[i]);
  }

  if constexpr (kAmx) {
    // (4, AMX) S = decay ⊙ S0 (done by pack_state) + Vnᵀ kd, the chunk axis padded to 32 rows.
    std::fill(b.vn + n * d, b.vn + c32 * d, 0.0f);
    std::fill(b.kd + n * d, b.kd + c32 * d, 0.0f);
    for (int64_t v0 = 0; v0 < d; v0 += 16) {
      for (int64_t c0 = 0; c0 < c32; c0 += 16) {
        transpose16(b.vn + c0 * d + v0, d, b.vt + v0 * c32 + c0, c32);
      }
    }
    split_rows(b.vt, d, c32, c32, vt_hi, vt_lo);
    pack_kd<NB>(b.kd, c32, kd_hi, kd_lo);
    amx_state_update(vt_hi, vt_lo, kd_hi, kd_lo, d, c32, s);
    return;
  }
  // (4) S[v, :] = exp(Γ_last) ⊙ S0[v, :] + Σ_c Vn_c[v] kd_c: tiles of kVr rows × d, 16
  // accumulators.
  constexpr int kVr = 16 / NB;
  for (int64_t v0 = 0; v0 < d; v0 += kVr) {
    __m512 acc[kVr][NB];
#pragma GCC unroll 16
    for (int j = 0; j < kVr; ++j) {
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        acc[j][i] = _mm512_mul_ps(_mm512_load_ps(b.decay + 16 * i),
                                  _mm512_loadu_ps(s + (v0 + j) * d + 16 * i));
      }
    }
    for (int64_t c = 0; c < n; ++c) {
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        const __m512 kdv = _mm512_load_ps(b.kd + c * d + 16 * i);
#pragma GCC unroll 16
        for (int j = 0; j < kVr; ++j) {
          acc[j][i] = _mm512_fmadd_ps(_mm512_set1_ps(b.vn[c * d + v0 + j]), kdv, acc[j][i]);
        }
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < kVr; ++j) {
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) _mm512_storeu_ps(s + (v0 + j) * d + 16 * i, acc[j][i]);
    }
  }
}

// How far ahead the recurrence prefetches its token rows (one token takes ≈ 2 µs per head).
constexpr int64_t kPrefetchTokens = 2;
// Both kernels run a worker's heads in groups of kHeadGroup, token block (recurrence: kTokenBlock
// tokens; chunked: one chunk) by token block, every head of the group in turn. One token's rows of
// neighbouring heads are adjacent (8 heads × 512 B = one 4 KiB page at d = 128), so a page's TLB
// entry and the prefetched lines serve the whole group, where head by head over all tokens each
// row costs a page walk (measured: 1.9 → 1.3 µs per token and head at H 32, T 4096 when the inputs
// are not on huge pages). The group's states (8 × 64 KiB) stay in L2.
constexpr int64_t kHeadGroup = 8;
constexpr int64_t kTokenBlock = 16;

template <int NB>
void recurrent_head_avx512(const ChunkArgs& a, int64_t t_begin, int64_t t_end, int64_t num_tokens,
                           int64_t h, float* s, float* out, const float* s_first) {
  constexpr int64_t d = NB * 16;
  const int64_t H = a.num_heads;
  alignas(64) float alpha[d];
  for (int64_t t = t_begin; t < t_end; ++t) {
    const int64_t base = (t * H + h) * d;
    const float *kt = a.k + base, *qt = a.q + base, *vt = a.v + base;
    if (t + kPrefetchTokens < num_tokens) {  // see prefetch_rows
      prefetch_rows(a, d, h, t + kPrefetchTokens, t + kPrefetchTokens + 1);
    }
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      _mm512_store_ps(alpha + 16 * i, exp_ps(_mm512_loadu_ps(a.g + base + 16 * i)));
    }
    const float bt = a.beta[t * H + h];
    const float* s_read = t == 0 && s_first != nullptr ? s_first : s;
    // One pass per state row v: decay, predict v from k, correct, read out with q.
    for (int64_t vi = 0; vi < d; ++vi) {
      float* srow = s + vi * d;
      const float* read_row = s_read + vi * d;
      __m512 x[NB];
      __m512 pred = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        x[i] = _mm512_mul_ps(_mm512_loadu_ps(read_row + 16 * i), _mm512_load_ps(alpha + 16 * i));
        pred = _mm512_fmadd_ps(x[i], _mm512_loadu_ps(kt + 16 * i), pred);
      }
      const __m512 u = _mm512_set1_ps(bt * (vt[vi] - _mm512_reduce_add_ps(pred)));
      __m512 o = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        x[i] = _mm512_fmadd_ps(u, _mm512_loadu_ps(kt + 16 * i), x[i]);
        _mm512_storeu_ps(srow + 16 * i, x[i]);
        o = _mm512_fmadd_ps(x[i], _mm512_loadu_ps(qt + 16 * i), o);
      }
      out[base + vi] = a.sc * _mm512_reduce_add_ps(o);
    }
  }
}

}  // namespace

void kda_recurrent_avx512(const ExecContext& ctx, const KdaDims& dims, const float* q,
                          const float* k, const float* v, const float* g, const float* beta,
                          int64_t num_tokens, float* state, float* out, const float* state_in) {
  const int64_t d = dims.head_dim;
  DZ_CHECK(d == 64 || d == 128, "KDA AVX-512 head_dim {}", d);
  const ChunkArgs args{q, k, v, g, beta, dims.num_heads, 1.0f / std::sqrt(static_cast<float>(d))};
  // Per head and token: decay, S'ᵀk, the rank-1 update and Sᵀq over d × d (≈ 8 d² FLOPs).
  const int64_t head_flops = num_tokens * 8 * d * d;
  const int64_t grain = grain_for_work(head_flops, kMinParallelFlops);
  parallel_for(ctx, dims.num_heads, grain, [&](int64_t h_begin, int64_t h_end) {
    // Groups of kHeadGroup heads walk the tokens in blocks (see kHeadGroup).
    for (int64_t hg = h_begin; hg < h_end; hg += kHeadGroup) {
      const int64_t hg_end = std::min(hg + kHeadGroup, h_end);
      for (int64_t t0 = 0; t0 < num_tokens; t0 += kTokenBlock) {
        const int64_t t1 = std::min(t0 + kTokenBlock, num_tokens);
        for (int64_t h = hg; h < hg_end; ++h) {
          const float* first = state_in != nullptr ? state_in + h * d * d : nullptr;
          if (d == 128) {
            recurrent_head_avx512<8>(args, t0, t1, num_tokens, h, state + h * d * d, out, first);
          } else {
            recurrent_head_avx512<4>(args, t0, t1, num_tokens, h, state + h * d * d, out, first);
          }
        }
      }
    }
  });
}

void kda_chunked_avx512(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                        const float* v, const float* g, const float* beta, int64_t num_tokens,
                        int64_t pos_begin, int64_t chunk_size, float* state, float* out,
                        Arena& scratch, bool use_amx) {
  const int64_t d = dims.head_dim;
  DZ_CHECK(d == 64 || d == 128, "KDA AVX-512 head_dim {}", d);
  DZ_CHECK(chunk_size >= 1 && chunk_size <= 64, "KDA chunk_size {} not in [1, 64]", chunk_size);
  DZ_CHECK(pos_begin >= 0, "pos_begin {}", pos_begin);
  if (num_tokens <= 0) return;
  const int64_t workers = num_workers(ctx, dims);
  const size_t slice_bytes = chunk_buffer_bytes(dims, chunk_size);
  std::byte* base = scratch.allocate(static_cast<size_t>(workers) * slice_bytes, 64).data();
  const int64_t grain = (dims.num_heads + workers - 1) / workers;
  const ChunkArgs args{q, k, v, g, beta, dims.num_heads, 1.0f / std::sqrt(static_cast<float>(d))};
  parallel_for(ctx, dims.num_heads, grain, [&](int64_t h_begin, int64_t h_end) {
    const ChunkBuffers b = carve_chunk_buffers(
        base + static_cast<size_t>(h_begin / grain) * slice_bytes, dims, chunk_size);
    const unsigned saved_csr = _mm_getcsr();
    _mm_setcsr(saved_csr | 0x8040);  // FTZ | DAZ for this worker (see chunk_avx512)
    if (use_amx) detail::configure_amx_tiles(8);
    for (int64_t hg = h_begin; hg < h_end; hg += kHeadGroup) {
      const int64_t hg_end = std::min(hg + kHeadGroup, h_end);
      int64_t t0 = 0;
      while (t0 < num_tokens) {
        const int64_t n = std::min(chunk_size - (pos_begin + t0) % chunk_size, num_tokens - t0);
        for (int64_t h = hg; h < hg_end; ++h) {
          // This head's rows of the next chunk while this one computes.
          if (t0 + n < num_tokens) {
            prefetch_rows(args, d, h, t0 + n, std::min(t0 + n + chunk_size, num_tokens));
          }
          float* sh = state + h * d * d;
          if (d == 128) {
            use_amx ? chunk_avx512<8, true>(args, t0, n, h, sh, out, b)
                    : chunk_avx512<8, false>(args, t0, n, h, sh, out, b);
          } else {
            use_amx ? chunk_avx512<4, true>(args, t0, n, h, sh, out, b)
                    : chunk_avx512<4, false>(args, t0, n, h, sh, out, b);
          }
        }
        t0 += n;
      }
    }
    if (use_amx) detail::release_amx_tiles();
    _mm_setcsr(saved_csr);
  });
}

}  // namespace dz::kernels::kda_detail
