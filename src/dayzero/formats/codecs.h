#pragma once
// Scalar encoders (FP32 → code) and integer-form decoders (code → FP32 bits) for the formats of
// docs/formats.md §1. Encoders are defined for every FP32 input, including NaN, ±Inf and
// subnormals. Table decoders (the default, decode_e4m3() etc.) live in decode_tables.h; the *_int
// decoders here build FP32 bits from the fields with integer operations only and must agree with
// the tables.

#include <algorithm>
#include <bit>
#include <cstdint>

#include "dayzero/formats/decode_tables.h"

namespace dz::formats {

// What an FP8 encoder does with magnitudes beyond the largest finite code.
enum class Fp8Overflow : uint8_t {
  // |x| >= max (448 / 57344), including ±Inf, gives ±max. The engine default: every quantizer
  // clamps.
  kSaturate,
  // E4M3: (464, ∞] and ±Inf give NaN 0x7F|s (PyTorch's plain cast); E5M2: |x| >= 61440 gives ±Inf
  // (IEEE).
  kNonSaturating,
};

// BF16, RNE; NaN → 0x7FC0; overflow → ±Inf; FP32 subnormals round to BF16 subnormals (not flushed).
// Inline: it runs per element in many loops, which vectorise with it.
inline uint16_t encode_bf16(float x) {
  const auto bits = std::bit_cast<uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}
inline float decode_bf16(uint16_t code) {
  return std::bit_cast<float>(uint32_t{code} << 16);
}
// FP32 → BF16 → FP32: the nearest BF16 value (RNE).
inline float round_to_bf16(float x) {
  return decode_bf16(encode_bf16(x));
}

// FP16, IEEE RNE, overflow → ±Inf (65520 → Inf). NaN → 0x7E00 with the input's sign (payload
// dropped).
uint16_t encode_fp16(float x);
// Exact; NaN codes give the quiet NaN with the code's sign.
float decode_fp16(uint16_t code);

// E4M3 "fn", RNE. NaN → 0x7F|s. Results that round to zero keep the sign (−2^-11 → 0x80).
uint8_t encode_e4m3(float x, Fp8Overflow overflow = Fp8Overflow::kSaturate);
// encode_e4m3(x, kSaturate) inline and without branches, so that a loop of it vectorises.
inline uint8_t encode_e4m3_saturating(float x) {
  const auto bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t abs = std::min(bits & 0x7FFFFFFFu, 0x43E00000u);  // ±Inf and beyond ±448: 448
  // Normal codes (|x| >= 2^-6): RNE to 3 mantissa bits in place, a carry moving into the exponent;
  // minus the bias difference 127 − 7 in the exponent field.
  const uint32_t normal = ((abs + 0x7FFFFu + ((abs >> 20) & 1u)) >> 20) - (120u << 3);
  // Subnormal codes: |x| · 2^9 rounded to an integer, RNE by adding and subtracting 2^23.
  const float scaled = std::bit_cast<float>(abs) * 512.0f;
  const auto subnormal = static_cast<uint32_t>((scaled + 8388608.0f) - 8388608.0f);
  const uint32_t code = abs < 0x3C800000u ? subnormal : normal;  // 2^-6
  return static_cast<uint8_t>(sign | (nan ? 0x7Fu : code));
}
// E5M2, RNE directly from FP32 (not via FP16: that would round twice). NaN → 0x7F|s.
uint8_t encode_e5m2(float x, Fp8Overflow overflow = Fp8Overflow::kSaturate);
// E2M1, RNE, saturating at ±6 (±Inf → ±6). E2M1 has no NaN: NaN gives ±6 too; an MX block holding
// a NaN marks it in its E8M0 scale (0xFF) instead.
uint8_t encode_e2m1(float x);
// E8M0 from an integer exponent k (scale 2^k), never from a rounded float: k + 127, with k < −127
// clamped to code 0. k > 127 would need the NaN code and is a programming error (DZ_CHECK).
uint8_t encode_e8m0(int exponent);

// Integer-form decoders (docs/formats.md §1.2, cf. pytorch c10/util/Float8_e4m3fn.h): no float
// arithmetic.
float decode_e4m3_int(uint8_t code);
float decode_e5m2_int(uint8_t code);
float decode_e8m0_int(uint8_t code);
float decode_e2m1_int(uint8_t code);

}  // namespace dz::formats
