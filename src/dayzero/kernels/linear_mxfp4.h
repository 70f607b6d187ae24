#pragma once
// An MXFP4 linear weight (linear.h) as compressed-tensors stores it: packed E2M1 nibbles
// [out, in/2] and E8M0 scales [out, in/32], kept packed (4.25 bits per weight). Internal to
// kernels/; model code holds a LinearWeight.
//
// forward() by CPU and token count (docs/cpu_dispatch.md; kernel_paths.cpp names the paths):
// - AMX: the codes are kept in the tile layout of mxfp4_amx_layout.h and every token count runs on
//   AMX tiles (linear_mxfp4_amx_avx512.cpp): up to 16 tokens the GEMV (block scales in FP32), more
//   the GEMM with the scales folded into the BF16 tiles (or GEMV passes of 16 tokens for a weight
//   with scale codes outside 2–252 on nonzero blocks).
// Otherwise the kernels of linear_mxfp4_avx512.cpp over the codes as stored:
// - Few tokens (< kMxfp4GemmMinTokens), or rows too long for one tile: the fused VDPBF16PS GEMV.
// - More tokens: tiles dequantized into a fixed per-thread workspace (BF16, or FP32 for tiles whose
//   rows hold scale codes 0 or 1 with nonzero elements: BF16 subnormals, which the BF16 GEMM may
//   flush) and multiplied by oneDNN.
// - No AVX-512 with BF16: linear_mxfp4_ref.
// With MXINT8 activations (Mxfp4Activations::kMxint8, an opt-in mode: docs/decisions.md), every
// token count runs one kernel, so a token gets the same bits in decode, verification and prefill:
// - AVX-512 VNNI (AMX machines too): the VPDPBUSD GEMV of linear_mxfp4_mxint8_avx512.cpp over the
//   codes in its own layout (linear_kernels.h), in row tiles that stay in L2 across token passes.
// - Otherwise: linear_mxfp4_mxint8_ref, which gives the same bits.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/kernels/linear_onednn.h"

namespace dz::kernels {

// Whether MXFP4 weights load into the AMX tile layout and run the AMX kernels.
bool mxfp4_amx_available();
// Whether MXFP4 weights with MXINT8 activations run the VPDPBUSD GEMV (else the reference).
bool mxfp4_mxint8_vnni_available();

class Mxfp4Linear {
 public:
  // weight_packed U8 [out, in/2] (element 2b of a row in the low nibble of byte b, 2b + 1 in the
  // high one; E2M1 with the sign in bit 3), weight_scale U8 or F8_E8M0 [out, in/32]:
  // W[i, j] = e2m1 · 2^(scale − 127). in % 32 == 0. Refuses scale code 0xFF (NaN), naming the
  // first offending index.
  static Result<Mxfp4Linear> create(const TensorView& weight_packed, const TensorView& weight_scale,
                                    Mxfp4Activations activations);
  // The per-thread tile buffer many-token forwards dequantize into (fixed, allocated once per
  // thread on first use).
  static size_t workspace_bytes_per_thread();

  int64_t out_features() const { return out_features_; }
  int64_t in_features() const { return in_features_; }
  int64_t stored_bytes() const;

  // y [num_tokens, out] = x [num_tokens, in] · Wᵀ, num_tokens >= 1 (linear.h).
  void forward(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  // W as FP32 [out, in] (exact).
  void dequantize(float* out) const;

 private:
  // The kernels this weight runs, chosen at load from the CPU's features.
  enum class Kernels {
    kReference,        // no AVX-512 with BF16
    kAvx512Bf16,       // the GEMV and the tiles of linear_mxfp4_avx512.cpp
    kAmx,              // linear_mxfp4_amx_avx512.cpp, codes and scales in the AMX tile layout
    kMxint8Reference,  // MXINT8 activations without AVX-512 VNNI: linear_mxfp4_mxint8_ref
    kMxint8Vnni,       // MXINT8 activations: linear_mxfp4_mxint8_avx512.cpp, codes repacked
  };

  Mxfp4Linear() = default;
  // Output rows per tile so that one tile fits the workspace; 0 if not even one row does.
  int64_t tile_rows() const;
  void forward_gemv(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  void forward_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  void forward_amx(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  void forward_mxint8(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  const uint8_t* packed_data() const { return reinterpret_cast<const uint8_t*>(packed_.data()); }
  const uint8_t* scale_data() const { return reinterpret_cast<const uint8_t*>(scales_.data()); }

  int64_t out_features_ = 0;
  int64_t in_features_ = 0;
  // [out, in/2] nibbles, or the AMX tile layout (kAmx), or the VNNI one (kMxint8Vnni)
  AlignedBuffer packed_;
  AlignedBuffer scales_;  // [out, in/32] E8M0 codes, no 0xFF, or the AMX tile layout (kAmx)
  // Per row: whether a block with scale code 0 or 1 has a nonzero element (its values are BF16
  // subnormals: such rows go through FP32 tiles).
  std::vector<uint8_t> row_subnormal_;
  bool any_subnormal_ = false;
  // Every block with a nonzero element has a scale code in [2, 252]: its values times the scale are
  // normal BF16 values, so the AMX GEMM may fold the scales into the tiles.
  bool scales_fold_ = true;
  Kernels kernels_ = Kernels::kReference;
  detail::MatmulCache matmuls_;
};

}  // namespace dz::kernels
