#pragma once
// MXINT8 activations (docs/formats.md §2.5): 32 consecutive elements along K share one power-of-two
// scale 2^e, value_i = q_i · 2^e with q_i an int8 in [−127, 127]. This is OCP MX v1.0's MXINT8 (its
// elements carry an implicit 2^−6, so its shared exponent is e + 6), with the RCEIL rule: e is the
// smallest exponent for which amax ≤ 127 · 2^e, so no element saturates. Used for the activations
// of MXFP4 weights when the engine runs them with 8-bit activations (kernels/linear_mxfp4.h).
// Scalar reference; the kernels' packers (kernels/linear_kernels.h) must give the same codes.

#include <bit>
#include <cstdint>
#include <span>

namespace dz::formats {

inline constexpr int kMxint8BlockElems = 32;
inline constexpr int kMxint8MaxCode = 127;
// The clamp of the shared exponent (OCP's E8M0 floor, 2^−127, less the elements' implicit 2^−6).
inline constexpr int kMxint8MinExponent = -133;

// The block's exponent e for a finite amax > 0: smallest e with amax ≤ 127 · 2^e, at least
// kMxint8MinExponent. For a normal amax = 1.m · 2^E that is E + 1 when 1.m > 127/64, E otherwise
// (the mantissa bits above 0x7E0000), which is all the kernels need on their fast path.
int mxint8_exponent(float amax);

// The fast path of mxint8_exponent: normal amax only (exponent field 1–254).
inline int mxint8_exponent_normal(float amax) {
  const uint32_t bits = std::bit_cast<uint32_t>(amax);
  const int exp_field = static_cast<int>(bits >> 23) & 0xFF;
  return exp_field - 127 + ((bits & 0x7FFFFF) > 0x7E0000 ? 1 : 0) - 6;
}

// 2^e as FP32 for e in [kMxint8MinExponent, 127] (subnormal below −126).
float mxint8_pow2(int e);

// One block: scale = 2^e and q_i = round-half-even(x_i / scale) (exact division by a power of two,
// |q_i| ≤ 127). An all-zero block gets scale 0 and codes 0; a block with NaN or ±Inf gets scale NaN
// and codes 0, so every product with it is NaN. Returns the scale.
float quantize_mxint8_block(std::span<const float, kMxint8BlockElems> x,
                            std::span<int8_t, kMxint8BlockElems> q);

}  // namespace dz::formats
