// LinearWeight (linear.h): load-time conversions and checks, dequantize() against the formats
// references, and forward() against an FP64 product of the same BF16-rounded activations and the
// dequantized weights. Tolerance: relative RMS error < 1e-5 (docs/models.md §8.1, FP32
// accumulation: the FP32 sums of up to ~1000 terms stay near 2^-24·sqrt(K) relative, far below the
// bound).
#include "dayzero/kernels/linear.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/formats/fp8_block.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/linear_ref.h"

namespace dz::kernels {
namespace linear_test {

using ::testing::HasSubstr;

constexpr double kFp32Tolerance = 1e-5;

std::vector<float> random_normal(std::mt19937& rng, int64_t num_elems, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(num_elems));
  for (auto& e : v) e = normal(rng);
  return v;
}

// Random finite, non-zero E4M3 codes.
std::vector<uint8_t> random_codes(std::mt19937& rng, int64_t num_elems) {
  // Every finite non-zero code: 0x01–0x7E and 0x81–0xFE (no NaN 0x7F/0xFF, no ±0, which would make
  // the reference of the 1 × 1 case zero and its relative error 0/0; formats/ tests all 256 codes).
  std::uniform_int_distribution<int> dist(0, 251);
  std::vector<uint8_t> codes(static_cast<size_t>(num_elems));
  for (auto& c : codes) {
    const int v = dist(rng);
    c = static_cast<uint8_t>(v < 126 ? 0x01 + v : 0x81 + (v - 126));
  }
  return codes;
}

// Powers of two in [2^-12, 2^-4] (what ue8m0 checkpoints hold) or, if !pow2, arbitrary values.
std::vector<float> random_scales(std::mt19937& rng, int64_t num_elems, bool pow2) {
  std::uniform_int_distribution<int> exponent(-12, -4);
  std::uniform_real_distribution<float> uniform(1e-4f, 1e-2f);
  std::vector<float> s(static_cast<size_t>(num_elems));
  for (auto& e : s) e = pow2 ? std::ldexp(1.0f, exponent(rng)) : uniform(rng);
  return s;
}

// ‖y − ref‖ / ‖ref‖ with ref = bf16(x) · Wᵀ in FP64, W = weight.dequantize().
double forward_rel_rms(const LinearWeight& weight, const std::vector<float>& x, int64_t num_tokens,
                       const std::vector<float>& y) {
  const int64_t out = weight.out_features(), in = weight.in_features();
  std::vector<float> w(static_cast<size_t>(out * in));
  weight.dequantize(w.data());
  double err2 = 0.0, ref2 = 0.0;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < out; ++i) {
      double ref = 0.0;
      for (int64_t j = 0; j < in; ++j)
        ref += static_cast<double>(formats::round_to_bf16(x[t * in + j])) * w[i * in + j];
      const double diff = y[t * out + i] - ref;
      err2 += diff * diff;
      ref2 += ref * ref;
    }
  }
  return std::sqrt(err2 / ref2);
}

struct Fp8Weight {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  formats::Fp8BlockShape shape;
};

Fp8Weight random_fp8(std::mt19937& rng, int64_t out, int64_t in, int64_t block_rows,
                     int64_t block_cols, bool pow2) {
  Fp8Weight w;
  w.shape = {out, in, block_rows, block_cols};
  w.codes = random_codes(rng, out * in);
  w.scales = random_scales(rng, w.shape.num_scale_rows() * w.shape.num_scale_cols(), pow2);
  return w;
}

Result<LinearWeight> load(Fp8Weight& w) {
  TensorView codes(w.codes.data(), DType::kF8E4M3, Shape{w.shape.num_rows, w.shape.num_cols});
  TensorView scales(w.scales.data(), DType::kF32,
                    Shape{w.shape.num_scale_rows(), w.shape.num_scale_cols()});
  return LinearWeight::from_fp8_block(codes, scales, w.shape.block_rows, w.shape.block_cols);
}

struct Case {
  int64_t out, in;
};
// Odd sizes, block ± 1, partial scale tiles in both directions.
const Case kCases[] = {{1, 1}, {3, 5}, {127, 129}, {130, 257}, {257, 300}, {320, 384}};
// 1–8 run the FP8 GEMV, 9+ the dequantized tiles (300: two token tiles) or, with AMX, the FP8 AMX
// GEMM (16: one full token tile; 33: three; 80: a pass of four tiles and one of one; 300: five
// passes, the last of three).
const int64_t kTokenCounts[] = {1, 3, 5, 8, 9, 16, 17, 33, 64, 80, 300};

double rel_rms(const std::vector<float>& y, const std::vector<float>& ref) {
  double err2 = 0.0, ref2 = 0.0;
  for (size_t e = 0; e < y.size(); ++e) {
    const double diff = static_cast<double>(y[e]) - ref[e];
    err2 += diff * diff;
    ref2 += static_cast<double>(ref[e]) * ref[e];
  }
  // A tiny case ([1, 1] with a ±0 code) can have an all-zero reference: exact is then 0, not 0/0.
  if (ref2 == 0.0) return err2 == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(err2 / ref2);
}

TEST(LinearWeight, FromFloatRoundsToBf16) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t out = 37, in = 53;
  std::vector<float> f32 = random_normal(rng, out * in);
  std::vector<uint16_t> f16(f32.size()), bf16(f32.size());
  for (size_t e = 0; e < f32.size(); ++e) {
    f16[e] = formats::encode_fp16(f32[e]);
    bf16[e] = formats::encode_bf16(f32[e] * 3.0f);
  }
  std::vector<float> w(f32.size());
  auto from_f32 = LinearWeight::from_float(TensorView(f32.data(), DType::kF32, Shape{out, in}));
  ASSERT_TRUE(from_f32.ok()) << from_f32.status().to_string();
  EXPECT_FALSE(from_f32->is_fp8_block());
  EXPECT_EQ(from_f32->out_features(), out);
  EXPECT_EQ(from_f32->in_features(), in);
  from_f32->dequantize(w.data());
  for (size_t e = 0; e < w.size(); ++e) ASSERT_EQ(w[e], formats::round_to_bf16(f32[e])) << e;

  auto from_f16 = LinearWeight::from_float(TensorView(f16.data(), DType::kF16, Shape{out, in}));
  ASSERT_TRUE(from_f16.ok());
  from_f16->dequantize(w.data());
  for (size_t e = 0; e < w.size(); ++e)
    ASSERT_EQ(w[e], formats::round_to_bf16(formats::decode_fp16(f16[e]))) << e;

  auto from_bf16 = LinearWeight::from_float(TensorView(bf16.data(), DType::kBF16, Shape{out, in}));
  ASSERT_TRUE(from_bf16.ok());
  from_bf16->dequantize(w.data());
  for (size_t e = 0; e < w.size(); ++e) ASSERT_EQ(w[e], formats::decode_bf16(bf16[e])) << e;

  LinearWeight direct = LinearWeight::from_f32_as_bf16(f32.data(), out, in);
  direct.dequantize(w.data());
  for (size_t e = 0; e < w.size(); ++e) ASSERT_EQ(w[e], formats::round_to_bf16(f32[e])) << e;
}

TEST(LinearWeight, FromFloatReadsRowStrides) {
  std::mt19937 rng(7);
  const int64_t out = 5, in = 6, stride = 9;
  std::vector<float> f32 = random_normal(rng, out * stride);
  auto weight = LinearWeight::from_float(
      TensorView(f32.data(), DType::kF32, Shape{out, in}, Shape{stride, 1}));
  ASSERT_TRUE(weight.ok()) << weight.status().to_string();
  std::vector<float> w(out * in);
  weight->dequantize(w.data());
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j)
      ASSERT_EQ(w[i * in + j], formats::round_to_bf16(f32[i * stride + j]));
}

TEST(LinearWeight, Fp8DequantizeMatchesTheFormatsReference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (bool pow2 : {true, false}) {
    Fp8Weight fp8 = random_fp8(rng, 200, 300, 128, 128, pow2);
    auto weight = load(fp8);
    ASSERT_TRUE(weight.ok()) << weight.status().to_string();
    EXPECT_TRUE(weight->is_fp8_block());
    std::vector<float> w(fp8.codes.size()), expected(fp8.codes.size());
    weight->dequantize(w.data());
    formats::dequantize_fp8_block(fp8.codes, fp8.scales, fp8.shape, expected);
    ASSERT_EQ(0, std::memcmp(w.data(), expected.data(), w.size() * sizeof(float)));
  }
}

TEST(LinearWeight, Bf16ForwardMatchesFp64) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const ExecContext ctx{2};
  for (const Case& c : kCases) {
    const std::vector<float> f32 = random_normal(rng, c.out * c.in);
    const LinearWeight weight = LinearWeight::from_f32_as_bf16(f32.data(), c.out, c.in);
    for (int64_t num_tokens : kTokenCounts) {
      // Activations not BF16-valued on purpose: forward() rounds them, as the reference does.
      const std::vector<float> x = random_normal(rng, num_tokens * c.in);
      std::vector<float> y(static_cast<size_t>(num_tokens * c.out));
      weight.forward(ctx, x.data(), num_tokens, y.data());
      EXPECT_LT(forward_rel_rms(weight, x, num_tokens, y), kFp32Tolerance)
          << "[" << c.out << ", " << c.in << "] tokens " << num_tokens;
    }
  }
}

TEST(LinearWeight, Fp8ForwardMatchesFp64) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const ExecContext ctx{2};
  for (bool pow2 : {true, false}) {
    for (const Case& c : kCases) {
      Fp8Weight fp8 = random_fp8(rng, c.out, c.in, 128, 128, pow2);
      auto weight = load(fp8);
      ASSERT_TRUE(weight.ok()) << weight.status().to_string();
      for (int64_t num_tokens : kTokenCounts) {
        const std::vector<float> x = random_normal(rng, num_tokens * c.in);
        std::vector<float> y(static_cast<size_t>(num_tokens * c.out));
        weight->forward(ctx, x.data(), num_tokens, y.data());
        EXPECT_LT(forward_rel_rms(*weight, x, num_tokens, y), kFp32Tolerance)
            << "[" << c.out << ", " << c.in << "] tokens " << num_tokens << " pow2 " << pow2;
        std::vector<float> ref(y.size());
        linear_fp8_block_ref(fp8.codes.data(), fp8.scales.data(), fp8.shape, x.data(), num_tokens,
                             ref.data());
        EXPECT_LT(rel_rms(y, ref), kFp32Tolerance) << "vs linear_fp8_block_ref";
      }
    }
  }
}

TEST(LinearWeight, Fp8OddBlockSizes) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const ExecContext ctx{2};
  Fp8Weight fp8 = random_fp8(rng, 70, 90, 32, 48, true);
  auto weight = load(fp8);
  ASSERT_TRUE(weight.ok()) << weight.status().to_string();
  for (int64_t num_tokens : kTokenCounts) {
    const std::vector<float> x = random_normal(rng, num_tokens * 90);
    std::vector<float> y(static_cast<size_t>(num_tokens * 70));
    weight->forward(ctx, x.data(), num_tokens, y.data());
    EXPECT_LT(forward_rel_rms(*weight, x, num_tokens, y), kFp32Tolerance) << num_tokens;
  }
}

TEST(LinearWeight, SingleThreadMatchesManyThreads) {
  std::mt19937 rng(11);
  Fp8Weight fp8 = random_fp8(rng, 300, 256, 128, 128, true);
  auto weight = load(fp8);
  ASSERT_TRUE(weight.ok());
  const std::vector<float> f32 = random_normal(rng, 300 * 256);
  const LinearWeight plain = LinearWeight::from_f32_as_bf16(f32.data(), 300, 256);
  for (int64_t num_tokens : {1, 40}) {
    const std::vector<float> x = random_normal(rng, num_tokens * 256);
    for (const LinearWeight* w : std::array<const LinearWeight*, 2>{&*weight, &plain}) {
      std::vector<float> y1(static_cast<size_t>(num_tokens * 300)), y2(y1.size());
      w->forward(ExecContext{1}, x.data(), num_tokens, y1.data());
      w->forward(ExecContext{2}, x.data(), num_tokens, y2.data());
      EXPECT_LT(rel_rms(y2, y1), kFp32Tolerance) << num_tokens;
    }
  }
}

// The primitive cache of a weight is emptied when full while other threads may still be running
// primitives from it (OpenMP tile tasks, or two callers): each caller must hold its own reference.
// Every call below has a new token count, so the cache fills and empties many times while the
// other thread executes; a primitive freed under it reads freed memory (issue 15: a general
// protection fault in libdnnl under a soak).
TEST(LinearWeight, ConcurrentForwardsSurviveCacheEviction) {
  std::mt19937 rng(5);
  const std::vector<float> f32 = random_normal(rng, 96 * 128);
  const LinearWeight plain = LinearWeight::from_f32_as_bf16(f32.data(), 96, 128);
  Fp8Weight fp8 = random_fp8(rng, 130, 128, 128, 128, true);  // tiles of 64 and 2 rows
  auto quantized = load(fp8);
  ASSERT_TRUE(quantized.ok());
  for (const LinearWeight* w : std::array<const LinearWeight*, 2>{&plain, &*quantized}) {
    const int64_t in = w->in_features(), out = w->out_features();
    constexpr int64_t kMaxTokens = 65 + 2 * 150;  // past the small-GEMM path of BF16 weights
    const std::vector<float> x = random_normal(rng, kMaxTokens * in);
    std::vector<float> ref(static_cast<size_t>(kMaxTokens * out));
    w->forward(ExecContext{1}, x.data(), kMaxTokens, ref.data());
    std::vector<double> worst(2, 0.0);
    auto run = [&](int thread) {
      std::vector<float> y(ref.size());
      for (int64_t i = 0; i < 150; ++i) {
        const int64_t num_tokens = 65 + 2 * i + thread;  // each thread its own counts
        w->forward(ExecContext{1}, x.data(), num_tokens, y.data());
        const std::vector<float> got(y.begin(), y.begin() + num_tokens * out);
        const std::vector<float> want(ref.begin(), ref.begin() + num_tokens * out);
        worst[static_cast<size_t>(thread)] =
            std::max(worst[static_cast<size_t>(thread)], rel_rms(got, want));
      }
    };
    std::thread other(run, 1);
    run(0);
    other.join();
    EXPECT_LT(worst[0], kFp32Tolerance) << w->out_features();
    EXPECT_LT(worst[1], kFp32Tolerance) << w->out_features();
  }
}

TEST(LinearWeight, Fp8GemvInTokenPassesMatchesFp64) {
  // 6144 inputs are 12 KiB of BF16 activations per token: the GEMV runs 4–8 tokens in several
  // passes (gemv_tokens_per_pass) and every token must come out as alone. Not bit for bit: passes
  // of one or two tokens sum each block in two chains, larger ones in one.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t out = 40, in = 6144;
  Fp8Weight fp8 = random_fp8(rng, out, in, 128, 128, false);
  Result<LinearWeight> weight = load(fp8);
  ASSERT_TRUE(weight.ok());
  for (int64_t tokens = 2; tokens <= detail::kFp8GemvMaxTokens; ++tokens) {
    const std::vector<float> x = random_normal(rng, tokens * in);
    std::vector<float> y(static_cast<size_t>(tokens * out));
    weight->forward(ExecContext{2}, x.data(), tokens, y.data());
    EXPECT_LT(forward_rel_rms(*weight, x, tokens, y), kFp32Tolerance) << tokens;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> alone(static_cast<size_t>(out));
      weight->forward(ExecContext{2}, x.data() + t * in, 1, alone.data());
      EXPECT_LT(rel_rms(std::vector<float>(y.begin() + t * out, y.begin() + (t + 1) * out), alone),
                kFp32Tolerance)
          << "token " << t << " of " << tokens;
    }
  }
}

TEST(LinearKernels, TokenPassesAreEvenAndCoverEveryToken) {
  for (int64_t num_tokens = 1; num_tokens <= 20; ++num_tokens)
    for (int64_t per_pass = 1; per_pass <= 8; ++per_pass) {
      SCOPED_TRACE(::testing::Message() << num_tokens << " tokens, " << per_pass << " per pass");
      std::vector<int64_t> counts;
      int64_t next = 0;
      detail::for_each_token_pass(num_tokens, per_pass, [&](int64_t first, int64_t count) {
        EXPECT_EQ(first, next);
        next = first + count;
        counts.push_back(count);
      });
      EXPECT_EQ(next, num_tokens);
      EXPECT_EQ(static_cast<int64_t>(counts.size()), (num_tokens + per_pass - 1) / per_pass);
      EXPECT_LE(*std::max_element(counts.begin(), counts.end()), per_pass);
      EXPECT_LE(*std::max_element(counts.begin(), counts.end()) -
                    *std::min_element(counts.begin(), counts.end()),
                1);
    }
  // Fewer tokens per pass as each token's activations grow, never 0 and never above the maximum.
  int64_t previous = 8;
  for (int64_t bytes = 256; bytes <= (int64_t{1} << 20); bytes *= 2) {
    const int64_t per_pass = detail::gemv_tokens_per_pass(bytes, 16384, 8);
    EXPECT_GE(per_pass, 1) << bytes;
    EXPECT_LE(per_pass, previous) << bytes;
    previous = per_pass;
  }
  EXPECT_EQ(detail::gemv_tokens_per_pass(256, 4096, 8), 8);
  EXPECT_EQ(detail::gemv_tokens_per_pass(int64_t{1} << 20, 4096, 8), 1);
}

TEST(LinearKernels, RoundToBf16MatchesTheCodec) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<float> x = random_normal(rng, 1000, 100.0f);
  // Ties, halfway cases, specials, subnormals, the largest finite value.
  for (uint32_t bits : {0x3F808000u, 0x3F818000u, 0x7F7FFFFFu, 0xFF800000u, 0x7FC00001u,
                        0xFFFFFFFFu, 0x00000001u, 0x80008000u, 0x007FFFFFu, 0x00000000u})
    x.push_back(std::bit_cast<float>(bits));
  x.push_back(1.0f);  // 1011 values: a masked tail
  std::vector<uint16_t> codes(x.size());
  std::vector<float> values(x.size());
  detail::round_to_bf16_avx512(x.data(), static_cast<int64_t>(x.size()), codes.data(),
                               values.data());
  for (size_t e = 0; e < x.size(); ++e) {
    ASSERT_EQ(codes[e], formats::encode_bf16(x[e])) << std::hex << std::bit_cast<uint32_t>(x[e]);
    ASSERT_EQ(std::bit_cast<uint32_t>(values[e]), uint32_t{codes[e]} << 16);
  }
}

TEST(LinearKernels, Fp8GemvMatchesTheReferenceForEveryTokenCount) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : kCases) {
    Fp8Weight fp8 = random_fp8(rng, c.out, c.in, 128, 128, false);
    for (int64_t num_tokens = 1; num_tokens <= detail::kFp8GemvMaxTokens; ++num_tokens) {
      std::vector<float> x = random_normal(rng, num_tokens * c.in);
      for (auto& v : x) v = formats::round_to_bf16(v);
      std::vector<float> y(static_cast<size_t>(num_tokens * c.out)), ref(y.size());
      // Two row ranges, as parallel_for hands them out, the split not on a row-tile boundary.
      const int64_t split = c.out / 3;
      detail::fp8_gemv_rows_avx512(fp8.codes.data(), fp8.scales.data(), fp8.shape, x.data(),
                                   num_tokens, y.data(), 0, split);
      detail::fp8_gemv_rows_avx512(fp8.codes.data(), fp8.scales.data(), fp8.shape, x.data(),
                                   num_tokens, y.data(), split, c.out);
      linear_fp8_block_ref(fp8.codes.data(), fp8.scales.data(), fp8.shape, x.data(), num_tokens,
                           ref.data());
      EXPECT_LT(rel_rms(y, ref), kFp32Tolerance)
          << "[" << c.out << ", " << c.in << "] tokens " << num_tokens;
    }
  }
}

// The BF16 GEMV (docs/formats.md §6.4a byte tables + VDPBF16PS) against the scalar reference: odd
// shapes, block widths 64 and 128, every token count of one pass, codes that include ±0 and
// subnormals (the reference is never all zero: relative errors stay defined), arbitrary scales.
TEST(LinearKernels, Fp8Bf16GemvMatchesTheReferenceForEveryTokenCount) {
  if (!cpu_features().avx512_vbmi || !cpu_features().avx512_bf16)
    GTEST_SKIP() << "no AVX512_VBMI/BF16";
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t block_cols : {64, 128}) {
    for (const Case& c : kCases) {
      Fp8Weight fp8 = random_fp8(rng, c.out, c.in, 128, block_cols, false);
      for (auto& code : fp8.codes)
        if (rng() % 8 == 0) code = static_cast<uint8_t>(rng() % 8 | (rng() % 2) << 7);
      ASSERT_TRUE(detail::fp8_bf16_gemv_takes(fp8.shape));
      const int64_t x_elems = detail::fp8_gemv_x_elems(c.in);
      for (int64_t num_tokens = 1; num_tokens <= detail::kFp8GemvMaxTokens; ++num_tokens) {
        const std::vector<float> x = random_normal(rng, num_tokens * c.in);
        AlignedBuffer packed(static_cast<size_t>(num_tokens * x_elems) * sizeof(uint16_t));
        auto* xp = reinterpret_cast<uint16_t*>(packed.data());
        for (int64_t t = 0; t < num_tokens; ++t)
          detail::fp8_pack_x_avx512(x.data() + t * c.in, c.in, xp + t * x_elems);
        std::vector<float> y(static_cast<size_t>(num_tokens * c.out)), ref(y.size());
        const int64_t split = c.out / 3;
        detail::fp8_gemv_bf16_rows_avx512(fp8.codes.data(), fp8.scales.data(), fp8.shape, xp,
                                          num_tokens, y.data(), 0, split);
        detail::fp8_gemv_bf16_rows_avx512(fp8.codes.data(), fp8.scales.data(), fp8.shape, xp,
                                          num_tokens, y.data(), split, c.out);
        linear_fp8_block_ref(fp8.codes.data(), fp8.scales.data(), fp8.shape, x.data(), num_tokens,
                             ref.data());
        EXPECT_LT(rel_rms(y, ref), kFp32Tolerance)
            << "[" << c.out << ", " << c.in << "] block " << block_cols << " tokens " << num_tokens;
      }
    }
  }
}

// Every finite E4M3 code (±0 and the subnormals included) decodes to exactly its value: row i
// holds code i at column i % 64 and zeros elsewhere, x is all ones, so y[i] is the one product.
TEST(LinearKernels, Fp8Bf16GemvDecodesEveryCodeExactly) {
  if (!cpu_features().avx512_vbmi || !cpu_features().avx512_bf16)
    GTEST_SKIP() << "no AVX512_VBMI/BF16";
  constexpr int64_t kIn = 64;
  const formats::Fp8BlockShape shape{256, kIn, 128, 64};
  std::vector<uint8_t> codes(static_cast<size_t>(256 * kIn), 0);
  for (int i = 0; i < 256; ++i)
    codes[static_cast<size_t>(i * kIn + i % kIn)] =
        (i & 0x7F) == 0x7F ? uint8_t{0} : static_cast<uint8_t>(i);
  const std::vector<float> scales(2, 1.0f);
  const std::vector<float> x(kIn, 1.0f);
  AlignedBuffer packed(kIn * sizeof(uint16_t));
  auto* xp = reinterpret_cast<uint16_t*>(packed.data());
  detail::fp8_pack_x_avx512(x.data(), kIn, xp);
  std::vector<float> y(256);
  detail::fp8_gemv_bf16_rows_avx512(codes.data(), scales.data(), shape, xp, 1, y.data(), 0, 256);
  for (int i = 0; i < 256; ++i) {
    const uint8_t code = codes[static_cast<size_t>(i * kIn + i % kIn)];
    EXPECT_EQ(y[static_cast<size_t>(i)], formats::decode_e4m3(code)) << "code " << int{code};
  }
}

// An FP8 GEMM (AMX or VDPBF16PS) against the scalar reference: block widths 64 and 128, odd shapes
// (a partial last row group, chunk and block), codes that include ±0 and subnormals, arbitrary
// scales, token counts of one tile to several passes of four, the row groups split over two calls.
using Fp8GemmGroups = void (*)(const uint8_t*, const float*, const formats::Fp8BlockShape&,
                               const uint16_t*, int64_t, float*, int64_t, int64_t);
void expect_fp8_gemm_matches_reference(Fp8GemmGroups gemm_groups) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t block_cols : {64, 128}) {
    for (const Case& c : kCases) {
      Fp8Weight fp8 = random_fp8(rng, c.out, c.in, 128, block_cols, false);
      for (auto& code : fp8.codes)
        if (rng() % 8 == 0) code = static_cast<uint8_t>(rng() % 8 | (rng() % 2) << 7);
      for (int64_t num_tokens : {1, 5, 16, 17, 64, 65, 150}) {
        const std::vector<float> x = random_normal(rng, num_tokens * c.in);
        AlignedBuffer packed(static_cast<size_t>(detail::fp8_x_tile_words(c.in, num_tokens)) *
                             sizeof(uint16_t));
        auto* xb = reinterpret_cast<uint16_t*>(packed.data());
        const int64_t tiles = (num_tokens + 15) / 16;
        detail::fp8_pack_x_tiles(x.data(), c.in, num_tokens, 0, tiles / 2, xb);
        detail::fp8_pack_x_tiles(x.data(), c.in, num_tokens, tiles / 2, tiles, xb);
        std::vector<float> y(static_cast<size_t>(num_tokens * c.out)), ref(y.size());
        const int64_t groups = (c.out + 15) / 16, split = groups / 2;
        gemm_groups(fp8.codes.data(), fp8.scales.data(), fp8.shape, xb, num_tokens, y.data(), 0,
                    split);
        gemm_groups(fp8.codes.data(), fp8.scales.data(), fp8.shape, xb, num_tokens, y.data(), split,
                    groups);
        linear_fp8_block_ref(fp8.codes.data(), fp8.scales.data(), fp8.shape, x.data(), num_tokens,
                             ref.data());
        EXPECT_LT(rel_rms(y, ref), kFp32Tolerance)
            << "[" << c.out << ", " << c.in << "] block " << block_cols << " tokens " << num_tokens;
      }
    }
  }
}

TEST(LinearKernels, Fp8AmxGemmMatchesTheReference) {
  if (!cpu_features().amx_bf16) GTEST_SKIP() << "no AMX-BF16";
  expect_fp8_gemm_matches_reference(detail::fp8_amx_gemm_groups);
}

TEST(LinearKernels, Fp8Bf16GemmMatchesTheReference) {
  if (!cpu_features().avx512_vbmi || !cpu_features().avx512_bf16)
    GTEST_SKIP() << "no AVX512_VBMI/BF16";
  expect_fp8_gemm_matches_reference(detail::fp8_bf16_gemm_groups);
}

TEST(LinearKernels, DequantizedTilesAreExact) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (bool pow2 : {true, false}) {
    Fp8Weight fp8 = random_fp8(rng, 150, 200, 64, 48, pow2);
    for (auto& c : fp8.codes)  // every finite code, signs and subnormals included
      if (rng() % 4 == 0) c = static_cast<uint8_t>(rng() % 8 | (rng() % 2) << 7);
    std::vector<float> expected(fp8.codes.size());
    formats::dequantize_fp8_block(fp8.codes, fp8.scales, fp8.shape, expected);
    const int64_t begin = 37, end = 150;
    std::vector<float> f32(static_cast<size_t>((end - begin) * 200));
    detail::fp8_dequantize_rows_f32_avx512(fp8.codes.data(), fp8.scales.data(), fp8.shape, begin,
                                           end, f32.data());
    for (size_t e = 0; e < f32.size(); ++e)
      ASSERT_EQ(std::bit_cast<uint32_t>(f32[e]), std::bit_cast<uint32_t>(expected[begin * 200 + e]))
          << e;
    if (!pow2) continue;
    std::vector<uint16_t> bf16(f32.size());
    detail::fp8_dequantize_rows_bf16_avx512(fp8.codes.data(), fp8.scales.data(), fp8.shape, begin,
                                            end, bf16.data());
    for (size_t e = 0; e < bf16.size(); ++e)
      ASSERT_EQ(formats::decode_bf16(bf16[e]), expected[begin * 200 + e]) << e;
  }
}

TEST(LinearWeight, RefusesBadPlainWeights) {
  std::vector<float> f32(12, 1.0f);
  auto rank1 = LinearWeight::from_float(TensorView(f32.data(), DType::kF32, Shape{12}));
  ASSERT_FALSE(rank1.ok());
  EXPECT_EQ(rank1.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(rank1.status().message(), HasSubstr("expected rank 2 [out, in], found shape [12]"));
  auto ints = LinearWeight::from_float(TensorView(f32.data(), DType::kI32, Shape{3, 4}));
  ASSERT_FALSE(ints.ok());
  EXPECT_EQ(ints.status().code(), StatusCode::kUnsupported);
  EXPECT_THAT(ints.status().message(), HasSubstr("expected dtype BF16, F16 or F32, found I32"));
  auto empty = LinearWeight::from_float(TensorView(f32.data(), DType::kF32, Shape{0, 4}));
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("expected a non-empty [out, in], found [0, 4]"));
}

TEST(LinearWeight, RefusesBadFp8Weights) {
  std::mt19937 rng(3);
  Fp8Weight fp8 = random_fp8(rng, 130, 200, 128, 128, true);  // scales [2, 2]
  TensorView codes(fp8.codes.data(), DType::kF8E4M3, Shape{130, 200});
  TensorView scales(fp8.scales.data(), DType::kF32, Shape{2, 2});

  auto bad_shape = LinearWeight::from_fp8_block(
      codes, TensorView(fp8.scales.data(), DType::kF32, Shape{1, 2}), 128, 128);
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_EQ(bad_shape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_shape.status().message(),
              HasSubstr("expected shape [2, 2] for weight [130, 200] in [128, 128] blocks, found "
                        "[1, 2]"));

  auto bad_scale_dtype = LinearWeight::from_fp8_block(
      codes, TensorView(fp8.scales.data(), DType::kBF16, Shape{2, 2}), 128, 128);
  ASSERT_FALSE(bad_scale_dtype.ok());
  EXPECT_THAT(bad_scale_dtype.status().message(),
              HasSubstr("scale_inv: expected dtype F32, found BF16"));

  auto bad_code_dtype = LinearWeight::from_fp8_block(
      TensorView(fp8.codes.data(), DType::kF8E5M2, Shape{130, 200}), scales, 128, 128);
  ASSERT_FALSE(bad_code_dtype.ok());
  EXPECT_THAT(bad_code_dtype.status().message(),
              HasSubstr("expected dtype F8_E4M3, found F8_E5M2"));

  auto bad_rank = LinearWeight::from_fp8_block(
      TensorView(fp8.codes.data(), DType::kF8E4M3, Shape{130, 2, 100}), scales, 128, 128);
  ASSERT_FALSE(bad_rank.ok());
  EXPECT_THAT(bad_rank.status().message(), HasSubstr("expected rank 2 [out, in]"));

  auto bad_block = LinearWeight::from_fp8_block(codes, scales, 0, 128);
  ASSERT_FALSE(bad_block.ok());
  EXPECT_THAT(bad_block.status().message(),
              HasSubstr("expected a positive block size, found [0, 128]"));

  fp8.codes[1 * 200 + 7] = 0xFF;
  auto nan_code = LinearWeight::from_fp8_block(codes, scales, 128, 128);
  ASSERT_FALSE(nan_code.ok());
  EXPECT_EQ(nan_code.status().code(), StatusCode::kCorrupt);
  EXPECT_THAT(nan_code.status().message(), HasSubstr("E4M3 NaN code 0xFF at index [1, 7]"));
  fp8.codes[1 * 200 + 7] = 0x10;

  fp8.scales[3] = std::numeric_limits<float>::infinity();
  auto inf_scale = LinearWeight::from_fp8_block(codes, scales, 128, 128);
  ASSERT_FALSE(inf_scale.ok());
  EXPECT_EQ(inf_scale.status().code(), StatusCode::kCorrupt);
  EXPECT_THAT(inf_scale.status().message(), HasSubstr("non-finite value inf at index [1, 1]"));
}

}  // namespace linear_test
}  // namespace dz::kernels
