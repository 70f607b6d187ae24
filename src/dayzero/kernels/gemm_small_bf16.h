#pragma once
// y [M, N] = x [M, K] · Wᵀ for BF16 weights, reading Wᵀ straight from the blocked layout oneDNN
// reorders BF16 linear weights into at load (linear_bf16.cpp), so no second copy exists. Two
// bodies:
// - AMX-BF16 (gemm_small_bf16_avx512.cpp), few tokens (M ≤ kGemmSmallBf16AmxMaxTokens: decode
//   steps of a batch, verification rows, experts' token groups): 16 rows per A tile, every panel
//   read once for all rows. oneDNN's matmul at M ≤ 64 runs 15–25 % slower than it on weights
//   streamed from DRAM (M = 1–16) and below it at M = 32–64 (docs/performance.md, issue 8); more
//   tokens go to oneDNN.
// - AVX512-BF16 without AMX (gemm_small_bf16_dpbf16_avx512.cpp), M ≤
//   kGemmSmallBf16Dpbf16MaxTokens: VDPBF16PS on one K pair of 64 columns per step, 3 tokens per
//   pass over 128 pairs of a panel. It sums every token's output in one order whatever M is, so
//   prefill chunks, decode and verification rows give a token bit for bit the same output. oneDNN's
//   matmul took about twice as long at every M on L2-resident weights, and as long or longer up to
//   512 tokens on weights from DRAM; at 2048 tokens from DRAM it is faster, so rows past the
//   default step budget go to oneDNN. Figures: docs/performance.md,
//   "Issue 17, sixth session: BF16 linears on VDPBF16PS without AMX".
//
// The layout ("BA16a64b2a" in oneDNN's tag notation, Wᵀ as [K, N]): 64-column panels, each
// ceil(K / 32) blocks of [16 K pairs][64 columns][2] BF16, i.e. four AMX B tiles side by side;
// K and N zero-padded to multiples of 32 and 64. oneDNN picks it for avx512_core_bf16 and
// avx512_core_amx alike. Accumulation is FP32 (the same products as the reference, summed in a
// different order).

#include <cstdint>
#include <optional>

#include <dnnl.hpp>

#include "dayzero/core/parallel.h"

namespace dz::kernels {

inline constexpr int64_t kGemmSmallBf16AmxMaxTokens = 64;
// The engine's default step budget (max_num_batched_tokens): every row of a default step.
inline constexpr int64_t kGemmSmallBf16Dpbf16MaxTokens = 512;
namespace detail {
// Tokens of one work item of the AVX512-BF16 body (a panel × this many tokens): a decode batch is
// one item per panel; a prefill chunk spreads over the threads by tokens as well as panels.
inline constexpr int64_t kDpbf16ItemTokens = 48;
// Tokens per pass over a panel: 2 accumulator sets × 3 tokens × 4 vectors + 4 weight vectors + a
// broadcast fit the 32 zmm registers.
inline constexpr int64_t kDpbf16GroupTokens = 3;
}  // namespace detail

struct Bf16PanelWeight {
  const uint16_t* data = nullptr;  // panels [padded_out / 64][padded_in / 32][16][64][2]
  int64_t in_features = 0;         // K
  int64_t out_features = 0;        // N
  int64_t padded_in = 0;           // K rounded up to 32
  int64_t padded_out = 0;          // N rounded up to 64
};

// True when the CPU has AMX-BF16 and AVX512_BF16 (and DZ_CPU_ISA allows AMX), and Linux grants
// this process the AMX tile state (asked for once).
bool gemm_small_bf16_amx_available();
// True when the CPU has AVX512_BF16 (and DZ_CPU_ISA allows AVX-512).
bool gemm_small_bf16_dpbf16_available();
// True when one of the two bodies runs here.
bool gemm_small_bf16_available();
// True when gemm_small_bf16() takes `num_tokens` rows here: up to kGemmSmallBf16AmxMaxTokens with
// AMX, up to kGemmSmallBf16Dpbf16MaxTokens on AVX512-BF16 without AMX.
bool gemm_small_bf16_takes(int64_t num_tokens);

// The weight as these kernels read it, if `desc` (Wᵀ [K, N] BF16, as chosen by oneDNN) is exactly
// the layout above and one of the bodies runs here; nullopt otherwise (the caller keeps using
// oneDNN).
std::optional<Bf16PanelWeight> bf16_panel_weight(const dnnl::memory::desc& desc, const void* data,
                                                 int64_t in_features, int64_t out_features);

// y [num_tokens, out_features] (row stride out_features) = x · Wᵀ. x [num_tokens, in_features]
// holds floats that are rounded to BF16 (RNE) first, as LinearWeight::forward does for oneDNN.
// gemm_small_bf16_takes(num_tokens). Parallel over 64-column panels (one contiguous range of
// panels per thread: one sequential stream of W each), and over blocks of tokens for many tokens
// (AVX512-BF16).
void gemm_small_bf16(const ExecContext& ctx, const Bf16PanelWeight& weight, const float* x,
                     int64_t num_tokens, float* y);
// Each body by name (tests run both where the CPU has AMX): the same contract, with 1 ≤
// num_tokens ≤ its body's bound.
void gemm_small_bf16_amx(const ExecContext& ctx, const Bf16PanelWeight& weight, const float* x,
                         int64_t num_tokens, float* y);
void gemm_small_bf16_dpbf16(const ExecContext& ctx, const Bf16PanelWeight& weight, const float* x,
                            int64_t num_tokens, float* y);

// Packs W [out, in] BF16 codes (row-major) into the panel layout (tests; oneDNN's reorder does it
// in the engine). out_panels holds padded_out · padded_in codes.
void pack_bf16_panels(const uint16_t* w, int64_t out_features, int64_t in_features,
                      uint16_t* out_panels);

}  // namespace dz::kernels
