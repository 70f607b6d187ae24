#include "dayzero/kernels/kda.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/kda_detail.h"

namespace dz::kernels {
namespace kda_detail {
namespace {

size_t align64(size_t num_bytes) {
  return (num_bytes + 63) / 64 * 64;
}

}  // namespace

size_t chunk_buffer_bytes(const KdaDims& dims, int64_t chunk_size) {
  const auto d = static_cast<size_t>(dims.head_dim);
  const auto cp = static_cast<size_t>(padded_chunk(chunk_size));
  const auto c32 = static_cast<size_t>(amx_padded_chunk(chunk_size));
  return 2 * align64(cp * d * 4) + 2 * align64(c32 * d * 4) + 4 * align64(d * cp * 4) +
         2 * align64(cp * cp * 4) + 2 * align64(d * 4) + align64(d * c32 * 4) +
         align64(amx_buffer_elems(dims, chunk_size) * 2);
}

ChunkBuffers carve_chunk_buffers(std::byte* base, const KdaDims& dims, int64_t chunk_size) {
  const auto d = static_cast<size_t>(dims.head_dim);
  const auto cp = static_cast<size_t>(padded_chunk(chunk_size));
  const auto c32 = static_cast<size_t>(amx_padded_chunk(chunk_size));
  size_t offset = 0;
  auto take = [&](size_t num_floats) {
    float* p = reinterpret_cast<float*>(base + offset);
    offset += align64(num_floats * 4);
    return p;
  };
  ChunkBuffers b;
  b.kg = take(cp * d);
  b.qg = take(cp * d);
  b.kd = take(c32 * d);
  b.vn = take(c32 * d);
  b.kg_t = take(d * cp);
  b.qg_t = take(d * cp);
  b.bt = take(d * cp);
  b.ot = take(d * cp);
  b.l = take(cp * cp);
  b.a = take(cp * cp);
  b.decay = take(d);
  b.run = take(d);
  b.vt = take(d * c32);
  b.amx = reinterpret_cast<uint16_t*>(take(amx_buffer_elems(dims, chunk_size) / 2));
  return b;
}

// kda_chunked takes the AMX variant for chunk_size ≥ 32 only: there its state products are ≈ 25 %
// (C 32) to 40 % (C 64) faster than the FP32 FMA kernel; at C 16 the gain was ≈ 5 %, within the
// noise, for ≈ 20× the rounding error (≈ 4e-6 instead of 2e-7 relative RMS, both inside 1e-5).
bool amx_available(const KdaDims& dims) {
  return cpu_features().amx_bf16 && kda_avx512_available(dims);
}

int64_t num_workers(const ExecContext& ctx, const KdaDims& dims) {
  return std::max<int64_t>(1, std::min<int64_t>(ctx.num_threads, dims.num_heads));
}

}  // namespace kda_detail

namespace {

using kda_detail::ChunkBuffers;

void check_dims(const KdaDims& dims) {
  DZ_CHECK(dims.num_heads > 0 && dims.head_dim > 0, "KDA dims H = {}, d = {}", dims.num_heads,
           dims.head_dim);
}

// One chunk of n rows (tokens t0 … t0 + n − 1) of head h, docs/models.md §4.7. Every decay factor
// is exp of a sum of gates over a token range inside the chunk, accumulated pairwise from column c
// (never exp(Γ_r) · exp(−Γ_c)), so it is ≤ 1 and its relative error is that of the range's own
// sum, not of the chunk's cumulative Γ.
void chunk_plain(const KdaDims& dims, const float* q, const float* k, const float* v,
                 const float* g, const float* beta, int64_t t0, int64_t n, int64_t h, float* s,
                 float* out, const ChunkBuffers& b) {
  const int64_t H = dims.num_heads, d = dims.head_dim, C = n;
  const float sc = 1.0f / std::sqrt(static_cast<float>(d));
  auto row = [&](const float* x, int64_t r) { return x + ((t0 + r) * H + h) * d; };
  auto bet = [&](int64_t r) { return beta[(t0 + r) * H + h]; };

  // Column c = −1 is the chunk start (exp(Γ_r) for kg, qg and the state decay).
  for (int64_t c = -1; c < n; ++c) {
    std::fill(b.run, b.run + d, 0.0f);
    const float* kc = c >= 0 ? row(k, c) : nullptr;
    if (c >= 0) {
      float dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += row(q, c)[i] * kc[i];
      b.a[c * C + c] = sc * dot;
    }
    for (int64_t r = c + 1; r < n; ++r) {
      const float* gr = row(g, r);
      for (int64_t i = 0; i < d; ++i) b.run[i] += gr[i];
      const float* kr = row(k, r);
      const float* qr = row(q, r);
      if (c < 0) {
        for (int64_t i = 0; i < d; ++i) {
          const float e = std::exp(b.run[i]);
          b.kg[r * d + i] = e * kr[i];
          b.qg[r * d + i] = sc * e * qr[i];
        }
      } else {
        float lk = 0, aq = 0;
        for (int64_t i = 0; i < d; ++i) {
          const float t = kc[i] * std::exp(b.run[i]);
          lk += kr[i] * t;
          aq += qr[i] * t;
        }
        b.l[r * C + c] = bet(r) * lk;
        b.a[r * C + c] = sc * aq;
      }
    }
    float* dst = c >= 0 ? b.kd + c * d : b.decay;
    for (int64_t i = 0; i < d; ++i) dst[i] = std::exp(b.run[i]) * (c >= 0 ? kc[i] : 1.0f);
  }

  // B_r = β_r (v_r − S0ᵀ kg_r) into vn; O_r = S0ᵀ qg_r into out. s is [d_v, d_k].
  for (int64_t vi = 0; vi < d; ++vi) {
    const float* srow = s + vi * d;
    for (int64_t r = 0; r < n; ++r) {
      float bk = 0, oq = 0;
      for (int64_t i = 0; i < d; ++i) {
        bk += srow[i] * b.kg[r * d + i];
        oq += srow[i] * b.qg[r * d + i];
      }
      b.vn[r * d + vi] = bet(r) * (row(v, r)[vi] - bk);
      out[((t0 + r) * H + h) * d + vi] = oq;
    }
  }
  // Forward substitution: Vn_r = B_r − Σ_{c<r} L[r, c] Vn_c (Horner order, row by row).
  for (int64_t r = 1; r < n; ++r) {
    for (int64_t c = 0; c < r; ++c) {
      const float lrc = b.l[r * C + c];
      for (int64_t i = 0; i < d; ++i) b.vn[r * d + i] -= lrc * b.vn[c * d + i];
    }
  }
  for (int64_t r = 0; r < n; ++r) {
    float* o = out + ((t0 + r) * H + h) * d;
    for (int64_t c = 0; c <= r; ++c) {
      const float arc = b.a[r * C + c];
      for (int64_t i = 0; i < d; ++i) o[i] += arc * b.vn[c * d + i];
    }
  }
  // S_next[v, :] = exp(Γ_last) ⊙ S0[v, :] + Σ_c Vn_c[v] kd_c.
  for (int64_t vi = 0; vi < d; ++vi) {
    float* srow = s + vi * d;
    for (int64_t i = 0; i < d; ++i) srow[i] *= b.decay[i];
    for (int64_t c = 0; c < n; ++c) {
      const float u = b.vn[c * d + vi];
      for (int64_t i = 0; i < d; ++i) srow[i] += u * b.kd[c * d + i];
    }
  }
}

}  // namespace

bool kda_avx512_available(const KdaDims& dims) {
  return cpu_features().avx512 && (dims.head_dim == 64 || dims.head_dim == 128);
}

void kda_recurrent(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                   const float* v, const float* g, const float* beta, int64_t num_tokens,
                   float* state, float* out, const float* state_in) {
  if (kda_avx512_available(dims)) {
    kda_detail::kda_recurrent_avx512(ctx, dims, q, k, v, g, beta, num_tokens, state, out, state_in);
  } else {
    kda_recurrent_plain(ctx, dims, q, k, v, g, beta, num_tokens, state, out, state_in);
  }
}

void kda_recurrent_plain(const ExecContext& ctx, const KdaDims& dims, const float* q,
                         const float* k, const float* v, const float* g, const float* beta,
                         int64_t num_tokens, float* state, float* out, const float* state_in) {
  check_dims(dims);
  const int64_t H = dims.num_heads, d = dims.head_dim;
  const float sc = 1.0f / std::sqrt(static_cast<float>(d));
  parallel_for(ctx, H, 1, [&](int64_t h_begin, int64_t h_end) {
    std::vector<float> alpha(static_cast<size_t>(d));
    for (int64_t h = h_begin; h < h_end; ++h) {
      float* s = state + h * d * d;
      for (int64_t t = 0; t < num_tokens; ++t) {
        const int64_t base = (t * H + h) * d;
        const float* kt = k + base;
        const float* qt = q + base;
        const float* s_read = t == 0 && state_in != nullptr ? state_in + h * d * d : s;
        for (int64_t i = 0; i < d; ++i) alpha[i] = std::exp(g[base + i]);
        const float bt = beta[t * H + h];
        // One pass per state row v: decay, predict v from k, correct, read out with q.
        for (int64_t vi = 0; vi < d; ++vi) {
          float* srow = s + vi * d;
          const float* read_row = s_read + vi * d;
          float pred = 0;
          for (int64_t i = 0; i < d; ++i) {
            srow[i] = read_row[i] * alpha[i];
            pred += srow[i] * kt[i];
          }
          const float u = bt * (v[base + vi] - pred);
          float o = 0;
          for (int64_t i = 0; i < d; ++i) {
            srow[i] += u * kt[i];
            o += srow[i] * qt[i];
          }
          out[base + vi] = sc * o;
        }
      }
    }
  });
}

size_t kda_chunked_scratch_bytes(const ExecContext& ctx, const KdaDims& dims, int64_t chunk_size) {
  return static_cast<size_t>(kda_detail::num_workers(ctx, dims)) *
             kda_detail::chunk_buffer_bytes(dims, chunk_size) +
         64;
}

void kda_chunked(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                 const float* v, const float* g, const float* beta, int64_t num_tokens,
                 int64_t pos_begin, int64_t chunk_size, float* state, float* out, Arena& scratch) {
  if (kda_avx512_available(dims)) {
    kda_detail::kda_chunked_avx512(ctx, dims, q, k, v, g, beta, num_tokens, pos_begin, chunk_size,
                                   state, out, scratch,
                                   chunk_size >= 32 && kda_detail::amx_available(dims));
  } else {
    kda_chunked_plain(ctx, dims, q, k, v, g, beta, num_tokens, pos_begin, chunk_size, state, out,
                      scratch);
  }
}

void kda_chunked_plain(const ExecContext& ctx, const KdaDims& dims, const float* q, const float* k,
                       const float* v, const float* g, const float* beta, int64_t num_tokens,
                       int64_t pos_begin, int64_t chunk_size, float* state, float* out,
                       Arena& scratch) {
  check_dims(dims);
  DZ_CHECK(chunk_size >= 1 && chunk_size <= 64, "KDA chunk_size {} not in [1, 64]", chunk_size);
  DZ_CHECK(pos_begin >= 0, "pos_begin {}", pos_begin);
  if (num_tokens <= 0) return;
  const int64_t workers = kda_detail::num_workers(ctx, dims);
  const size_t slice_bytes = kda_detail::chunk_buffer_bytes(dims, chunk_size);
  std::byte* base = scratch.allocate(static_cast<size_t>(workers) * slice_bytes, 64).data();
  const int64_t grain = (dims.num_heads + workers - 1) / workers;
  const int64_t d = dims.head_dim;
  parallel_for(ctx, dims.num_heads, grain, [&](int64_t h_begin, int64_t h_end) {
    const ChunkBuffers b = kda_detail::carve_chunk_buffers(
        base + static_cast<size_t>(h_begin / grain) * slice_bytes, dims, chunk_size);
    for (int64_t h = h_begin; h < h_end; ++h) {
      int64_t t0 = 0;
      while (t0 < num_tokens) {
        const int64_t n = std::min(chunk_size - (pos_begin + t0) % chunk_size, num_tokens - t0);
        chunk_plain(dims, q, k, v, g, beta, t0, n, h, state + h * d * d, out, b);
        t0 += n;
      }
    }
  });
}

}  // namespace dz::kernels
