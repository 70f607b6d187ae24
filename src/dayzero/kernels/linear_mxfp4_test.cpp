// LinearWeight on compressed-tensors MXFP4 weights (linear.h, docs/formats.md §3.4): load checks,
// dequantize() and the tile decoder against the formats reference (bit-exact), and forward() —
// the fused GEMV (1–8 tokens) and the dequantized-tile GEMM (more) — against an FP64 product of
// the BF16-rounded activations and the exact weights. Tolerance: relative RMS error < 1e-5. Every
// product is exact (E2M1 has 2 significant bits, BF16 activations 8) and VDPBF16PS / oneDNN add
// them in FP32, rounding each pair sum separately (docs/formats.md §6): errors of a few 2^-24 per
// addition, ~1e-7 relative for K ≤ 1024, far below the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/formats/mx_block.h"
#include "dayzero/formats/mxfp4_layouts.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/linear_mxfp4.h"
#include "dayzero/kernels/linear_ref.h"

namespace dz::kernels {
namespace linear_mxfp4_test {

constexpr double kTolerance = 1e-5;

struct Mxfp4 {
  int64_t out = 0, in = 0;
  std::vector<uint8_t> packed;  // [out, in/2]
  std::vector<uint8_t> scales;  // [out, in/32]
};

// Fresh random weights quantized by the formats encoder (EVEN rule, as compressed-tensors), row
// magnitudes spread over 2^-12 … 2^4 so scale codes range over about 110–130.
Mxfp4 quantized_weight(std::mt19937& rng, int64_t out, int64_t in) {
  Mxfp4 w{out, in, {}, {}};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> magnitude(-12, 4);
  std::vector<float> values(static_cast<size_t>(out * in));
  for (int64_t i = 0; i < out; ++i) {
    const float sigma = std::ldexp(1.0f, magnitude(rng));
    for (int64_t j = 0; j < in; ++j) values[static_cast<size_t>(i * in + j)] = normal(rng) * sigma;
  }
  std::vector<uint8_t> codes(values.size());
  w.scales.resize(values.size() / 32);
  formats::quantize_mx(values, formats::MxElem::kE2M1,
                       formats::MxScaleRule::kFloorLog2AmaxRoundedAt1p75, codes, w.scales);
  w.packed.resize(values.size() / 2);
  formats::pack_fp4(codes, w.packed);
  return w;
}

// Random bytes (every E2M1 code in both nibbles) with scale codes drawn from [lo, hi].
Mxfp4 random_weight(std::mt19937& rng, int64_t out, int64_t in, int scale_lo, int scale_hi) {
  Mxfp4 w{out, in, std::vector<uint8_t>(static_cast<size_t>(out * in / 2)),
          std::vector<uint8_t>(static_cast<size_t>(out * in / 32))};
  std::uniform_int_distribution<int> byte(0, 255), scale(scale_lo, scale_hi);
  for (auto& b : w.packed) b = static_cast<uint8_t>(byte(rng));
  for (auto& s : w.scales) s = static_cast<uint8_t>(scale(rng));
  return w;
}

// Mostly realistic codes, with a tenth of the blocks at 0–2 and a tenth at 180–200. The first block
// of every row stays realistic: a row made only of code-2 blocks would give products below 2^-126,
// which the BF16 tiles' AMX flushes (docs/formats.md §6) — a deviation far below any real weight ·
// activation, but a large relative one for such a row.
Mxfp4 mixed_scale_weight(std::mt19937& rng, int64_t out, int64_t in) {
  Mxfp4 w = random_weight(rng, out, in, 115, 130);
  std::uniform_int_distribution<int> pick(0, 9), tiny(0, 2), high(180, 200);
  for (size_t k = 0; k < w.scales.size(); ++k) {
    if (k % static_cast<size_t>(in / 32) == 0) continue;
    const int p = pick(rng);
    if (p == 0) w.scales[k] = static_cast<uint8_t>(tiny(rng));
    if (p == 1) w.scales[k] = static_cast<uint8_t>(high(rng));
  }
  return w;
}

Result<LinearWeight> load(const Mxfp4& w) {
  TensorView packed(const_cast<uint8_t*>(w.packed.data()), DType::kU8, Shape{w.out, w.in / 2});
  TensorView scales(const_cast<uint8_t*>(w.scales.data()), DType::kU8, Shape{w.out, w.in / 32});
  return LinearWeight::from_mxfp4(packed, scales);
}

std::vector<float> exact_values(const Mxfp4& w) {
  std::vector<float> v(static_cast<size_t>(w.out * w.in));
  formats::dequantize_mxfp4_packed(w.packed, w.scales, w.out, w.in, v);
  return v;
}

std::vector<float> random_x(std::mt19937& rng, int64_t num_elems) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(num_elems));
  for (auto& e : x) e = normal(rng);
  return x;
}

// ‖y − ref‖ / ‖ref‖, ref = bf16(x) · Wᵀ in FP64 over the exact weight values.
double rel_rms(const Mxfp4& w, const std::vector<float>& x, int64_t num_tokens,
               const std::vector<float>& y) {
  const std::vector<float> values = exact_values(w);
  double err2 = 0.0, ref2 = 0.0;
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t i = 0; i < w.out; ++i) {
      double ref = 0.0;
      for (int64_t j = 0; j < w.in; ++j)
        ref += static_cast<double>(formats::round_to_bf16(x[static_cast<size_t>(t * w.in + j)])) *
               values[static_cast<size_t>(i * w.in + j)];
      const double diff = y[static_cast<size_t>(t * w.out + i)] - ref;
      err2 += diff * diff;
      ref2 += ref * ref;
    }
  return std::sqrt(err2 / ref2);
}

struct Case {
  int64_t out, in;
};
// in = 32 and 64 (the tiny K3 experts), block counts that are not multiples of 4 (the GEMV tail),
// odd out counts (partial 4-row groups, partial 16-row AMX groups and partial tiles); 66 blocks
// take two chunks of the AMX GEMM.
const Case kCases[] = {{1, 32},    {3, 64},    {5, 96},    {64, 64},
                       {130, 256}, {257, 480}, {33, 1024}, {19, 2112}};
// Without AMX 1–8 run the GEMV (one pass of kMxfp4GemvMaxTokens), 9+ the tiles; 300 spans two
// token tiles. With AMX 1–16 run the AMX GEMV, more the AMX GEMM (or GEMV passes of 16 when scales
// cannot be folded), 300 = 4 + 4 + 4 + 4 + 3 token tiles.
const int64_t kTokenCounts[] = {1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 64, 300};

void expect_forward_matches(const Mxfp4& w, std::mt19937& rng, int num_threads) {
  Result<LinearWeight> linear = load(w);
  ASSERT_TRUE(linear.ok()) << linear.status().to_string();
  for (int64_t tokens : kTokenCounts) {
    SCOPED_TRACE(::testing::Message() << "[" << w.out << ", " << w.in << "] tokens " << tokens);
    const std::vector<float> x = random_x(rng, tokens * w.in);
    std::vector<float> y(static_cast<size_t>(tokens * w.out), -1.0f);
    linear->forward(ExecContext{num_threads}, x.data(), tokens, y.data());
    EXPECT_LT(rel_rms(w, x, tokens, y), kTolerance);
  }
}

unsigned fresh_seed() {
  return std::random_device{}();
}

TEST(LinearMxfp4, DequantizeIsExact) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : kCases) {
    // Every non-NaN scale code, including 0 (2^-127, an FP32 subnormal) and 254.
    const Mxfp4 w = random_weight(rng, c.out, c.in, 0, 254);
    Result<LinearWeight> linear = load(w);
    ASSERT_TRUE(linear.ok()) << linear.status().to_string();
    EXPECT_TRUE(linear->is_mxfp4());
    EXPECT_FALSE(linear->is_fp8_block());
    EXPECT_EQ(linear->out_features(), c.out);
    EXPECT_EQ(linear->in_features(), c.in);
    // Packed codes, scales and one flag byte per row: 4.25 bits per weight plus 1 byte per row;
    // the AMX tile layout pads the rows to a multiple of 16.
    const int64_t rows = mxfp4_amx_available() ? (c.out + 15) / 16 * 16 : c.out;
    EXPECT_EQ(linear->stored_bytes(), rows * c.in / 2 + rows * c.in / 32 + c.out);
    std::vector<float> dense(static_cast<size_t>(c.out * c.in));
    linear->dequantize(dense.data());
    for (int64_t i = 0; i < c.out; ++i)
      for (int64_t j = 0; j < c.in; ++j) {
        const auto k = static_cast<size_t>(i * c.in + j);
        const uint8_t byte = w.packed[k / 2];
        const float expected =
            formats::decode_e2m1_int(static_cast<uint8_t>(j % 2 == 0 ? byte & 0xF : byte >> 4)) *
            formats::decode_e8m0_int(w.scales[k / 32]);
        ASSERT_EQ(std::memcmp(&dense[k], &expected, sizeof(float)), 0) << i << "," << j;
      }
  }
}

TEST(LinearMxfp4, TileDecoderIsExact) {
  if (!cpu_features().avx512) GTEST_SKIP() << "no AVX-512";
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Mxfp4 w = random_weight(rng, 37, 480, 0, 254);
  const std::vector<float> exact = exact_values(w);
  const int64_t begin = 3, end = 29;
  std::vector<float> f32(static_cast<size_t>((end - begin) * w.in));
  std::vector<uint16_t> bf16(f32.size());
  detail::mxfp4_dequantize_rows_avx512(w.packed.data(), w.scales.data(), w.in, begin, end, nullptr,
                                       f32.data());
  detail::mxfp4_dequantize_rows_avx512(w.packed.data(), w.scales.data(), w.in, begin, end,
                                       bf16.data(), nullptr);
  for (size_t e = 0; e < f32.size(); ++e) {
    const float expected = exact[static_cast<size_t>(begin * w.in) + e];
    ASSERT_EQ(std::memcmp(&f32[e], &expected, sizeof(float)), 0) << e;
    ASSERT_EQ(formats::decode_bf16(bf16[e]), expected) << e;
  }
}

TEST(LinearMxfp4, ForwardMatchesFp64OnQuantizedWeights) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : kCases) expect_forward_matches(quantized_weight(rng, c.out, c.in), rng, 2);
}

TEST(LinearMxfp4, ForwardMatchesFp64WithTinyAndHighScales) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : kCases) expect_forward_matches(mixed_scale_weight(rng, c.out, c.in), rng, 2);
}

TEST(LinearMxfp4, ForwardKeepsSubnormalBlockValues) {
  // Every scale code 0–2: weights 2^-128 … 6·2^-125, BF16 subnormals for codes 0 and 1. The GEMV
  // scales in FP32 and a tile with such rows is FP32 (here every tile has them), so nothing is
  // flushed: the error bound is the same as for ordinary weights (BF16 tiles gave 6–8 %).
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : {Case{7, 64}, Case{130, 256}})
    expect_forward_matches(random_weight(rng, c.out, c.in, 0, 2), rng, 1);
}

TEST(LinearMxfp4, RowsLongerThanTheWorkspaceRunTheGemvInPasses) {
  // One BF16 row of 524320 inputs is over the 1 MiB tile workspace: 9 and 20 tokens take GEMV
  // passes of 8 instead of tiles.
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Mxfp4 w = random_weight(rng, 3, 524320, 118, 126);
  Result<LinearWeight> linear = load(w);
  ASSERT_TRUE(linear.ok());
  for (int64_t tokens : {9, 20}) {
    const std::vector<float> x = random_x(rng, tokens * w.in);
    std::vector<float> y(static_cast<size_t>(tokens * w.out));
    linear->forward(ExecContext{2}, x.data(), tokens, y.data());
    // One dot product of 524,320 terms in FP32: the portable path (DZ_CPU_ISA=generic) sums it
    // with few accumulators, whose rounding grows like √n · 2⁻²⁴ ≈ 4e-5 (1.3e-5 seen), above the
    // bound of ordinary rows.
    EXPECT_LT(rel_rms(w, x, tokens, y), 1e-4) << tokens;
  }
}

TEST(LinearMxfp4, TokenPassesDoNotChangeATokensResult) {
  // 8192 inputs are 16 KiB of activations per token: the GEMV runs 2–8 tokens in several passes
  // (gemv_tokens_per_pass), and each token's outputs must equal its own one-token forward.
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Mxfp4 w = quantized_weight(rng, 37, 8192);
  Result<LinearWeight> linear = load(w);
  ASSERT_TRUE(linear.ok());
  for (int64_t tokens = 2; tokens <= detail::kMxfp4GemvMaxTokens; ++tokens) {
    const std::vector<float> x = random_x(rng, tokens * w.in);
    std::vector<float> y(static_cast<size_t>(tokens * w.out));
    linear->forward(ExecContext{2}, x.data(), tokens, y.data());
    EXPECT_LT(rel_rms(w, x, tokens, y), kTolerance) << tokens;
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<float> alone(static_cast<size_t>(w.out));
      linear->forward(ExecContext{2}, x.data() + t * w.in, 1, alone.data());
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), y.begin() + t * w.out))
          << "token " << t << " of " << tokens;
    }
  }
}

TEST(LinearMxfp4, ThreadCountDoesNotChangeResults) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Mxfp4 w = quantized_weight(rng, 203, 512);
  Result<LinearWeight> linear = load(w);
  ASSERT_TRUE(linear.ok());
  for (int64_t tokens : {1, 5, 40}) {
    const std::vector<float> x = random_x(rng, tokens * w.in);
    std::vector<float> y1(static_cast<size_t>(tokens * w.out)), y3(y1.size());
    linear->forward(ExecContext{1}, x.data(), tokens, y1.data());
    linear->forward(ExecContext{3}, x.data(), tokens, y3.data());
    EXPECT_EQ(y1, y3) << tokens;
  }
}

TEST(LinearMxfp4, ScalarReferenceMatchesFp64) {
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : kCases) {
    const Mxfp4 w = mixed_scale_weight(rng, c.out, c.in);
    const int64_t tokens = 3;
    const std::vector<float> x = random_x(rng, tokens * c.in);
    std::vector<float> y(static_cast<size_t>(tokens * c.out));
    linear_mxfp4_ref(w.packed.data(), w.scales.data(), c.out, c.in, x.data(), tokens, y.data());
    EXPECT_LT(rel_rms(w, x, tokens, y), kTolerance);
  }
}

TEST(LinearMxfp4, GemvKernelMatchesTheReferenceForEveryTokenCount) {
  if (!cpu_features().avx512 || !cpu_features().avx512_bf16) GTEST_SKIP() << "no AVX512_BF16";
  const unsigned seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const Mxfp4 w = quantized_weight(rng, 23, 352);  // 11 blocks: two steps of 4, a tail of 3
  const int64_t x_elems = detail::mxfp4_gemv_x_elems(w.in);
  for (int64_t tokens = 1; tokens <= detail::kMxfp4GemvMaxTokens; ++tokens) {
    const std::vector<float> x = random_x(rng, tokens * w.in);
    AlignedBuffer x_storage(static_cast<size_t>(tokens * x_elems) * sizeof(uint16_t));
    auto* x_packed = reinterpret_cast<uint16_t*>(x_storage.data());
    for (int64_t t = 0; t < tokens; ++t)
      detail::mxfp4_pack_x_avx512(x.data() + t * w.in, w.in, x_packed + t * x_elems);
    std::vector<float> y(static_cast<size_t>(tokens * w.out), -1.0f);
    // Rows 2..20 only: the others must stay untouched.
    detail::mxfp4_gemv_rows_avx512(w.packed.data(), w.scales.data(), w.in, x_packed, tokens,
                                   y.data(), w.out, 2, 21);
    std::vector<float> ref(y.size());
    linear_mxfp4_ref(w.packed.data(), w.scales.data(), w.out, w.in, x.data(), tokens, ref.data());
    double err2 = 0.0, ref2 = 0.0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t i = 0; i < w.out; ++i) {
        const auto k = static_cast<size_t>(t * w.out + i);
        if (i < 2 || i >= 21) {
          EXPECT_EQ(y[k], -1.0f);
          continue;
        }
        err2 += (y[k] - ref[k]) * static_cast<double>(y[k] - ref[k]);
        ref2 += static_cast<double>(ref[k]) * ref[k];
      }
    EXPECT_LT(std::sqrt(err2 / ref2), kTolerance) << tokens;
  }
}

TEST(LinearMxfp4, RefusesNanScalesNamingTheIndex) {
  std::mt19937 rng(5);
  Mxfp4 w = random_weight(rng, 3, 64, 100, 140);
  w.scales[5] = 0xFF;  // row 2, block 1
  w.scales[4] = 0xFF;  // the first one: row 2, block 0
  EXPECT_EQ(load(w).status().message(),
            "MXFP4 weight_scale: E8M0 scale code 0xFF (NaN) at index [2, 0] (element 4 of [3, 2])");
  EXPECT_EQ(load(w).status().code(), StatusCode::kCorrupt);
}

TEST(LinearMxfp4, RefusesBadShapesAndDtypes) {
  std::vector<uint8_t> bytes(4096, 0x11);
  const auto from = [&](DType packed_dtype, Shape packed_shape, DType scale_dtype,
                        Shape scale_shape) {
    return LinearWeight::from_mxfp4(TensorView(bytes.data(), packed_dtype, packed_shape),
                                    TensorView(bytes.data(), scale_dtype, scale_shape))
        .status()
        .message();
  };
  EXPECT_EQ(from(DType::kU8, Shape{4, 8}, DType::kU8, Shape{4, 1}),
            "MXFP4 weight_packed: expected [out, in/2] with in a multiple of 32, found shape [4, "
            "8] (in = 16)");
  EXPECT_EQ(from(DType::kU8, Shape{4, 32}, DType::kU8, Shape{4, 4}),
            "MXFP4 weight_scale: expected shape [4, 2] (one code per 32 inputs) for weight_packed "
            "[4, 32], found [4, 4]");
  EXPECT_EQ(from(DType::kU8, Shape{4, 32}, DType::kU8, Shape{5, 2}),
            "MXFP4 weight_scale: expected shape [4, 2] (one code per 32 inputs) for weight_packed "
            "[4, 32], found [5, 2]");
  EXPECT_EQ(from(DType::kI8, Shape{4, 32}, DType::kU8, Shape{4, 2}),
            "MXFP4 weight_packed: expected dtype U8, found I8");
  EXPECT_EQ(from(DType::kU8, Shape{4, 32}, DType::kF32, Shape{4, 2}),
            "MXFP4 weight_scale: expected dtype U8 or F8_E8M0, found F32");
  EXPECT_EQ(from(DType::kU8, Shape{128}, DType::kU8, Shape{4, 2}),
            "MXFP4 weight_packed: expected rank 2 [out, in], found shape [128]");
  // F8_E8M0 scales are accepted like U8.
  EXPECT_TRUE(LinearWeight::from_mxfp4(TensorView(bytes.data(), DType::kU8, Shape{4, 32}),
                                       TensorView(bytes.data(), DType::kF8E8M0, Shape{4, 2}))
                  .ok());
}

TEST(LinearMxfp4, StoredBytesCountEveryFormat) {
  std::mt19937 rng(3);
  const Mxfp4 w = quantized_weight(rng, 96, 256);
  EXPECT_EQ(load(w)->stored_bytes(), 96 * 128 + 96 * 8 + 96);  // 4.25 bits + a flag per row
  // BF16: at least the 2 bytes per weight (oneDNN's blocked layout may pad).
  const std::vector<float> values = random_x(rng, 96 * 256);
  const LinearWeight bf16 = LinearWeight::from_f32_as_bf16(values.data(), 96, 256);
  EXPECT_GE(bf16.stored_bytes(), 96 * 256 * 2);
  EXPECT_LE(bf16.stored_bytes(), 2 * 96 * 256 * 2);
  // FP8 128×128: codes plus FP32 scales [1, 2].
  std::vector<uint8_t> codes(96 * 256, 0x38);
  std::vector<float> scales = {1.0f, 0.5f};
  Result<LinearWeight> fp8 =
      LinearWeight::from_fp8_block(TensorView(codes.data(), DType::kF8E4M3, Shape{96, 256}),
                                   TensorView(scales.data(), DType::kF32, Shape{1, 2}), 128, 128);
  ASSERT_TRUE(fp8.ok());
  EXPECT_EQ(fp8->stored_bytes(), 96 * 256 + 2 * 4);
}

TEST(LinearMxfp4, WorkspaceIsFixedAndHoldsATile) {
  // 1 MiB: 64 BF16 rows of 7168 or 170 of the K3 experts' 3072.
  EXPECT_EQ(LinearWeight::mxfp4_workspace_bytes_per_thread(), size_t{1} << 20);
}

}  // namespace linear_mxfp4_test
}  // namespace dz::kernels
