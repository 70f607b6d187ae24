// MXFP4 weights with MXINT8 activations (formats/mxint8.h, linear_mxfp4.h's 8-bit mode):
// - the block quantizer against its definition (the smallest power-of-two scale that does not
//   saturate, codes rounded half to even);
// - the AVX-512 packer gives the quantizer's codes, offsets and scales;
// - forward() equals linear_mxfp4_mxint8_ref bit for bit (both sum in the order linear_kernels.h
//   states), at every token count, and a token's outputs do not depend on the other tokens;
// - the reference against an FP64 product of the exact weights and the unquantized activations,
//   within the bound the rounding allows: |q·s − x| ≤ s/2 per element, so
//   |y − y_exact| ≤ Σ_j |w_j| · s_b(j)/2 + FP32 summation error (≤ 1e-6 · Σ|w_j x_j|, K ≤ 4096).
// The portable path (DZ_CPU_ISA=generic) runs the reference itself: there the bitwise checks are
// the reference against itself, and the bound check still holds.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/parallel.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/formats/mx_block.h"
#include "dayzero/formats/mxfp4_layouts.h"
#include "dayzero/formats/mxint8.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/linear_mxfp4.h"
#include "dayzero/kernels/linear_ref.h"

namespace dz::kernels {
namespace linear_mxfp4_mxint8_test {

uint32_t seed_of_test() {
  const uint32_t seed = std::random_device{}();
  std::printf("seed %u\n", seed);
  return seed;
}

struct Mxfp4 {
  int64_t out = 0, in = 0;
  std::vector<uint8_t> packed;  // [out, in/2]
  std::vector<uint8_t> scales;  // [out, in/32]
};

// Random bytes (every E2M1 code in both nibbles), scale codes mostly 115–130 with a tenth at 0–2
// (subnormal weight scales) and a tenth at 180–200.
Mxfp4 random_weight(std::mt19937& rng, int64_t out, int64_t in) {
  Mxfp4 w{out, in, std::vector<uint8_t>(static_cast<size_t>(out * in / 2)),
          std::vector<uint8_t>(static_cast<size_t>(out * in / 32))};
  std::uniform_int_distribution<int> byte(0, 255), scale(115, 130), pick(0, 9), tiny(0, 2),
      high(180, 200);
  for (auto& b : w.packed) b = static_cast<uint8_t>(byte(rng));
  for (auto& s : w.scales) {
    const int p = pick(rng);
    s = static_cast<uint8_t>(p == 0 ? tiny(rng) : p == 1 ? high(rng) : scale(rng));
  }
  return w;
}

LinearWeight load(const Mxfp4& w) {
  TensorView packed(const_cast<uint8_t*>(w.packed.data()), DType::kU8, Shape{w.out, w.in / 2});
  TensorView scales(const_cast<uint8_t*>(w.scales.data()), DType::kU8, Shape{w.out, w.in / 32});
  Result<LinearWeight> linear = LinearWeight::from_mxfp4(packed, scales, Mxfp4Activations::kMxint8);
  EXPECT_TRUE(linear.ok()) << linear.status().message();
  return std::move(linear).value();
}

// Activations with block magnitudes spread over 2^-20 … 2^6, a few all-zero blocks, and ties
// (x = (k + 1/2) · scale) that must round to even.
std::vector<float> random_x(std::mt19937& rng, int64_t num_elems) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> magnitude(-20, 6), pick(0, 19);
  std::vector<float> x(static_cast<size_t>(num_elems));
  for (int64_t b = 0; b < num_elems / 32; ++b) {
    const int p = pick(rng);
    const float sigma = std::ldexp(1.0f, magnitude(rng));
    for (int64_t i = 0; i < 32; ++i) {
      float& e = x[static_cast<size_t>(32 * b + i)];
      e = p == 0 ? 0.0f : formats::round_to_bf16(normal(rng) * sigma);
    }
    if (p == 1) {  // exact halves: amax 127·2^k, the others (m + 0.5)·2^k
      x[static_cast<size_t>(32 * b)] = std::ldexp(127.0f, magnitude(rng));
      const int k = static_cast<int>(std::ilogb(x[static_cast<size_t>(32 * b)])) - 6;
      for (int64_t i = 1; i < 32; ++i)
        x[static_cast<size_t>(32 * b + i)] = std::ldexp(static_cast<float>(i % 9) + 0.5f, k);
    }
  }
  return x;
}

TEST(Mxint8, BlockScaleIsTheSmallestThatDoesNotSaturate) {
  std::mt19937 rng(seed_of_test());
  std::uniform_int_distribution<uint32_t> bits(1, 0x7F7FFFFF);  // positive finite, subnormals too
  for (int n = 0; n < 200000; ++n) {
    const float amax = std::bit_cast<float>(bits(rng));
    const int e = formats::mxint8_exponent(amax);
    ASSERT_GE(e, formats::kMxint8MinExponent);
    // 127 · 2^e in double: exact.
    ASSERT_LE(amax, std::ldexp(127.0, e)) << amax;
    if (e > formats::kMxint8MinExponent) {
      ASSERT_GT(amax, std::ldexp(127.0, e - 1)) << amax;
    }
  }
  EXPECT_EQ(formats::mxint8_exponent(127.0f), 0);
  EXPECT_EQ(formats::mxint8_exponent(127.5f), 1);
  EXPECT_EQ(formats::mxint8_exponent(1.0f), -6);
  EXPECT_EQ(formats::mxint8_exponent(std::ldexp(127.0f, -133)), -133);
}

TEST(Mxint8, BlockCodesRoundHalfToEven) {
  std::mt19937 rng(seed_of_test());
  std::vector<float> x = random_x(rng, 32 * 400);
  std::vector<int8_t> q(32);
  for (int64_t b = 0; b < 400; ++b) {
    std::span<const float, 32> block(x.data() + 32 * b, 32);
    const float scale = formats::quantize_mxint8_block(block, std::span<int8_t, 32>(q));
    double amax = 0.0;
    for (float v : block) amax = std::max(amax, std::fabs(static_cast<double>(v)));
    if (amax == 0.0) {
      EXPECT_EQ(scale, 0.0f);
      continue;
    }
    EXPECT_EQ(scale, std::ldexp(1.0f, formats::mxint8_exponent(static_cast<float>(amax))));
    for (int i = 0; i < 32; ++i) {
      const double exact = block[static_cast<size_t>(i)] / static_cast<double>(scale);
      const double floor = std::floor(exact), frac = exact - floor;
      const double expected =
          frac > 0.5 || (frac == 0.5 && std::fmod(floor, 2.0) != 0.0) ? floor + 1 : floor;
      ASSERT_EQ(q[static_cast<size_t>(i)], expected) << "block " << b << " element " << i;
      ASSERT_LE(std::abs(q[static_cast<size_t>(i)]), 127);
    }
  }
  std::vector<float> bad(32, 1.0f);
  bad[7] = std::nanf("");
  EXPECT_TRUE(std::isnan(formats::quantize_mxint8_block(std::span<const float, 32>(bad.data(), 32),
                                                        std::span<int8_t, 32>(q))));
  bad[7] = -INFINITY;
  EXPECT_TRUE(std::isnan(formats::quantize_mxint8_block(std::span<const float, 32>(bad.data(), 32),
                                                        std::span<int8_t, 32>(q))));
}

TEST(Mxint8, PackerGivesTheQuantizersCodes) {
  if (!mxfp4_mxint8_vnni_available()) GTEST_SKIP() << "no AVX-512 VNNI at this DZ_CPU_ISA level";
  std::mt19937 rng(seed_of_test());
  for (int64_t in : {32, 96, 512, 544, 2048, 7168}) {
    const std::vector<float> x = random_x(rng, in);
    AlignedBuffer packed(static_cast<size_t>(detail::mxint8_x_bytes(in)));
    detail::mxint8_pack_x_avx512(x.data(), in, packed.data());
    std::vector<int8_t> q(32);
    for (int64_t b = 0; b < detail::mxint8_num_groups(in) * 16; ++b) {
      const std::byte* group = packed.data() + (b / 16) * detail::kMxint8GroupXBytes;
      const int64_t j = b % 16;
      int32_t offset = 0;
      float half_scale = 0.0f;
      std::memcpy(&offset, group + detail::kMxint8GroupElems + 4 * j, 4);
      std::memcpy(&half_scale, group + detail::kMxint8GroupElems + 64 + 4 * j, 4);
      float scale = 0.0f;
      std::fill(q.begin(), q.end(), int8_t{0});
      if (b < in / 32)
        scale = formats::quantize_mxint8_block(std::span<const float, 32>(x.data() + 32 * b, 32),
                                               std::span<int8_t, 32>(q));
      int32_t sum = 0;
      for (int i = 0; i < 32; ++i) {
        const auto code = static_cast<int8_t>(group[64 * (i / 4) + 4 * j + i % 4]);
        ASSERT_EQ(code, q[static_cast<size_t>(i)]) << "in " << in << " block " << b;
        sum += code;
      }
      EXPECT_EQ(offset, -12 * sum) << "in " << in << " block " << b;
      EXPECT_EQ(half_scale, 0.5f * scale) << "in " << in << " block " << b;
    }
  }
}

struct Case {
  int64_t out, in;
};
// Partial groups of 16 blocks (in = 32, 96, 544, 2112), whole ones, and the DeepSeek-V2-Lite
// expert widths.
const Case kCases[] = {{1, 32}, {5, 96}, {64, 512}, {37, 544}, {19, 2112}, {40, 2048}, {9, 1408}};

TEST(LinearMxfp4Mxint8, ForwardEqualsTheReferenceBitForBit) {
  std::mt19937 rng(seed_of_test());
  for (const Case& c : kCases)
    for (int64_t tokens : {1, 2, 3, 5, 8, 9, 17, 40}) {
      const Mxfp4 w = random_weight(rng, c.out, c.in);
      const LinearWeight linear = load(w);
      const std::vector<float> x = random_x(rng, tokens * c.in);
      std::vector<float> y(static_cast<size_t>(tokens * c.out)), ref(y.size());
      linear.forward(ExecContext{2}, x.data(), tokens, y.data());
      linear_mxfp4_mxint8_ref(w.packed.data(), w.scales.data(), c.out, c.in, x.data(), tokens,
                              ref.data());
      for (size_t k = 0; k < y.size(); ++k)
        ASSERT_EQ(std::bit_cast<uint32_t>(y[k]), std::bit_cast<uint32_t>(ref[k]))
            << "[" << c.out << ", " << c.in << "] " << tokens << " tokens, output " << k << ": "
            << y[k] << " vs " << ref[k];
    }
}

TEST(LinearMxfp4Mxint8, TokensEqualTheirOneTokenForwardBitForBit) {
  std::mt19937 rng(seed_of_test());
  const Mxfp4 w = random_weight(rng, 70, 2048);
  const LinearWeight linear = load(w);
  const int64_t tokens = 23;
  const std::vector<float> x = random_x(rng, tokens * w.in);
  std::vector<float> y(static_cast<size_t>(tokens * w.out)), one(static_cast<size_t>(w.out));
  linear.forward(ExecContext{2}, x.data(), tokens, y.data());
  for (int64_t t = 0; t < tokens; ++t) {
    linear.forward(ExecContext{1}, x.data() + t * w.in, 1, one.data());
    for (int64_t i = 0; i < w.out; ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(y[static_cast<size_t>(t * w.out + i)]),
                std::bit_cast<uint32_t>(one[static_cast<size_t>(i)]))
          << "token " << t << " row " << i;
  }
}

TEST(LinearMxfp4Mxint8, ReferenceIsWithinTheQuantizationBound) {
  std::mt19937 rng(seed_of_test());
  for (const Case& c : kCases) {
    const Mxfp4 w = random_weight(rng, c.out, c.in);
    const int64_t tokens = 3;
    const std::vector<float> x = random_x(rng, tokens * c.in);
    std::vector<float> values(static_cast<size_t>(c.out * c.in));
    formats::dequantize_mxfp4_packed(w.packed, w.scales, c.out, c.in, values);
    std::vector<float> y(static_cast<size_t>(tokens * c.out));
    linear_mxfp4_mxint8_ref(w.packed.data(), w.scales.data(), c.out, c.in, x.data(), tokens,
                            y.data());
    std::vector<int8_t> q(32);
    for (int64_t t = 0; t < tokens; ++t) {
      std::vector<double> half_step(static_cast<size_t>(c.in / 32));
      for (int64_t b = 0; b < c.in / 32; ++b)
        half_step[static_cast<size_t>(b)] =
            0.5 * formats::quantize_mxint8_block(
                      std::span<const float, 32>(x.data() + t * c.in + 32 * b, 32),
                      std::span<int8_t, 32>(q));
      for (int64_t i = 0; i < c.out; ++i) {
        double exact = 0.0, bound = 0.0, magnitude = 0.0;
        for (int64_t j = 0; j < c.in; ++j) {
          const double wv = values[static_cast<size_t>(i * c.in + j)];
          const double xv = x[static_cast<size_t>(t * c.in + j)];
          exact += wv * xv;
          bound += std::fabs(wv) * half_step[static_cast<size_t>(j / 32)];
          magnitude += std::fabs(wv * xv);
        }
        const double got = y[static_cast<size_t>(t * c.out + i)];
        ASSERT_LE(std::fabs(got - exact), bound + 1e-6 * (magnitude + bound) + 1e-37)
            << "[" << c.out << ", " << c.in << "] token " << t << " row " << i;
      }
    }
  }
}

TEST(LinearMxfp4Mxint8, DequantizeGivesTheStoredValues) {
  std::mt19937 rng(seed_of_test());
  for (const Case& c : kCases) {
    const Mxfp4 w = random_weight(rng, c.out, c.in);
    std::vector<float> expected(static_cast<size_t>(c.out * c.in)), got(expected.size());
    formats::dequantize_mxfp4_packed(w.packed, w.scales, c.out, c.in, expected);
    load(w).dequantize(got.data());
    for (size_t k = 0; k < got.size(); ++k)
      ASSERT_EQ(std::bit_cast<uint32_t>(got[k]), std::bit_cast<uint32_t>(expected[k])) << k;
  }
}

TEST(LinearMxfp4Mxint8, NonFiniteActivationsGiveNaNOutputs) {
  std::mt19937 rng(seed_of_test());
  const Mxfp4 w = random_weight(rng, 8, 64);
  std::vector<float> x = random_x(rng, 2 * 64);
  x[70] = INFINITY;  // token 1, block 0
  std::vector<float> y(16);
  load(w).forward(ExecContext{1}, x.data(), 2, y.data());
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isfinite(y[static_cast<size_t>(i)])) << i;
    EXPECT_TRUE(std::isnan(y[static_cast<size_t>(8 + i)])) << i;
  }
}

}  // namespace linear_mxfp4_mxint8_test
}  // namespace dz::kernels
