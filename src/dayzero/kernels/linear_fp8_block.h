#pragma once
// An FP8 block-scaled linear weight (linear.h), as DeepSeek checkpoints store it (128×128 blocks):
// E4M3 codes [out, in] and FP32 scales per [block_rows, block_cols] block, kept as loaded. Internal
// to kernels/; model code holds a LinearWeight.
//
// forward() by CPU and token count (docs/cpu_dispatch.md; kernel_paths.cpp names the paths):
// - Few tokens (< kFp8GemmMinTokens): the fused GEMV, one contiguous range of output rows per
//   thread: E4M3 → BF16 byte tables + VDPBF16PS (linear_fp8_bf16_avx512.cpp) where the CPU has
//   VBMI and BF16 and block_cols % 64 == 0, else E4M3 → FP16 → FP32 FMAs (linear_fp8_avx512.cpp,
//   parallel over row chunks).
// - More tokens where the VBMI decode applies: a GEMM over tiles of 16 tokens, every block scale
//   applied in FP32, one contiguous range of 16-row groups per thread: on AMX (decoded codes as A
//   tiles, linear_fp8_amx_avx512.cpp) where the CPU has AMX-BF16, else on VDPBF16PS (tokens in the
//   vector lanes, linear_fp8_bf16_avx512.cpp; as fast as the dequantized BF16 tiles + oneDNN at
//   256–512 tokens, 12× faster at 16 on Zen 5).
// - More tokens otherwise (no VBMI/BF16, or block_cols % 64 != 0): tiles of kTileRows output rows
//   × all of K are dequantized into a per-thread workspace (BF16 when every scale is a power of
//   two, so exact; FP32 otherwise) and multiplied by a single-threaded oneDNN matmul per tile, the
//   tiles spread over the threads.
// - No AVX-512, or scales the fast paths cannot fold exactly: linear_fp8_block_ref.

#include <cstdint>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"
#include "dayzero/formats/fp8_block.h"
#include "dayzero/kernels/linear_onednn.h"

namespace dz::kernels {

// Whether FP8 block weights (with block_cols % 64 == 0) run the AMX GEMM past the GEMV: AMX-BF16
// and the VBMI byte-table decode.
bool fp8_block_amx_available();

class Fp8BlockLinear {
 public:
  // codes: F8_E4M3 [out, in]; scale_inv: F32 [ceil(out/block_rows), ceil(in/block_cols)], a
  // multiplier despite its name. Refuses NaN codes, naming the first offending index.
  static Result<Fp8BlockLinear> create(const TensorView& codes, const TensorView& scale_inv,
                                       int64_t block_rows, int64_t block_cols);

  int64_t out_features() const { return block_.num_rows; }
  int64_t in_features() const { return block_.num_cols; }
  int64_t stored_bytes() const;

  // y [num_tokens, out] = x [num_tokens, in] · Wᵀ, num_tokens >= 1 (linear.h).
  void forward(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  // W as FP32 [out, in].
  void dequantize(float* out) const;

 private:
  // The kernels this weight runs, chosen at load from the CPU's features and the scales.
  enum class Kernels {
    kReference,  // no AVX-512, or a scale outside [2^-100, 2^100]
    kAvx512,     // E4M3 → FP16 GEMV; tiles dequantized by AVX-512
    kVbmiBf16,   // E4M3 → BF16 byte tables (GEMV, GEMM): + VBMI, BF16, block_cols % 64 == 0
  };

  Fp8BlockLinear() = default;
  void forward_gemv(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  void forward_token_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens,
                           float* y) const;
  void forward_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  const uint8_t* code_data() const { return reinterpret_cast<const uint8_t*>(codes_.data()); }
  const float* scale_data() const { return reinterpret_cast<const float*>(scale_inv_.data()); }

  formats::Fp8BlockShape block_;
  AlignedBuffer codes_;       // [out, in] E4M3
  AlignedBuffer scale_inv_;   // [num_scale_rows, num_scale_cols] FP32
  bool scales_pow2_ = false;  // all powers of two in [2^-100, 2^100]: BF16 tiles are exact
  Kernels kernels_ = Kernels::kReference;
  bool amx_ = false;  // kVbmiBf16 on a CPU with AMX-BF16: the AMX GEMM past the GEMV
  detail::MatmulCache matmuls_;
};

}  // namespace dz::kernels
