// Absorbed MLA projections against an FP64 reference on fresh random inputs (the weights random
// BF16 codes, as the model stores them). Every output row (token i, head h) is compared elementwise
// with a bound of 1e-5 · ‖ref row‖₂: FP32 sums of ≤ 512 terms stay near 1e-7 of the row norm, while
// a wrong head, token or stride gives O(1).
#include "dayzero/kernels/mla_absorb.h"

#include <gtest/gtest.h>

#include "dayzero/formats/codecs.h"

#include <array>
#include <cmath>
#include <random>
#include <vector>

namespace dz::kernels {
namespace mla_absorb_test {

constexpr double kTol = 1e-5;

struct Case {
  MlaAbsorbDims dims;
  int64_t num_tokens = 0;
};

std::vector<float> random_floats(std::mt19937& rng, int64_t n) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

std::vector<uint16_t> random_bf16(std::mt19937& rng, int64_t n) {
  std::vector<uint16_t> codes;
  for (const float x : random_floats(rng, n)) codes.push_back(formats::encode_bf16(x));
  return codes;
}

void expect_rows_close(const std::vector<float>& got, const std::vector<double>& ref,
                       int64_t row_len, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  const auto num_rows = static_cast<int64_t>(ref.size()) / row_len;
  for (int64_t r = 0; r < num_rows; ++r) {
    double norm = 0;
    for (int64_t j = 0; j < row_len; ++j) norm += ref[r * row_len + j] * ref[r * row_len + j];
    const double bound = kTol * std::sqrt(norm);
    for (int64_t j = 0; j < row_len; ++j) {
      const auto idx = static_cast<size_t>(r * row_len + j);
      ASSERT_LE(std::abs(got[idx] - ref[idx]), bound)
          << what << " row " << r << " col " << j << ": " << got[idx] << " vs " << ref[idx];
    }
  }
}

enum class Variant { kDispatch, kPlain, kAvx512 };

// q [n, H, d_n + pad] (the nope part strided as in MlaBlock), W_UK [H, d_n, r_kv].
void check_absorb_q(const Case& c, Variant variant, int num_threads, uint32_t seed) {
  const MlaAbsorbDims& d = c.dims;
  const int64_t H = d.num_heads, d_n = d.nope_dim, r_kv = d.latent_dim, n = c.num_tokens;
  const int64_t head_stride = d_n + 64, token_stride = H * head_stride;
  std::mt19937 rng(seed);
  const std::vector<float> q = random_floats(rng, n * token_stride);
  const std::vector<uint16_t> w = random_bf16(rng, H * d_n * r_kv);
  std::vector<float> got(static_cast<size_t>(n * H * r_kv), -7.0f);
  const MlaAbsorbQ args{.q_nope = q.data(),
                        .token_stride = token_stride,
                        .head_stride = head_stride,
                        .w_uk = w.data(),
                        .q_abs = got.data()};
  const ExecContext ctx{num_threads};
  switch (variant) {
    case Variant::kDispatch:
      mla_absorb_q(ctx, d, args, n);
      break;
    case Variant::kPlain:
      mla_absorb_q_plain(ctx, d, args, n);
      break;
    case Variant::kAvx512:
      mla_absorb_q_avx512(ctx, d, args, n);
      break;
  }
  std::vector<double> ref(got.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < r_kv; ++j) {
        double s = 0;
        for (int64_t k = 0; k < d_n; ++k)
          s += double{q[static_cast<size_t>(i * token_stride + h * head_stride + k)]} *
               formats::decode_bf16(w[static_cast<size_t>((h * d_n + k) * r_kv + j)]);
        ref[static_cast<size_t>((i * H + h) * r_kv + j)] = s;
      }
  expect_rows_close(got, ref, r_kv, "q_abs");
}

// o_lat [n, H, r_kv], W_UV [H, d_v, r_kv], o [n, H, d_v].
void check_expand_o(const Case& c, Variant variant, int num_threads, uint32_t seed) {
  const MlaAbsorbDims& d = c.dims;
  const int64_t H = d.num_heads, d_v = d.v_dim, r_kv = d.latent_dim, n = c.num_tokens;
  std::mt19937 rng(seed);
  const std::vector<float> lat = random_floats(rng, n * H * r_kv);
  const std::vector<uint16_t> w = random_bf16(rng, H * d_v * r_kv);
  std::vector<float> got(static_cast<size_t>(n * H * d_v), -7.0f);
  const MlaExpandO args{.o_lat = lat.data(), .w_uv = w.data(), .o = got.data()};
  const ExecContext ctx{num_threads};
  switch (variant) {
    case Variant::kDispatch:
      mla_expand_o(ctx, d, args, n);
      break;
    case Variant::kPlain:
      mla_expand_o_plain(ctx, d, args, n);
      break;
    case Variant::kAvx512:
      mla_expand_o_avx512(ctx, d, args, n);
      break;
  }
  std::vector<double> ref(got.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = 0; k < d_v; ++k) {
        double s = 0;
        for (int64_t j = 0; j < r_kv; ++j)
          s += double{formats::decode_bf16(w[static_cast<size_t>((h * d_v + k) * r_kv + j)])} *
               lat[static_cast<size_t>((i * H + h) * r_kv + j)];
        ref[static_cast<size_t>((i * H + h) * d_v + k)] = s;
      }
  expect_rows_close(got, ref, d_v, "o");
}

// (H, d_n, n): head counts 1..16, both nope widths, token counts around the tiles (6 and 4) and
// the token block (24), r_kv 512, d_v 128 (DeepSeek's shapes).
std::vector<Case> shapes() {
  std::vector<Case> cases;
  for (const auto& [H, d_n, n] : std::vector<std::array<int64_t, 3>>{{1, 64, 1},
                                                                     {1, 128, 70},
                                                                     {3, 64, 5},
                                                                     {3, 128, 25},
                                                                     {5, 128, 7},
                                                                     {16, 64, 24},
                                                                     {16, 128, 1},
                                                                     {16, 128, 70}})
    cases.push_back({.dims = {.num_heads = H, .nope_dim = d_n, .latent_dim = 512, .v_dim = 128},
                     .num_tokens = n});
  return cases;
}

void run_all(Variant variant) {
  uint32_t seed = 1;
  for (const Case& c : shapes()) {
    for (int threads : {1, 2}) {
      SCOPED_TRACE(testing::Message() << "H=" << c.dims.num_heads << " d_n=" << c.dims.nope_dim
                                      << " n=" << c.num_tokens << " threads=" << threads
                                      << " seeds=" << seed << "," << seed + 1);
      check_absorb_q(c, variant, threads, seed++);
      check_expand_o(c, variant, threads, seed++);
    }
  }
}

TEST(MlaAbsorb, PlainMatchesFp64) {
  run_all(Variant::kPlain);
}

TEST(MlaAbsorb, DispatchMatchesFp64) {
  run_all(Variant::kDispatch);
}

TEST(MlaAbsorb, Avx512MatchesFp64) {
  if (!mla_absorb_avx512_available(
          {.num_heads = 1, .nope_dim = 64, .latent_dim = 512, .v_dim = 128}))
    GTEST_SKIP() << "no AVX-512 on this CPU";
  run_all(Variant::kAvx512);
}

// Shapes the AVX-512 variant does not take (r_kv % 64 != 0, d_v % 4 != 0): the dispatcher falls
// back to the plain loops, and the AVX-512 variant itself refuses them.
TEST(MlaAbsorb, DispatchFallsBackForOddShapes) {
  const Case c{.dims = {.num_heads = 3, .nope_dim = 16, .latent_dim = 48, .v_dim = 6},
               .num_tokens = 29};
  EXPECT_FALSE(mla_absorb_avx512_available(c.dims));
  for (int threads : {1, 2}) {
    check_absorb_q(c, Variant::kDispatch, threads, 101);
    check_expand_o(c, Variant::kDispatch, threads, 102);
  }
}

TEST(MlaAbsorbDeathTest, Avx512RejectsOddShapes) {
  const MlaAbsorbDims dims{.num_heads = 2, .nope_dim = 16, .latent_dim = 48, .v_dim = 8};
  std::vector<float> buf(4096, 0.5f);
  std::vector<uint16_t> codes(4096, 0x3F00);
  EXPECT_DEATH(mla_absorb_q_avx512(ExecContext{1}, dims,
                                   {.q_nope = buf.data(),
                                    .token_stride = 32,
                                    .head_stride = 16,
                                    .w_uk = codes.data(),
                                    .q_abs = buf.data()},
                                   1),
               "r_kv % 64 == 0 and d_v % 4 == 0, got r_kv=48 d_v=8");
}

}  // namespace mla_absorb_test
}  // namespace dz::kernels
