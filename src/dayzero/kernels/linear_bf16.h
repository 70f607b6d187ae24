#pragma once
// A BF16 linear weight (linear.h): W [out, in] rounded to BF16 at load and reordered once into the
// blocked layout oneDNN picks for Wᵀ (AMX/AVX-512 brgemm), which the few-token GEMM
// (gemm_small_bf16.h) reads in place. Internal to kernels/; model code holds a LinearWeight.
//
// forward() by CPU (docs/cpu_dispatch.md; kernel_paths.cpp names the paths):
// - AMX-BF16 and num_tokens <= kGemmSmallBf16AmxMaxTokens (64), or AVX512-BF16 without AMX and
//   num_tokens <= kGemmSmallBf16Dpbf16MaxTokens (512): gemm_small_bf16 on the reordered weight.
// - AVX-512 otherwise: one oneDNN matmul, bf16 x × bf16 Wᵀ → f32 y. One
//   primitive per num_tokens, cached per weight; the blocked layout does not depend on num_tokens.
// - No AVX-512, or no oneDNN BF16 matmul for the shape: linear_bf16_ref on the plain codes.

#include <cstdint>
#include <optional>

#include <dnnl.hpp>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"
#include "dayzero/kernels/gemm_small_bf16.h"
#include "dayzero/kernels/linear_onednn.h"

namespace dz::kernels {

class Bf16Linear {
 public:
  // weight: BF16, F16 or F32 [out, in]; F16 and F32 are rounded to BF16 (RNE).
  static Result<Bf16Linear> create(const TensorView& weight);

  int64_t out_features() const { return out_features_; }
  int64_t in_features() const { return in_features_; }
  int64_t stored_bytes() const;

  // y [num_tokens, out] = x [num_tokens, in] · Wᵀ, num_tokens >= 1 (linear.h).
  void forward(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  // W as FP32 [out, in].
  void dequantize(float* out) const;

 private:
  Bf16Linear() = default;
  // Moves plain_codes_ into oneDNN's layout; keeps them (for the reference) when oneDNN has no
  // BF16 matmul here or the CPU has no AVX-512.
  void reorder_for_onednn();
  void forward_onednn(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;

  int64_t out_features_ = 0;
  int64_t in_features_ = 0;
  // Wᵀ [in, out] as oneDNN's matmul B in the layout it chose; empty on the reference path.
  dnnl::memory::desc weights_desc_;
  dnnl::memory weights_mem_;               // over weights_buffer_
  AlignedBuffer weights_buffer_;           // from the weight pool
  std::optional<Bf16PanelWeight> panels_;  // weights_mem_ as gemm_small_bf16 reads it
  AlignedBuffer plain_codes_;              // W [out, in] BF16 codes: the reference path only
  detail::MatmulCache matmuls_;
};

}  // namespace dz::kernels
