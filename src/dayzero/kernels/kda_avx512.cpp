// AVX-512 variants of the KDA kernels (kda.h), vectorised over the contiguous d_k axis of the
// V-first state and of q, k, g, for head_dim = 64 or 128 (NB = head_dim / 16 zmm per row).
//
// Chunked: per chunk and head, (1) the pairwise decays exp(Σ_{c<i≤r} g_i) column by column with a
// running sum in registers, giving L, A, exp(Γ_r) ⊙ k_r and q_r (stored transposed, chunk axis in
// lanes) and exp(Γ_last − Γ_c) ⊙ k_c; (2) S0ᵀ kg and S0ᵀ qg as one register-blocked GEMM over
// the state rows (8 rows × 16 chunk rows per tile, the state element broadcast); (3) forward
// substitution and the intra-chunk output over v; (4) the state update as a GEMM of Vn and kd.
// GCC 12 reports its own _mm512_undefined_ps() inside the intrinsics headers as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "dayzero/core/check.h"
#include "dayzero/kernels/kda_detail.h"

namespace dz::kernels::kda_detail {
namespace {

// exp(x) for x ≤ 0 (any finite value; results below 2^−149 become 0): 2^n · p(r) with a
// Cody–Waite split of ln 2 and a degree-7 Taylor polynomial on |r| ≤ ln2/2 (error ≈ 1 ulp).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

struct ChunkArgs {
  const float *q, *k, *v, *g, *beta;
  int64_t num_heads;
  float sc;
};

template <int NB>
void chunk_avx512(const ChunkArgs& a, int64_t t0, int64_t n, int64_t h, int64_t chunk_size,
                  float* s, float* out, const ChunkBuffers& b) {
  constexpr int64_t d = NB * 16;
  const int64_t H = a.num_heads, C = chunk_size, cp = padded_chunk(chunk_size);
  auto row = [&](const float* x, int64_t r) { return x + ((t0 + r) * H + h) * d; };
  auto bet = [&](int64_t r) { return a.beta[(t0 + r) * H + h]; };
  const __m512 sc = _mm512_set1_ps(a.sc);
  const __m512i lane_rows =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(cp)));

  // (1) Decays as products of per-token factors α_i = exp(g_i) ≤ 1: for a pair r ≥ c,
  // D(r, c) = Π_{c<i≤r} α_i = exp(Γ_r − Γ_c), accumulated from the column's own start, so no factor
  // exceeds 1 (never exp(Γ_r) · exp(−Γ_c)) and one exponential per token and channel suffices.
  // Products below 2^−100 are flushed to 0 (their terms are negligible and subnormal arithmetic is
  // slow). kd holds α first: row c of α is last read by column c − 1, before kd_c replaces it.
  float* alpha = b.kd;
  for (int64_t r = 0; r < n; ++r) {
    const float* gr = row(a.g, r);
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      _mm512_store_ps(alpha + r * d + 16 * i, exp_ps(_mm512_loadu_ps(gr + 16 * i)));
    }
  }
  const __m512 tiny = _mm512_set1_ps(0x1p-100f);
  auto decay_step = [&](__m512 p, int64_t r, int i) {
    p = _mm512_mul_ps(p, _mm512_load_ps(alpha + r * d + 16 * i));
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, tiny, _CMP_GE_OQ), p);
  };
  // Column c = −1 (the chunk start): exp(Γ_r) ⊙ k_r and sc · exp(Γ_r) ⊙ q_r, transposed; the
  // padding rows n … cp−1 are zero so that they contribute nothing to the state products.
  {
    __m512 p[NB];
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) p[i] = _mm512_set1_ps(1.0f);
    for (int64_t r = 0; r < n; ++r) {
      const float *kr = row(a.k, r), *qr = row(a.q, r);
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        p[i] = decay_step(p[i], r, i);
        _mm512_i32scatter_ps(b.kg_t + 16 * i * cp + r, lane_rows,
                             _mm512_mul_ps(p[i], _mm512_loadu_ps(kr + 16 * i)), 4);
        _mm512_i32scatter_ps(b.qg_t + 16 * i * cp + r, lane_rows,
                             _mm512_mul_ps(_mm512_mul_ps(p[i], sc), _mm512_loadu_ps(qr + 16 * i)),
                             4);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) _mm512_store_ps(b.decay + 16 * i, p[i]);
    for (int64_t kk = 0; kk < d; ++kk) {
      for (int64_t r = n; r < cp; ++r) b.kg_t[kk * cp + r] = b.qg_t[kk * cp + r] = 0.0f;
    }
  }
  // Columns c ≥ 0: L[r, c] and A[r, c] from D(r, c), then kd_c = D(last, c) ⊙ k_c.
  for (int64_t c = 0; c < n; ++c) {
    const float *kc = row(a.k, c), *qc = row(a.q, c);
    __m512 kcv[NB], p[NB];
    __m512 diag = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      kcv[i] = _mm512_loadu_ps(kc + 16 * i);
      p[i] = _mm512_set1_ps(1.0f);  // D(c, c)
      diag = _mm512_fmadd_ps(kcv[i], _mm512_loadu_ps(qc + 16 * i), diag);
    }
    b.a[c * C + c] = a.sc * _mm512_reduce_add_ps(diag);
    for (int64_t r = c + 1; r < n; ++r) {
      const float *kr = row(a.k, r), *qr = row(a.q, r);
      __m512 lk = _mm512_setzero_ps(), aq = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        p[i] = decay_step(p[i], r, i);
        const __m512 t = _mm512_mul_ps(kcv[i], p[i]);
        lk = _mm512_fmadd_ps(_mm512_loadu_ps(kr + 16 * i), t, lk);
        aq = _mm512_fmadd_ps(_mm512_loadu_ps(qr + 16 * i), t, aq);
      }
      b.l[r * C + c] = bet(r) * _mm512_reduce_add_ps(lk);
      b.a[r * C + c] = a.sc * _mm512_reduce_add_ps(aq);
    }
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i)
      _mm512_store_ps(b.kd + c * d + 16 * i, _mm512_mul_ps(kcv[i], p[i]));
  }

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

  // (3) Vn_r = β_r (v_r − bt[:, r]) − Σ_{c<r} L[r, c] Vn_c, then O_r = ot[:, r] + Σ_{c≤r} A[r, c]
  // Vn_c, both over v in registers.
  for (int64_t r = 0; r < n; ++r) {
    const float* vr = row(a.v, r);
    const __m512 br = _mm512_set1_ps(bet(r));
    __m512 x[NB], o[NB];
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      const __m512 btv = _mm512_i32gather_ps(lane_rows, b.bt + 16 * i * cp + r, 4);
      x[i] = _mm512_mul_ps(br, _mm512_sub_ps(_mm512_loadu_ps(vr + 16 * i), btv));
      o[i] = _mm512_i32gather_ps(lane_rows, b.ot + 16 * i * cp + r, 4);
    }
    for (int64_t c = 0; c < r; ++c) {
      const __m512 lrc = _mm512_set1_ps(b.l[r * C + c]);
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        x[i] = _mm512_fnmadd_ps(lrc, _mm512_load_ps(b.vn + c * d + 16 * i), x[i]);
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) _mm512_store_ps(b.vn + r * d + 16 * i, x[i]);
    for (int64_t c = 0; c <= r; ++c) {
      const __m512 arc = _mm512_set1_ps(b.a[r * C + c]);
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        o[i] = _mm512_fmadd_ps(arc, _mm512_load_ps(b.vn + c * d + 16 * i), o[i]);
      }
    }
    float* orow = out + ((t0 + r) * H + h) * d;
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) _mm512_storeu_ps(orow + 16 * i, o[i]);
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

template <int NB>
void recurrent_head_avx512(const ChunkArgs& a, int64_t num_tokens, int64_t h, float* s,
                           float* out) {
  constexpr int64_t d = NB * 16;
  const int64_t H = a.num_heads;
  alignas(64) float alpha[d];
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t base = (t * H + h) * d;
    const float *kt = a.k + base, *qt = a.q + base, *vt = a.v + base;
#pragma GCC unroll 16
    for (int i = 0; i < NB; ++i) {
      _mm512_store_ps(alpha + 16 * i, exp_ps(_mm512_loadu_ps(a.g + base + 16 * i)));
    }
    const float bt = a.beta[t * H + h];
    // One pass per state row v: decay, predict v from k, correct, read out with q.
    for (int64_t vi = 0; vi < d; ++vi) {
      float* srow = s + vi * d;
      __m512 x[NB];
      __m512 pred = _mm512_setzero_ps();
#pragma GCC unroll 16
      for (int i = 0; i < NB; ++i) {
        x[i] = _mm512_mul_ps(_mm512_loadu_ps(srow + 16 * i), _mm512_load_ps(alpha + 16 * i));
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
                          int64_t num_tokens, float* state, float* out) {
  const int64_t d = dims.head_dim;
  DZ_CHECK(d == 64 || d == 128, "KDA AVX-512 head_dim {}", d);
  const ChunkArgs args{q, k, v, g, beta, dims.num_heads, 1.0f / std::sqrt(static_cast<float>(d))};
  parallel_for(ctx, dims.num_heads, 1, [&](int64_t h_begin, int64_t h_end) {
    for (int64_t h = h_begin; h < h_end; ++h) {
      if (d == 128) {
        recurrent_head_avx512<8>(args, num_tokens, h, state + h * d * d, out);
      } else {
        recurrent_head_avx512<4>(args, num_tokens, h, state + h * d * d, out);
      }
    }
  });
}

void kda_chunked_avx512(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                        const float* v, const float* g, const float* beta, int64_t num_tokens,
                        int64_t pos_begin, int64_t chunk_size, float* state, float* out,
                        Arena& scratch) {
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
    for (int64_t h = h_begin; h < h_end; ++h) {
      int64_t t0 = 0;
      while (t0 < num_tokens) {
        const int64_t n = std::min(chunk_size - (pos_begin + t0) % chunk_size, num_tokens - t0);
        if (d == 128) {
          chunk_avx512<8>(args, t0, n, h, chunk_size, state + h * d * d, out, b);
        } else {
          chunk_avx512<4>(args, t0, n, h, chunk_size, state + h * d * d, out, b);
        }
        t0 += n;
      }
    }
  });
}

}  // namespace dz::kernels::kda_detail
