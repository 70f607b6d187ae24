#include "dayzero/kernels/dense_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/formats/codecs.h"

namespace dz::kernels {
namespace dense_attention_test {

// The tolerance from the arithmetic: the probabilities enter P·V as BF16 (a relative error of at
// most 2^−9 each, so at most 2^−9 · max|v| on an output, whatever the weights); the FP32 scores of
// exact BF16 products and e^x to ~1 ulp add far less. Twice that bound.
float tolerance(const std::vector<float>& qkv, int64_t row, int64_t v_offset, int64_t n) {
  float largest = 0;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t e = v_offset; e < row; ++e)
      largest = std::max(largest, std::abs(qkv[static_cast<size_t>(t * row + e)]));
  return 2.0f * std::ldexp(1.0f, -9) * largest + 1e-6f;
}

TEST(DenseAttention, MatchesTheReferenceForEveryShape) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  ExecContext ctx;
  ctx.num_threads = 2;
  for (const int64_t hd : {64, 128, 32})  // 32: the portable path on every machine
    for (const int64_t n : {1, 3, 17, 64, 65, 130, 300}) {
      SCOPED_TRACE(::testing::Message() << "head_dim " << hd << " tokens " << n);
      const int64_t heads = 2;
      const int64_t q_size = heads * hd;
      const int64_t row = 3 * q_size;  // one qkv row per token, as the tower's projection makes
      // Scores of a few units (as after a trained model's norms): sharp and flat rows both.
      std::normal_distribution<float> normal(0.0f, 1.5f);
      std::vector<float> qkv(static_cast<size_t>(n * row));
      for (float& x : qkv) x = formats::round_to_bf16(normal(rng));
      DenseAttentionArgs args{.num_tokens = n,
                              .num_heads = heads,
                              .head_dim = hd,
                              .softmax_scale = 1.0f / std::sqrt(static_cast<float>(hd)),
                              .q = qkv.data(),
                              .k = qkv.data() + q_size,
                              .v = qkv.data() + 2 * q_size,
                              .q_stride = row,
                              .k_stride = row,
                              .v_stride = row,
                              .out = nullptr,
                              .out_stride = q_size + 8};  // a stride that is not the width
      std::vector<float> ours(static_cast<size_t>(n * args.out_stride), -7.0f);
      std::vector<float> ref(ours.size(), -7.0f);
      AlignedBuffer workspace(dense_attention_workspace_bytes(n, hd));
      args.out = ours.data();
      dense_attention(ctx, args, workspace.bytes());
      args.out = ref.data();
      dense_attention_ref(args);
      const float tol = tolerance(qkv, row, 2 * q_size, n);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t e = 0; e < args.out_stride; ++e) {
          const size_t at = static_cast<size_t>(t * args.out_stride + e);
          if (e >= q_size) {  // past the heads: untouched
            ASSERT_EQ(ours[at], -7.0f) << "token " << t << " column " << e;
            continue;
          }
          ASSERT_NEAR(ours[at], ref[at], tol) << "token " << t << " column " << e;
        }
    }
}

TEST(DenseAttention, OneDominantKeyIsCopiedAndEqualKeysAverage) {
  // Query 0 meets one key of a far larger score: its output is that key's value; a query whose
  // scores are all equal averages the values. Both exact up to the BF16 probability bound.
  const int64_t n = 70, hd = 64;
  std::vector<float> q(static_cast<size_t>(n * hd), 0.0f), k(q.size(), 0.0f), v(q.size());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (float& x : v) x = formats::round_to_bf16(uniform(rng));
  q[0] = 8.0f;
  k[static_cast<size_t>(66 * hd)] = 8.0f;  // key 66: in the last, partial tile
  std::vector<float> out(q.size());
  ExecContext ctx;
  AlignedBuffer workspace(dense_attention_workspace_bytes(n, hd));
  dense_attention(ctx,
                  {.num_tokens = n,
                   .num_heads = 1,
                   .head_dim = hd,
                   .softmax_scale = 1.0f,
                   .q = q.data(),
                   .k = k.data(),
                   .v = v.data(),
                   .q_stride = hd,
                   .k_stride = hd,
                   .v_stride = hd,
                   .out = out.data(),
                   .out_stride = hd},
                  workspace.bytes());
  for (int64_t e = 0; e < hd; ++e) {
    EXPECT_NEAR(out[static_cast<size_t>(e)], v[static_cast<size_t>(66 * hd + e)], 1e-6f);
    double mean = 0;
    for (int64_t t = 0; t < n; ++t) mean += v[static_cast<size_t>(t * hd + e)];
    EXPECT_NEAR(out[static_cast<size_t>(hd + e)], mean / n, 4e-3);  // query 1: all scores 0
  }
}

}  // namespace dense_attention_test
}  // namespace dz::kernels
