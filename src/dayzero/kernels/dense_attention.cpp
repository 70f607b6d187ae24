#include "dayzero/kernels/dense_attention.h"

#include <algorithm>
#include <cmath>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/fast_math.h"

namespace dz::kernels {
namespace {

using detail::kDenseKeyTile;
using detail::kDenseQueryGroup;

int64_t padded_keys(int64_t n) {
  return (n + kDenseKeyTile - 1) / kDenseKeyTile * kDenseKeyTile;
}

size_t aligned(size_t bytes) {
  return (bytes + 63) / 64 * 64;
}

void check_args(const DenseAttentionArgs& a) {
  DZ_CHECK(a.num_tokens >= 0 && a.num_heads > 0, "dense attention: {} tokens, {} heads",
           a.num_tokens, a.num_heads);
  DZ_CHECK(a.head_dim > 0 && a.head_dim % 2 == 0 && a.head_dim <= kDenseAttentionMaxHeadDim,
           "dense attention: head_dim {} (even, at most {})", a.head_dim,
           kDenseAttentionMaxHeadDim);
}

bool packed_path(const DenseAttentionArgs& a) {
  return cpu_features().avx512_bf16 && a.head_dim % 64 == 0;
}

// One head's q, k and v as BF16 codes in the layouts of detail::DenseHeadPacked.
detail::DenseHeadPacked pack_head(const ExecContext& ctx, const DenseAttentionArgs& a, int64_t h,
                                  std::span<std::byte> workspace) {
  const int64_t n = a.num_tokens;
  const int64_t n_pad = padded_keys(n);
  const int64_t hd = a.head_dim;
  auto* q = reinterpret_cast<uint16_t*>(workspace.data());
  auto* k = reinterpret_cast<uint16_t*>(workspace.data() +
                                        aligned(static_cast<size_t>(n * hd) * sizeof(uint16_t)));
  uint16_t* v = k + n_pad * hd;
  parallel_for(ctx, n_pad, grain_for_work(3 * hd, 1 << 16), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const bool real = t < n;
      const float* qr = a.q + t * a.q_stride + h * hd;
      const float* kr = a.k + t * a.k_stride + h * hd;
      const float* vr = a.v + t * a.v_stride + h * hd;
      const int64_t group = t / 16, lane = t % 16;
      for (int64_t e = 0; e < hd; ++e) {
        if (real) q[t * hd + e] = formats::encode_bf16(qr[e]);
        // k: [group][pair e/2][lane][e%2]; v: [key pair t/2][dim group e/16][lane e%16][t%2].
        k[((group * (hd / 2) + e / 2) * 16 + lane) * 2 + e % 2] =
            real ? formats::encode_bf16(kr[e]) : uint16_t{0};
        v[((t / 2 * (hd / 16) + e / 16) * 16 + e % 16) * 2 + t % 2] =
            real ? formats::encode_bf16(vr[e]) : uint16_t{0};
      }
    }
  });
  return {.q = q, .k = k, .v = v, .num_tokens = n, .head_dim = hd};
}

// The portable path: the tiles and online softmax of the packed kernel in scalar FP32.
void attend_group_portable(const DenseAttentionArgs& a, int64_t h, int64_t group) {
  const int64_t n = a.num_tokens;
  const int64_t hd = a.head_dim;
  const int64_t first = group * kDenseQueryGroup;
  const int64_t rows = std::min(kDenseQueryGroup, n - first);
  float o[kDenseQueryGroup][kDenseAttentionMaxHeadDim] = {};
  float running_max[kDenseQueryGroup];
  float total[kDenseQueryGroup] = {};
  std::fill_n(running_max, kDenseQueryGroup, -INFINITY);
  float p[kDenseKeyTile];
  for (int64_t tile = 0; tile < n; tile += kDenseKeyTile) {
    const int64_t keys = std::min(kDenseKeyTile, n - tile);
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = a.q + (first + r) * a.q_stride + h * hd;
      float top = running_max[r];
      for (int64_t j = 0; j < keys; ++j) {
        const float* kr = a.k + (tile + j) * a.k_stride + h * hd;
        float s = 0;
        for (int64_t e = 0; e < hd; ++e) s += qr[e] * kr[e];
        p[j] = s * a.softmax_scale;
        top = std::max(top, p[j]);
      }
      const float correction = std::exp(running_max[r] - top);
      running_max[r] = top;
      total[r] *= correction;
      for (int64_t e = 0; e < hd; ++e) o[r][e] *= correction;
      for (int64_t j = 0; j < keys; ++j) {
        const float pj = exp_nonpositive(p[j] - top);
        total[r] += pj;
        const float weight = formats::round_to_bf16(pj);  // P·V takes BF16 probabilities
        const float* vr = a.v + (tile + j) * a.v_stride + h * hd;
        for (int64_t e = 0; e < hd; ++e) o[r][e] += weight * vr[e];
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* out = a.out + (first + r) * a.out_stride + h * hd;
    for (int64_t e = 0; e < hd; ++e) out[e] = o[r][e] / total[r];
  }
}

}  // namespace

size_t dense_attention_workspace_bytes(int64_t num_tokens, int64_t head_dim) {
  return aligned(static_cast<size_t>(num_tokens * head_dim) * sizeof(uint16_t)) +
         aligned(static_cast<size_t>(2 * padded_keys(num_tokens) * head_dim) * sizeof(uint16_t));
}

void dense_attention(const ExecContext& ctx, const DenseAttentionArgs& a,
                     std::span<std::byte> workspace) {
  check_args(a);
  if (a.num_tokens == 0) return;
  const int64_t num_groups = (a.num_tokens + kDenseQueryGroup - 1) / kDenseQueryGroup;
  // Per query group: two products over every key (4 FLOPs per key and dimension and query).
  const int64_t group_flops = 4 * kDenseQueryGroup * a.num_tokens * a.head_dim;
  const int64_t grain = grain_for_work(group_flops, kMinParallelFlops);
  if (!packed_path(a)) {
    parallel_for(ctx, a.num_heads * num_groups, grain, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item)
        attend_group_portable(a, item / num_groups, item % num_groups);
    });
    return;
  }
  DZ_CHECK(workspace.size() >= dense_attention_workspace_bytes(a.num_tokens, a.head_dim),
           "dense attention: workspace of {} bytes, {} needed", workspace.size(),
           dense_attention_workspace_bytes(a.num_tokens, a.head_dim));
  // Work items of whole query blocks (the kernel shares each key tile across a block's groups).
  constexpr int64_t kBlockGroups = detail::kDenseBlockQueries / kDenseQueryGroup;
  const int64_t num_blocks = (num_groups + kBlockGroups - 1) / kBlockGroups;
  const int64_t block_grain = grain_for_work(group_flops * kBlockGroups, kMinParallelFlops);
  for (int64_t h = 0; h < a.num_heads; ++h) {  // one head's packed inputs at a time
    const detail::DenseHeadPacked head = pack_head(ctx, a, h, workspace);
    parallel_for(ctx, num_blocks, block_grain, [&](int64_t begin, int64_t end) {
      detail::dense_attention_groups_avx512(head, a.softmax_scale, begin * kBlockGroups,
                                            std::min(end * kBlockGroups, num_groups),
                                            a.out + h * a.head_dim, a.out_stride);
    });
  }
}

}  // namespace dz::kernels
