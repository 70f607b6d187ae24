#pragma once
// Scalar references for the linear formats (linear_bf16.h, linear_fp8_block.h, linear_mxfp4.h):
// the test oracle and the portable fallback, also for weights the fast kernels do not take. Each
// output is one FP32 dot product in column order over BF16-rounded activations and the exact FP32
// weight values, so forward() variants are checked against them with a tolerance, never for bit
// equality (but for the MXINT8 one).

#include <cstdint>

#include "dayzero/formats/fp8_block.h"

namespace dz::kernels {

// y [num_tokens, out] = bf16(x) [num_tokens, in] · Wᵀ, W given as BF16 codes [out, in].
void linear_bf16_ref(const uint16_t* weight_bf16, int64_t out_features, int64_t in_features,
                     const float* x, int64_t num_tokens, float* y);

// The same with W[i, j] = decode_e4m3(codes[i, j]) · scale_inv[i / block_rows, j / block_cols].
void linear_fp8_block_ref(const uint8_t* codes, const float* scale_inv,
                          const formats::Fp8BlockShape& shape, const float* x, int64_t num_tokens,
                          float* y);

// The same with W[i, j] = decode_e2m1(nibble j of row i) · 2^(scales[i, j / 32] − 127): packed
// [out, in/2] (element 2b in the low nibble of byte b), scales [out, in/32] E8M0, in % 32 == 0.
void linear_mxfp4_ref(const uint8_t* packed, const uint8_t* scales, int64_t out_features,
                      int64_t in_features, const float* x, int64_t num_tokens, float* y);

// The same weights with MXINT8 activations (formats/mxint8.h): x quantized per block of 32, the
// integer block products scaled and summed in the order linear_kernels.h states for the VNNI
// kernel, which gives the same bits (unlike the other references here, this one is exact).
void linear_mxfp4_mxint8_ref(const uint8_t* packed, const uint8_t* scales, int64_t out_features,
                             int64_t in_features, const float* x, int64_t num_tokens, float* y);

}  // namespace dz::kernels
