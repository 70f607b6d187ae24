#pragma once
// MX block quantization (docs/formats.md §2): 32 consecutive elements along K share one E8M0 scale
// code E, value_i = 2^(E−127) · elem_i. Elements are E2M1 (MXFP4), E4M3 or E5M2 (MXFP8). Scalar
// reference.

#include <cstdint>
#include <span>

namespace dz::formats {

inline constexpr int64_t kMxBlockElems = 32;

enum class MxElem : uint8_t { kE2M1, kE4M3, kE5M2 };

// Shared-exponent rules of docs/formats.md §2.2, named by formula because library names disagree
// ("CEIL" is a different rule in torchao and Triton). amax = max |x_i|; max_elem = 6 / 448 / 57344
// and emax = 2 / 8 / 15 for E2M1 / E4M3 / E5M2. Every rule clamps k to >= −127 (all-zero block →
// code 0).
enum class MxScaleRule : uint8_t {
  // FLOOR (OCP reference, llama.cpp): k = floor(log2 amax) − emax. Elements in (max_elem,
  // 2^(emax+1))
  // saturate.
  kFloorLog2Amax,
  // RCEIL ("ue8m0", Triton ROUND_UP): k = ceil(log2(amax / max_elem)). Never saturates.
  kCeilLog2AmaxOverMaxElem,
  // torchao CEIL: k = ceil(log2 amax) − emax. Never saturates, may waste up to one binade.
  kCeilLog2AmaxMinusEmax,
  // EVEN (compressed-tensors): k = floor(log2 p) − emax, p = amax rounded up to a power of two iff
  // its significand is >= 1.75. E2M1 elements with significand in (1.5, 1.75) saturate.
  kFloorLog2AmaxRoundedAt1p75,
};

float mx_elem_max(MxElem elem);  // 6, 448, 57344
int mx_elem_emax(MxElem elem);   // 2, 8, 15

// The shared exponent k (scale 2^k) of a block with this amax, clamped to >= −127. amax must be
// finite and >= 0 (a block with NaN or Inf has no exponent: quantize_mx() gives it scale code
// 0xFF). RCEIL is computed exactly for every FP32 amax; it equals Triton's FP32 recipe (add
// 0x007FFFFF to the bits of fl32(amax / max_elem)) whenever that quotient is an FP32 normal, which
// tests check.
int mx_shared_exponent(float amax, MxElem elem, MxScaleRule rule);

uint8_t encode_mx_elem(float x, MxElem elem);  // saturating RNE encoder of the element format
float decode_mx_elem(uint8_t code, MxElem elem);

// x, codes: [num_blocks * 32], one code per byte (E2M1 codes in 0..15); scales: [num_blocks] E8M0.
// A block containing NaN or ±Inf gets scale 0xFF (it decodes to NaN) and element codes 0x7F (E4M3,
// E5M2) or 0x7 (E2M1). Elements are x_i · 2^−k, exact, then encoded with saturation.
void quantize_mx(std::span<const float> x, MxElem elem, MxScaleRule rule, std::span<uint8_t> codes,
                 std::span<uint8_t> scales);
// The inverse: out_i = decode(code_i) · 2^(E−127) in FP32 (exact unless it overflows to Inf).
void dequantize_mx(std::span<const uint8_t> codes, std::span<const uint8_t> scales, MxElem elem,
                   std::span<float> out);

// Packs E2M1 codes two per byte: element 2j in the low nibble of byte j, 2j+1 in the high nibble
// (compressed-tensors pack_fp4_to_uint8, gpt-oss blocks). codes: [2 * n], packed: [n].
void pack_fp4(std::span<const uint8_t> codes, std::span<uint8_t> packed);

}  // namespace dz::formats
