#pragma once
// Non-causal multi-head attention over BF16 q, k, v (the vision tower's, docs/vision.md §3): every
// query of a sequence attends to every key of it. FP32 scores and softmax; the probabilities enter
// the P·V product as BF16, as a BF16 flash attention has them. Outputs are FP32, not rounded.
//
// The fast kernels stream keys in tiles of 64 with an online softmax (no [queries, keys] matrix):
// the AVX512-BF16 one packs k and v per head so that one VDPBF16PS multiplies a pair of head
// dimensions (scores) or a pair of keys (outputs) for 16 lanes; the portable one runs the same
// tiles in scalar FP32. dense_attention_ref is the plain oracle: FP64 sums, a two-pass softmax.

#include <cstddef>
#include <cstdint>
#include <span>

#include "dayzero/core/parallel.h"

namespace dz::kernels {

inline constexpr int64_t kDenseAttentionMaxHeadDim = 256;

struct DenseAttentionArgs {
  int64_t num_tokens = 0;  // queries = keys
  int64_t num_heads = 0;
  int64_t head_dim = 0;  // even, at most kDenseAttentionMaxHeadDim
  float softmax_scale = 0;
  // BF16-valued FP32 rows at the strides (in floats); head h at h · head_dim within a row.
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t q_stride = 0;
  int64_t k_stride = 0;
  int64_t v_stride = 0;
  float* out = nullptr;  // [num_tokens] rows at out_stride, head h at h · head_dim
  int64_t out_stride = 0;
};

// Scratch of dense_attention (it never allocates): pass at least this many bytes, 64-aligned.
size_t dense_attention_workspace_bytes(int64_t num_tokens, int64_t head_dim);

void dense_attention(const ExecContext& ctx, const DenseAttentionArgs& args,
                     std::span<std::byte> workspace);

void dense_attention_ref(const DenseAttentionArgs& args);

namespace detail {
inline constexpr int64_t kDenseKeyTile = 64;       // keys per tile of the online softmax
inline constexpr int64_t kDenseQueryGroup = 4;     // queries sharing each key load
inline constexpr int64_t kDenseBlockQueries = 64;  // queries sharing each key tile in cache

// One head's inputs packed as BF16 codes (AVX512-BF16 path): q rows [n][head_dim]; keys in groups
// of 16, [n_pad / 16][head_dim / 2][16][2]; values in key pairs, [n_pad / 2][head_dim / 16][16][2].
// n_pad rounds n up to the key tile; the padding keys are masked, their values zero.
struct DenseHeadPacked {
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t num_tokens = 0;
  int64_t head_dim = 0;  // a multiple of 64 on this path
};

// Query groups [group_begin, group_end) of one head: out rows at out_stride.
void dense_attention_groups_avx512(const DenseHeadPacked& head, float softmax_scale,
                                   int64_t group_begin, int64_t group_end, float* out,
                                   int64_t out_stride);
}  // namespace detail

}  // namespace dz::kernels
