#include "dayzero/formats/mx_block.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"

namespace dz::formats {
namespace {

constexpr int kMinSharedExponent = -127;

int f32_exp_field(float x) {
  return static_cast<int>(std::bit_cast<uint32_t>(x) >> 23) & 0xFF;
}

// ceil(log2 v) for a positive finite double (frexp: v = f · 2^e with f in [0.5, 1)).
int ceil_log2(double v) {
  int e = 0;
  const double f = std::frexp(v, &e);
  return f == 0.5 ? e - 1 : e;
}

// 2^k as FP32 for k in [−149, 127], built from bits (2^-127 and below are subnormal).
float pow2_f32(int k) {
  if (k >= -126) return std::bit_cast<float>(static_cast<uint32_t>(k + 127) << 23);
  return std::bit_cast<float>(1u << (k + 149));
}

}  // namespace

float mx_elem_max(MxElem elem) {
  switch (elem) {
    case MxElem::kE2M1:
      return 6.0f;
    case MxElem::kE4M3:
      return 448.0f;
    case MxElem::kE5M2:
      return 57344.0f;
  }
  DZ_CHECK(false, "unknown MxElem {}", static_cast<int>(elem));
  return 0.0f;
}

int mx_elem_emax(MxElem elem) {
  switch (elem) {
    case MxElem::kE2M1:
      return 2;
    case MxElem::kE4M3:
      return 8;
    case MxElem::kE5M2:
      return 15;
  }
  DZ_CHECK(false, "unknown MxElem {}", static_cast<int>(elem));
  return 0;
}

int mx_shared_exponent(float amax, MxElem elem, MxScaleRule rule) {
  DZ_CHECK(std::isfinite(amax) && amax >= 0.0f, "amax {} must be finite and >= 0", amax);
  if (amax == 0.0f) return kMinSharedExponent;
  const int emax = mx_elem_emax(elem);
  int k = 0;
  switch (rule) {
    case MxScaleRule::kFloorLog2Amax:
      // FP32 subnormal amax gives exponent field 0, i.e. k <= −127 − emax: clamped below anyway.
      k = f32_exp_field(amax) - 127 - emax;
      break;
    case MxScaleRule::kCeilLog2AmaxOverMaxElem:
      // The quotient in FP64 never lands on the wrong side of a power of two: amax has 24
      // significant bits and max_elem is 1.5 or 1.75 times a power of two, so amax / max_elem is
      // either an exact power of two or at least 2^-24 (relative) away from one, far beyond FP64
      // rounding.
      k = ceil_log2(static_cast<double>(amax) / static_cast<double>(mx_elem_max(elem)));
      break;
    case MxScaleRule::kCeilLog2AmaxMinusEmax:
      k = ceil_log2(static_cast<double>(amax)) - emax;
      break;
    case MxScaleRule::kFloorLog2AmaxRoundedAt1p75:
      // Adding 1 << 21 to the bits carries into the exponent iff the mantissa field is >= 0.75 ·
      // 2^23.
      k = static_cast<int>((std::bit_cast<uint32_t>(amax) + (1u << 21)) >> 23) - 127 - emax;
      break;
  }
  return std::max(k, kMinSharedExponent);
}

uint8_t encode_mx_elem(float x, MxElem elem) {
  switch (elem) {
    case MxElem::kE2M1:
      return encode_e2m1(x);
    case MxElem::kE4M3:
      return encode_e4m3(x, Fp8Overflow::kSaturate);
    case MxElem::kE5M2:
      return encode_e5m2(x, Fp8Overflow::kSaturate);
  }
  DZ_CHECK(false, "unknown MxElem {}", static_cast<int>(elem));
  return 0;
}

float decode_mx_elem(uint8_t code, MxElem elem) {
  switch (elem) {
    case MxElem::kE2M1:
      return decode_e2m1(code);
    case MxElem::kE4M3:
      return decode_e4m3(code);
    case MxElem::kE5M2:
      return decode_e5m2(code);
  }
  DZ_CHECK(false, "unknown MxElem {}", static_cast<int>(elem));
  return 0.0f;
}

void quantize_mx(std::span<const float> x, MxElem elem, MxScaleRule rule, std::span<uint8_t> codes,
                 std::span<uint8_t> scales) {
  DZ_CHECK(x.size() % kMxBlockElems == 0, "{} elements is not a multiple of 32", x.size());
  DZ_CHECK(codes.size() == x.size() && scales.size() == x.size() / kMxBlockElems,
           "codes {} / scales {} for {} elements", codes.size(), scales.size(), x.size());
  const uint8_t nan_elem = elem == MxElem::kE2M1 ? uint8_t{0x7} : uint8_t{0x7F};
  for (size_t block = 0; block < scales.size(); ++block) {
    const std::span<const float> values = x.subspan(block * kMxBlockElems, kMxBlockElems);
    const std::span<uint8_t> out = codes.subspan(block * kMxBlockElems, kMxBlockElems);
    float amax = 0.0f;
    bool finite = true;
    for (float v : values) {
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    if (!finite) {
      scales[block] = 0xFF;
      std::fill(out.begin(), out.end(), nan_elem);
      continue;
    }
    const int k = mx_shared_exponent(amax, elem, rule);
    scales[block] = encode_e8m0(k);
    // 2^−k is in [2^-127, 2^127]: the product is exact wherever it can reach a nonzero element
    // code.
    const float inv_scale = pow2_f32(-k);
    for (size_t i = 0; i < values.size(); ++i) out[i] = encode_mx_elem(values[i] * inv_scale, elem);
  }
}

void dequantize_mx(std::span<const uint8_t> codes, std::span<const uint8_t> scales, MxElem elem,
                   std::span<float> out) {
  DZ_CHECK(codes.size() == out.size() && codes.size() == scales.size() * kMxBlockElems,
           "codes {} / scales {} / out {}", codes.size(), scales.size(), out.size());
  for (size_t i = 0; i < codes.size(); ++i)
    out[i] = decode_mx_elem(codes[i], elem) * decode_e8m0(scales[i / kMxBlockElems]);
}

void pack_fp4(std::span<const uint8_t> codes, std::span<uint8_t> packed) {
  DZ_CHECK(codes.size() == 2 * packed.size(), "{} codes into {} bytes", codes.size(),
           packed.size());
  for (size_t j = 0; j < packed.size(); ++j)
    packed[j] = static_cast<uint8_t>((codes[2 * j] & 0xF) | (codes[2 * j + 1] & 0xF) << 4);
}

}  // namespace dz::formats
