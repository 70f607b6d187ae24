// Dispatch and the plain variants of the absorbed MLA projections (mla_absorb.h). The plain loops
// keep the arithmetic of the former per-token loops of MlaBlock (sequential FP32 sums over k for
// absorb_q, eight interleaved partial sums for expand_o), now ordered head by head.
#include "dayzero/kernels/mla_absorb.h"

#include <algorithm>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/cpu_features.h"

namespace dz::kernels {
namespace {

void check_dims(const MlaAbsorbDims& d) {
  DZ_CHECK(d.num_heads > 0 && d.nope_dim > 0 && d.latent_dim > 0 && d.v_dim > 0,
           "mla_absorb dims H={} d_n={} r_kv={} d_v={} must be positive", d.num_heads, d.nope_dim,
           d.latent_dim, d.v_dim);
}

float dot(const uint16_t* a, const float* b, int64_t n) {
  float partial[8] = {};  // eight interleaved sums: vectorizable without -ffast-math
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) partial[j] += formats::decode_bf16(a[i + j]) * b[i + j];
  float sum = 0;
  for (; i < n; ++i) sum += formats::decode_bf16(a[i]) * b[i];
  for (float p : partial) sum += p;
  return sum;
}

}  // namespace

bool mla_absorb_avx512_available(const MlaAbsorbDims& dims) {
  return cpu_features().avx512 && dims.latent_dim % 64 == 0 && dims.v_dim % 4 == 0;
}

void mla_absorb_q(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaAbsorbQ& args,
                  int64_t num_tokens) {
  if (mla_absorb_avx512_available(dims)) {
    mla_absorb_q_avx512(ctx, dims, args, num_tokens);
  } else {
    mla_absorb_q_plain(ctx, dims, args, num_tokens);
  }
}

void mla_expand_o(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaExpandO& args,
                  int64_t num_tokens) {
  if (mla_absorb_avx512_available(dims)) {
    mla_expand_o_avx512(ctx, dims, args, num_tokens);
  } else {
    mla_expand_o_plain(ctx, dims, args, num_tokens);
  }
}

void mla_absorb_q_plain(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaAbsorbQ& args,
                        int64_t num_tokens) {
  check_dims(dims);
  if (num_tokens <= 0) return;
  const int64_t H = dims.num_heads, d_n = dims.nope_dim, r_kv = dims.latent_dim;
  const int64_t num_blocks = (num_tokens + kMlaAbsorbTokenBlock - 1) / kMlaAbsorbTokenBlock;
  parallel_for(ctx, H * num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / num_blocks, i0 = item % num_blocks * kMlaAbsorbTokenBlock;
      const int64_t i1 = std::min(i0 + kMlaAbsorbTokenBlock, num_tokens);
      const uint16_t* w = args.w_uk + h * d_n * r_kv;
      for (int64_t i = i0; i < i1; ++i) {
        const float* q = args.q_nope + i * args.token_stride + h * args.head_stride;
        float* dst = args.q_abs + (i * H + h) * r_kv;
        std::fill_n(dst, r_kv, 0.0f);
        for (int64_t k = 0; k < d_n; ++k) {
          const uint16_t* w_row = w + k * r_kv;
          for (int64_t j = 0; j < r_kv; ++j) dst[j] += q[k] * formats::decode_bf16(w_row[j]);
        }
      }
    }
  });
}

void mla_expand_o_plain(const ExecContext& ctx, const MlaAbsorbDims& dims, const MlaExpandO& args,
                        int64_t num_tokens) {
  check_dims(dims);
  if (num_tokens <= 0) return;
  const int64_t H = dims.num_heads, d_v = dims.v_dim, r_kv = dims.latent_dim;
  const int64_t num_blocks = (num_tokens + kMlaAbsorbTokenBlock - 1) / kMlaAbsorbTokenBlock;
  parallel_for(ctx, H * num_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / num_blocks, i0 = item % num_blocks * kMlaAbsorbTokenBlock;
      const int64_t i1 = std::min(i0 + kMlaAbsorbTokenBlock, num_tokens);
      for (int64_t i = i0; i < i1; ++i) {
        const float* lat = args.o_lat + (i * H + h) * r_kv;
        float* dst = args.o + (i * H + h) * d_v;
        for (int64_t k = 0; k < d_v; ++k) dst[k] = dot(args.w_uv + (h * d_v + k) * r_kv, lat, r_kv);
      }
    }
  });
}

}  // namespace dz::kernels
