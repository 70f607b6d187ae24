#pragma once
// DeepSeek activation quantization, bit-for-bit as docs/formats.md §4.1 / docs/models.md §1.5
// (deepseek-ai/DeepSeek-V3.2-Exp: inference/kernel.py, act_quant): per group of 128 contiguous BF16
// values, one FP32 scale and 128 E4M3 codes. Scalar reference.

#include <cstdint>
#include <span>

namespace dz::formats {

inline constexpr int64_t kActQuantGroupElems = 128;

enum class ActScaleFormat : uint8_t {
  // scale_fmt "ue8m0" (V3.1+, V3.2): s = 2^ceil(log2(r)), r = fl32(amax · fl32(1/448)).
  kUe8m0,
  // No scale_fmt (V3): s = r, not a power of two; elements are fl32(x / s).
  kPlain,
};

// x_bf16: [num_groups * 128] BF16 codes; codes: [num_groups * 128] E4M3; scales: [num_groups].
// amax = max(max |x_i|, 1e-4) in FP32. A group holding NaN or ±Inf gets scale NaN and codes 0x7F,
// so the error shows up in everything computed from it.
void act_quant(std::span<const uint16_t> x_bf16, ActScaleFormat format, std::span<uint8_t> codes,
               std::span<float> scales);

}  // namespace dz::formats
