#pragma once
// DeepSeek FP8 block-scaled weights (docs/formats.md §3.3): W[i, j] = decode_e4m3(W8[i, j]) ·
// scale_inv[i / block_rows, j / block_cols]. Despite its name scale_inv is a multiplier. Edge tiles
// are partial (e.g. [576, 7168] weights with [5, 56] scales). Scalar reference.

#include <cstdint>
#include <span>

namespace dz::formats {

struct Fp8BlockShape {
  int64_t num_rows = 0;  // out
  int64_t num_cols = 0;  // in
  int64_t block_rows = 128;
  int64_t block_cols = 128;

  int64_t num_scale_rows() const { return (num_rows + block_rows - 1) / block_rows; }
  int64_t num_scale_cols() const { return (num_cols + block_cols - 1) / block_cols; }
};

// codes: [num_rows, num_cols] E4M3; scale_inv: [num_scale_rows, num_scale_cols] FP32;
// out: [num_rows, num_cols] FP32. Each output is one FP32 product (exact when it stays normal).
void dequantize_fp8_block(std::span<const uint8_t> codes, std::span<const float> scale_inv,
                          const Fp8BlockShape& shape, std::span<float> out);

}  // namespace dz::formats
