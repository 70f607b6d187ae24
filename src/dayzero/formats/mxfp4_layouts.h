#pragma once
// Dequantization of the two MXFP4 checkpoint layouts (docs/formats.md §3.4, §3.5) to FP32. Both
// store one row [out, in] as in/32 blocks of 16 bytes (element 2j in the low nibble of byte j, 2j+1
// in the high nibble) plus one E8M0 scale per block; they differ only in how the tensors are
// shaped. Scalar reference: the loader validates scales (code_checks.h) before calling these.

#include <cstdint>
#include <span>

namespace dz::formats {

// compressed-tensors "mxfp4-pack-quantized": weight_packed [num_rows, num_cols / 2] U8,
// weight_scale [num_rows, num_cols / 32] U8 (or F8_E8M0) → out [num_rows, num_cols].
void dequantize_mxfp4_packed(std::span<const uint8_t> weight_packed,
                             std::span<const uint8_t> weight_scale, int64_t num_rows,
                             int64_t num_cols, std::span<float> out);

// gpt-oss "*_blocks" [num_experts, num_rows, num_cols / 32, 16] U8 and "*_scales"
// [num_experts, num_rows, num_cols / 32] U8 → out [num_experts, num_rows, num_cols].
void dequantize_mxfp4_gpt_oss(std::span<const uint8_t> blocks, std::span<const uint8_t> scales,
                              int64_t num_experts, int64_t num_rows, int64_t num_cols,
                              std::span<float> out);

}  // namespace dz::formats
