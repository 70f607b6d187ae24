#include "dayzero/formats/codecs.h"

#include <bit>

#include "dayzero/core/check.h"

namespace dz::formats {
namespace {

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32InfBits = 0x7F800000u;
constexpr uint32_t kF32QuietNanBits = 0x7FC00000u;

uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
float float_of(uint32_t bits) {
  return std::bit_cast<float>(bits);
}

// Rounds a finite, non-negative FP32 (given by its bits) to nearest-even on the grid of a binary
// float with `mant_bits` mantissa bits and exponent bias `bias`, as if that format had unlimited
// exponent codes above. Returns the code of the rounded value; callers compare it with their
// largest finite code to decide saturation or overflow. A value rounding up across a binade (or
// from the largest subnormal to the smallest normal) carries into the exponent field through the
// addition at the end.
uint32_t round_to_grid(uint32_t abs_bits, int mant_bits, int bias) {
  const int f32_exp_field = static_cast<int>(abs_bits >> 23);
  // FP32 subnormals are below 2^-126, far under half the smallest subnormal of every target here.
  if (f32_exp_field == 0) return 0;
  const uint32_t significand = (abs_bits & 0x7FFFFFu) | 0x800000u;  // value = sig · 2^(e − 150)
  int exp_field = f32_exp_field - 127 + bias;
  int shift = 23 - mant_bits;
  if (exp_field < 1) {  // a subnormal of the target: fewer mantissa bits survive
    shift += 1 - exp_field;
    exp_field = 1;
  }
  if (shift > 24) return 0;  // value < half the smallest subnormal step
  uint32_t quantum_count = significand >> shift;
  const uint32_t remainder = significand & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (remainder > half || (remainder == half && (quantum_count & 1u))) ++quantum_count;
  // Normal: quantum_count in [2^m, 2^(m+1)], code = e << m + (count − 2^m). Subnormal: e = 1 and
  // count in [0, 2^m], so the same formula gives code = count.
  return (static_cast<uint32_t>(exp_field) << mant_bits) + quantum_count - (1u << mant_bits);
}

// FP32 bits of the magnitude with exponent field `e` and mantissa field `m` of a small binary float
// (e < all-ones), built from the fields: subnormals are normalized by their leading bit.
uint32_t small_float_f32_bits(uint32_t e, uint32_t m, int mant_bits, int bias) {
  if (e == 0) {
    if (m == 0) return 0;
    const int msb = std::bit_width(m) - 1;  // value = 2^(msb + 1 − bias − mant_bits) · (m / 2^msb)
    const auto f32_exp = static_cast<uint32_t>(msb + 1 - bias - mant_bits + 127);
    return f32_exp << 23 | (m - (1u << msb)) << (23 - msb);
  }
  return static_cast<uint32_t>(static_cast<int>(e) - bias + 127) << 23 | m << (23 - mant_bits);
}

float signed_nan(bool negative) {
  return float_of(kF32QuietNanBits | (negative ? 0x80000000u : 0u));
}

}  // namespace

uint16_t encode_fp16(float x) {
  const uint32_t bits = bits_of(x);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32InfBits) return sign | 0x7E00;
  if (abs_bits == kF32InfBits) return sign | 0x7C00;
  const uint32_t code = round_to_grid(abs_bits, 10, 15);
  return sign | static_cast<uint16_t>(code >= 0x7C00 ? 0x7C00 : code);
}

float decode_fp16(uint16_t code) {
  const bool negative = (code & 0x8000) != 0;
  const uint32_t e = (code >> 10) & 0x1F;
  const uint32_t m = code & 0x3FF;
  if (e == 31)
    return m ? signed_nan(negative) : float_of(kF32InfBits | (negative ? 0x80000000u : 0u));
  return float_of(small_float_f32_bits(e, m, 10, 15) | (negative ? 0x80000000u : 0u));
}

uint8_t encode_e4m3(float x, Fp8Overflow overflow) {
  const uint32_t bits = bits_of(x);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32InfBits) return sign | 0x7F;
  if (overflow == Fp8Overflow::kSaturate && abs_bits >= bits_of(448.0f)) return sign | 0x7E;
  if (abs_bits == kF32InfBits) return sign | 0x7F;
  // Non-saturating: (448, 464] rounds back to 0x7E (464 ties to even 448); above, the grid code
  // would be 0x7F (480) or more, which is NaN.
  const uint32_t code = round_to_grid(abs_bits, 3, 7);
  return sign | static_cast<uint8_t>(code > 0x7E ? 0x7F : code);
}

uint8_t encode_e5m2(float x, Fp8Overflow overflow) {
  const uint32_t bits = bits_of(x);
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits > kF32InfBits) return sign | 0x7F;
  if (overflow == Fp8Overflow::kSaturate && abs_bits >= bits_of(57344.0f)) return sign | 0x7B;
  // IEEE: |x| >= 61440 (the tie between 57344 and the next binade) rounds to the Inf code 0x7C.
  const uint32_t code = abs_bits == kF32InfBits ? 0x7Cu : round_to_grid(abs_bits, 2, 15);
  return sign | static_cast<uint8_t>(code > 0x7C ? 0x7C : code);
}

uint8_t encode_e2m1(float x) {
  const uint32_t bits = bits_of(x);
  const auto sign = static_cast<uint8_t>((bits >> 28) & 0x8u);
  const uint32_t abs_bits = bits & kF32AbsMask;
  if (abs_bits >= bits_of(6.0f)) return sign | 0x7;  // includes ±Inf and NaN
  return sign | static_cast<uint8_t>(round_to_grid(abs_bits, 1, 1));
}

uint8_t encode_e8m0(int exponent) {
  DZ_CHECK(exponent <= 127, "E8M0 exponent {} exceeds 127 (the block would be NaN)", exponent);
  return exponent < -127 ? uint8_t{0} : static_cast<uint8_t>(exponent + 127);
}

float decode_e4m3_int(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  if ((code & 0x7F) == 0x7F) return signed_nan(negative);
  return float_of(small_float_f32_bits((code >> 3) & 0xFu, code & 0x7u, 3, 7) |
                  (negative ? 0x80000000u : 0u));
}

float decode_e5m2_int(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  const uint32_t e = (code >> 2) & 0x1Fu;
  const uint32_t m = code & 0x3u;
  const uint32_t sign_bit = negative ? 0x80000000u : 0u;
  if (e == 31) return m ? signed_nan(negative) : float_of(kF32InfBits | sign_bit);
  return float_of(small_float_f32_bits(e, m, 2, 15) | sign_bit);
}

float decode_e8m0_int(uint8_t code) {
  if (code == 0xFF) return signed_nan(false);
  // 2^-127 has no FP32 exponent code: it is the subnormal with only the top mantissa bit set.
  return float_of(code == 0 ? 0x00400000u : uint32_t{code} << 23);
}

float decode_e2m1_int(uint8_t code) {
  return float_of(small_float_f32_bits((code >> 1) & 0x3u, code & 0x1u, 1, 1) |
                  ((code & 0x8) ? 0x80000000u : 0u));
}

}  // namespace dz::formats
