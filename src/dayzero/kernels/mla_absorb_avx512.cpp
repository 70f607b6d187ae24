// AVX-512 variants of the absorbed MLA projections (mla_absorb.h), r_kv % 64 == 0, d_v % 4 == 0.
//
// The weights are BF16 codes, widened exactly to FP32 as they are loaded (a zero-extend and a
// 16-bit shift), so the products and sums are those of FP32 weights with the same values.
// absorb_q: per (head, token block), the output is tiled as 64 latent columns (4 zmm) × up to 6
// tokens = 24 accumulators; each step k loads one 64-wide slice of W_UK[h, k, :] and broadcasts
// q_nope[i, h, k] of the 6 tokens (4 widened loads + 6 broadcasts per 24 FMAs). The 64-column
// slice of W_UK_h (d_n × 128 B) stays in L1 across the token tiles of the block.
// expand_o: 4 output rows × up to 4 tokens = 16 accumulators over the r_kv axis (4 weight rows and
// 4 latent rows loaded per 16 FMAs), reduced horizontally at the end; the 4 weight rows (4·r_kv
// BF16) stay in L1 across the token tiles.
// GCC 12 reports its own _mm512_undefined_ps() inside the intrinsics headers as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>

#include "dayzero/core/check.h"
#include "dayzero/kernels/bf16_avx512.h"
#include "dayzero/kernels/mla_absorb.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels {
namespace {

// The weight rows a tile reads next are requested ahead: absorb_q reads 64-column slices of rows
// 2·r_kv bytes apart, expand_o rows in tiles of four. (Measured with FP32 weights:) With few tokens
// the kernels wait on DRAM; measured on AMD Zen 5 (V2-Lite dims, 20 layers of FP32 W_UK / W_UV from
// DRAM, 2 threads, µs per layer, with the loops unrolled): expand_o 1 / 16 / 64 tokens 230–258 /
// 883–902 / 2919 → 92–133 / 269–272 / 824; absorb_q 16 / 64 tokens 488–565 / 1649 → 232–248 / 639
// (8 rows ahead), while at 1 token the hardware prefetcher alone does as well (105–126 µs).
constexpr int64_t kAbsorbPrefetchRows = 8;
constexpr int64_t kExpandPrefetchRows = 4;

constexpr int kQTokens = 6;  // absorb_q tile: tokens × 4 zmm of latent columns
constexpr int kORows = 4;    // expand_o tile: output rows × kOTokens tokens
constexpr int kOTokens = 4;

void check_avx512_dims(const MlaAbsorbDims& d) {
  DZ_CHECK(d.num_heads > 0 && d.nope_dim > 0 && d.latent_dim > 0 && d.v_dim > 0,
           "mla_absorb dims H={} d_n={} r_kv={} d_v={} must be positive", d.num_heads, d.nope_dim,
           d.latent_dim, d.v_dim);
  DZ_CHECK(d.latent_dim % 64 == 0 && d.v_dim % kORows == 0,
           "mla_absorb AVX-512 wants r_kv % 64 == 0 and d_v % 4 == 0, got r_kv={} d_v={}",
           d.latent_dim, d.v_dim);
}

// 16 BF16 codes as FP32 (exact).
inline __m512 load_bf16_16(const uint16_t* codes) {
  return detail::decode_bf16_16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes)));
}

// dst[t][0:64] = Σ_k q[t][k] · w[k·r_kv + 0:64] for NT tokens.
template <int NT>
void absorb_tile(const float* const* q, const uint16_t* w, int64_t d_n, int64_t r_kv,
                 float* const* dst) {
  __m512 acc[NT][4];
  DZ_UNROLL(8)
  for (int t = 0; t < NT; ++t) {
    DZ_UNROLL(8)
    for (int c = 0; c < 4; ++c) acc[t][c] = _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < d_n; ++k) {
    const uint16_t* w_row = w + k * r_kv;
    if (NT > 1 && k + kAbsorbPrefetchRows < d_n)
      for (int line = 0; line < 2; ++line)
        _mm_prefetch(reinterpret_cast<const char*>(w_row + kAbsorbPrefetchRows * r_kv + 32 * line),
                     _MM_HINT_T0);
    const __m512 w0 = load_bf16_16(w_row), w1 = load_bf16_16(w_row + 16);
    const __m512 w2 = load_bf16_16(w_row + 32), w3 = load_bf16_16(w_row + 48);
    DZ_UNROLL(8)
    for (int t = 0; t < NT; ++t) {
      const __m512 b = _mm512_set1_ps(q[t][k]);
      acc[t][0] = _mm512_fmadd_ps(b, w0, acc[t][0]);
      acc[t][1] = _mm512_fmadd_ps(b, w1, acc[t][1]);
      acc[t][2] = _mm512_fmadd_ps(b, w2, acc[t][2]);
      acc[t][3] = _mm512_fmadd_ps(b, w3, acc[t][3]);
    }
  }
  for (int t = 0; t < NT; ++t)
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(dst[t] + 16 * c, acc[t][c]);
}

// dst[t][r] = Σ_j w[r·r_kv + j] · lat[t][j] for kORows rows and NT tokens.
template <int NT>
void expand_tile(const uint16_t* w, int64_t r_kv, const float* const* lat, float* const* dst) {
  __m512 acc[kORows][NT];
  DZ_UNROLL(8)
  for (int r = 0; r < kORows; ++r) {
    DZ_UNROLL(8)
    for (int t = 0; t < NT; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  for (int64_t j = 0; j < r_kv; j += 16) {
    __m512 wr[kORows];
    DZ_UNROLL(8)
    for (int r = 0; r < kORows; ++r) {
      if (j % 32 == 0)  // one 64-byte line holds 32 codes
        _mm_prefetch(reinterpret_cast<const char*>(w + (r + kExpandPrefetchRows) * r_kv + j),
                     _MM_HINT_T0);
      wr[r] = load_bf16_16(w + r * r_kv + j);
    }
    DZ_UNROLL(8)
    for (int t = 0; t < NT; ++t) {
      const __m512 l = _mm512_loadu_ps(lat[t] + j);
      DZ_UNROLL(8)
      for (int r = 0; r < kORows; ++r) acc[r][t] = _mm512_fmadd_ps(wr[r], l, acc[r][t]);
    }
  }
  DZ_UNROLL(8)
  for (int r = 0; r < kORows; ++r) {
    DZ_UNROLL(8)
    for (int t = 0; t < NT; ++t) dst[t][r] = _mm512_reduce_add_ps(acc[r][t]);
  }
}

template <typename Tile>
void for_token_tiles(int64_t i0, int64_t i1, int64_t tile, Tile&& fn) {
  for (int64_t i = i0; i < i1; i += tile) fn(i, static_cast<int>(std::min(tile, i1 - i)));
}

}  // namespace

void mla_absorb_q_avx512(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaAbsorbQ& args,
                         int64_t num_tokens) {
  check_avx512_dims(dims);
  if (num_tokens <= 0) return;
  const int64_t H = dims.num_heads, d_n = dims.nope_dim, r_kv = dims.latent_dim;
  const int64_t num_blocks = (num_tokens + kMlaAbsorbTokenBlock - 1) / kMlaAbsorbTokenBlock;
  const int64_t item_flops = std::min(num_tokens, kMlaAbsorbTokenBlock) * 2 * d_n * r_kv;
  const int64_t grain = grain_for_work(item_flops, kMinParallelFlops);
  parallel_for(ctx, H * num_blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / num_blocks, i0 = item % num_blocks * kMlaAbsorbTokenBlock;
      const int64_t i1 = std::min(i0 + kMlaAbsorbTokenBlock, num_tokens);
      const uint16_t* w = args.w_uk + h * d_n * r_kv;
      for (int64_t j0 = 0; j0 < r_kv; j0 += 64) {
        for_token_tiles(i0, i1, kQTokens, [&](int64_t i, int nt) {
          const float* q[kQTokens];
          float* dst[kQTokens];
          for (int t = 0; t < nt; ++t) {
            q[t] = args.q_nope + (i + t) * args.token_stride + h * args.head_stride;
            dst[t] = args.q_abs + ((i + t) * H + h) * r_kv + j0;
          }
          switch (nt) {
            case 6:
              absorb_tile<6>(q, w + j0, d_n, r_kv, dst);
              break;
            case 5:
              absorb_tile<5>(q, w + j0, d_n, r_kv, dst);
              break;
            case 4:
              absorb_tile<4>(q, w + j0, d_n, r_kv, dst);
              break;
            case 3:
              absorb_tile<3>(q, w + j0, d_n, r_kv, dst);
              break;
            case 2:
              absorb_tile<2>(q, w + j0, d_n, r_kv, dst);
              break;
            default:
              absorb_tile<1>(q, w + j0, d_n, r_kv, dst);
              break;
          }
        });
      }
    }
  });
}

void mla_expand_o_avx512(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaExpandO& args,
                         int64_t num_tokens) {
  check_avx512_dims(dims);
  if (num_tokens <= 0) return;
  const int64_t H = dims.num_heads, d_v = dims.v_dim, r_kv = dims.latent_dim;
  const int64_t num_blocks = (num_tokens + kMlaAbsorbTokenBlock - 1) / kMlaAbsorbTokenBlock;
  const int64_t item_flops = std::min(num_tokens, kMlaAbsorbTokenBlock) * 2 * d_v * r_kv;
  const int64_t grain = grain_for_work(item_flops, kMinParallelFlops);
  parallel_for(ctx, H * num_blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / num_blocks, i0 = item % num_blocks * kMlaAbsorbTokenBlock;
      const int64_t i1 = std::min(i0 + kMlaAbsorbTokenBlock, num_tokens);
      for (int64_t k0 = 0; k0 < d_v; k0 += kORows) {
        const uint16_t* w = args.w_uv + (h * d_v + k0) * r_kv;
        for_token_tiles(i0, i1, kOTokens, [&](int64_t i, int nt) {
          const float* lat[kOTokens];
          float* dst[kOTokens];
          for (int t = 0; t < nt; ++t) {
            lat[t] = args.o_lat + ((i + t) * H + h) * r_kv;
            dst[t] = args.o + ((i + t) * H + h) * d_v + k0;
          }
          switch (nt) {
            case 4:
              expand_tile<4>(w, r_kv, lat, dst);
              break;
            case 3:
              expand_tile<3>(w, r_kv, lat, dst);
              break;
            case 2:
              expand_tile<2>(w, r_kv, lat, dst);
              break;
            default:
              expand_tile<1>(w, r_kv, lat, dst);
              break;
          }
        });
      }
    }
  });
}

}  // namespace dz::kernels
