#pragma once
// A linear layer y = x · Wᵀ with W stored [out, in], in one of three weight formats, each its own
// type with its own kernels and dispatch: BF16 (linear_bf16.h; plain float weights, rounded),
// FP8 128×128 block-scaled (linear_fp8_block.h) and MXFP4 (linear_mxfp4.h). The format is chosen
// once, by the factory that loads the weight. Activations are BF16-valued; accumulation is FP32
// everywhere.

#include <cstdint>
#include <memory>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"

namespace dz::kernels {

// The activations an MXFP4 weight multiplies: BF16 (the default, as for every format), or MXINT8
// (formats/mxint8.h: 8 bits per element and a power-of-two scale per 32, as llama.cpp's Q8 blocks;
// an opt-in mode for CPUs with AVX-512 VNNI, docs/decisions.md).
enum class Mxfp4Activations { kBf16, kMxint8 };

class LinearWeight {
 public:
  // weight: BF16, F16 or F32 [out, in].
  static Result<LinearWeight> from_float(const TensorView& weight);
  // codes: F8_E4M3 [out, in]; scale_inv: F32 [ceil(out/block_rows), ceil(in/block_cols)], a
  // multiplier despite its name. Refuses NaN codes, naming the first offending index.
  static Result<LinearWeight> from_fp8_block(const TensorView& codes, const TensorView& scale_inv,
                                             int64_t block_rows, int64_t block_cols);
  // compressed-tensors MXFP4: weight_packed U8 [out, in/2] (element 2b of a row in the low nibble
  // of byte b, 2b + 1 in the high one; E2M1 with the sign in bit 3), weight_scale U8 or F8_E8M0
  // [out, in/32]: W[i, j] = e2m1 · 2^(scale − 127). in % 32 == 0. Refuses scale code 0xFF (NaN),
  // naming the first offending index.
  static Result<LinearWeight> from_mxfp4(const TensorView& weight_packed,
                                         const TensorView& weight_scale,
                                         Mxfp4Activations activations = Mxfp4Activations::kBf16);
  // From FP32 values [out, in] (tests, absorbed-weight products): stored as BF16 (rounded, RNE).
  static LinearWeight from_f32_as_bf16(const float* weight, int64_t out_features,
                                       int64_t in_features);

  // Empty (no format): 0 × 0, and forward() refuses it.
  LinearWeight();
  ~LinearWeight();
  LinearWeight(LinearWeight&&) noexcept;
  LinearWeight& operator=(LinearWeight&&) noexcept;

  int64_t out_features() const;
  int64_t in_features() const;
  bool is_fp8_block() const;
  bool is_mxfp4() const;
  // Bytes of memory the weight holds (codes, scales, repacked copies), whatever its format.
  int64_t stored_bytes() const;
  // The per-thread tile buffer many-token MXFP4 forwards dequantize into (fixed, allocated once
  // per thread on first use).
  static size_t mxfp4_workspace_bytes_per_thread();

  // y [num_tokens, out] = x [num_tokens, in] · Wᵀ. x holds BF16-valued floats; y is FP32 (not
  // rounded: the caller rounds where the model stores BF16).
  void forward(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  // The weight as FP32 [out, in], exactly as forward() uses it (for absorption and tests).
  void dequantize(float* out) const;

 private:
  // The format's weight (a std::variant of the three types), behind a pointer so that this header
  // needs neither oneDNN nor the formats' headers.
  struct Format;
  explicit LinearWeight(std::unique_ptr<const Format> format);

  std::unique_ptr<const Format> format_;  // null when empty
};

}  // namespace dz::kernels
