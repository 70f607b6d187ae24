#include "dayzero/formats/act_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"

namespace dz::formats {
namespace {

// The reference multiplies by the FP32 reciprocal; fl32(1/448) is not exact, so a divide would
// differ.
constexpr float kInvE4m3Max = 1.0f / 448.0f;
constexpr float kAmaxFloor = 1e-4f;

// 2^ceil(log2 r) for a normal positive FP32 r: its exponent, plus one if any mantissa bit is set.
float round_scale_up_to_pow2(float r) {
  const uint32_t bits = std::bit_cast<uint32_t>(r);
  const uint32_t exp_field = (bits >> 23) + ((bits & 0x7FFFFFu) != 0 ? 1u : 0u);
  return std::bit_cast<float>(exp_field << 23);
}

}  // namespace

void act_quant(std::span<const uint16_t> x_bf16, ActScaleFormat format, std::span<uint8_t> codes,
               std::span<float> scales) {
  DZ_CHECK(x_bf16.size() % kActQuantGroupElems == 0, "{} values is not a multiple of 128",
           x_bf16.size());
  DZ_CHECK(codes.size() == x_bf16.size() && scales.size() == x_bf16.size() / kActQuantGroupElems,
           "codes {} / scales {} for {} values", codes.size(), scales.size(), x_bf16.size());
  for (size_t group = 0; group < scales.size(); ++group) {
    const uint16_t* x = x_bf16.data() + group * kActQuantGroupElems;
    // |x| as BF16 bits orders like |x| for non-NaN codes; ≥ 0x7F80 is ±Inf or a NaN.
    uint16_t amax_bits = 0;
    for (size_t i = 0; i < kActQuantGroupElems; ++i)
      amax_bits = std::max<uint16_t>(amax_bits, x[i] & 0x7FFFu);
    uint8_t* out = codes.data() + group * kActQuantGroupElems;
    if (amax_bits >= 0x7F80u) {
      scales[group] = std::numeric_limits<float>::quiet_NaN();
      std::fill_n(out, kActQuantGroupElems, uint8_t{0x7F});
      continue;
    }
    // amax >= 1e-4, so r >= 2.2e-7 is normal and s is a normal power of two >= 2^-22.
    const float r = std::max(decode_bf16(amax_bits), kAmaxFloor) * kInvE4m3Max;
    const float s = format == ActScaleFormat::kUe8m0 ? round_scale_up_to_pow2(r) : r;
    scales[group] = s;
    // |x / s| ≤ 448 up to rounding; the encoder saturates what rounds above.
#pragma omp simd
    for (size_t i = 0; i < kActQuantGroupElems; ++i)
      out[i] = encode_e4m3_saturating(decode_bf16(x[i]) / s);
  }
}

}  // namespace dz::formats
