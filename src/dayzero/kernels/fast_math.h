#pragma once
// Inline FP32 e^x, σ, SiLU, tanh and BF16 rounding for elementwise loops, instead of libm calls and
// the out-of-line encoders: ≤ 2e-7 relative (FastMath tests), far below the BF16 rounding that
// follows them in every block. Written without FP compares or selects (GCC's default
// -ftrapping-math would not if-convert them), so a loop of them under `omp simd` vectorises.

#include <bit>
#include <cmath>
#include <cstdint>

namespace dz::kernels {
namespace fast_math_detail {

constexpr float kLog2e = 1.44269504f;
constexpr float kLn2Hi = 0.693359375f;  // ln 2 = kLn2Hi + kLn2Lo; n·kLn2Hi is exact for |n| < 2^15
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kRoundMagic = 12582912.0f;  // 1.5·2^23: adding and subtracting it rounds to integer

// e^r − 1 for |r| ≤ ln 2 / 2: Taylor to degree 9 (truncation 3e-10 relative).
[[gnu::always_inline]] inline float expm1_reduced(float r) {
  float p = 1.0f / 362880;
  p = p * r + 1.0f / 40320;
  p = p * r + 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  return r + r * r * p;
}

// Non-negative floats order like their bits: an integer min needs no FP compare.
[[gnu::always_inline]] inline float min_nonnegative(float a, float b) {
  return std::bit_cast<float>(std::min(std::bit_cast<int32_t>(a), std::bit_cast<int32_t>(b)));
}

}  // namespace fast_math_detail

// e^x = 2^n · (1 + (e^r − 1)) with x = n·ln 2 + r, |r| ≤ ln 2 / 2; x in [−87, 87].
struct ExpSplit {
  float two_n, r_expm1;
};
[[gnu::always_inline]] inline ExpSplit exp_split(float x) {
  using namespace fast_math_detail;
  const float n = (x * kLog2e + kRoundMagic) - kRoundMagic;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  return {std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23), expm1_reduced(r)};
}

// e^x for x ≤ 0 (a softmax's shifted scores), flushed to 0 below −87.
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  const ExpSplit e = exp_split(x < -87.0f ? -87.0f : x);
  return x < -87.0f ? 0.0f : e.two_n * (1.0f + e.r_expm1);
}

// tanh(y) = m / (m + 2) with m = e^{2|y|} − 1 = 2^n·(e^r − 1) + (2^n − 1): no cancellation for
// small |y| (n = 0), and 2^n − 1 is exact. 2|y| is clamped at 20, where the quotient rounds to 1.
[[gnu::always_inline]] inline float tanh_fast(float y) {
  const ExpSplit e = exp_split(fast_math_detail::min_nonnegative(2.0f * std::fabs(y), 20.0f));
  const float m = e.two_n * e.r_expm1 + (e.two_n - 1.0f);
  return std::copysign(m / (m + 2.0f), y);
}

// σ(g) = 1/(1 + e^−g) with |g| clamped at 87: exactly 1 above, ~1.6e-38 below −87 (the true value
// is smaller still).
[[gnu::always_inline]] inline float sigmoid_fast(float g) {
  const ExpSplit e =
      exp_split(std::copysign(fast_math_detail::min_nonnegative(std::fabs(g), 87.0f), -g));
  return 1.0f / (1.0f + e.two_n * (1.0f + e.r_expm1));
}

// SiLU(g) = g·σ(g).
[[gnu::always_inline]] inline float silu_fast(float g) {
  return g * sigmoid_fast(g);
}

// formats::round_to_bf16 (RNE, overflow to ±Inf, subnormals kept) with a NaN kept as is: that one's
// NaN branch stops GCC vectorising the SiTU loops (moe.cpp), this select does not.
[[gnu::always_inline]] inline float round_bf16_inline(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  return x != x ? x : std::bit_cast<float>(rounded);
}

}  // namespace dz::kernels
