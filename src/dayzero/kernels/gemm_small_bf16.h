#pragma once
// y [M, N] = x [M, K] · Wᵀ for BF16 weights and few tokens (M ≤ kGemmSmallBf16MaxTokens: decode
// steps of a batch, MoE experts' token groups) on AMX, reading Wᵀ straight from the blocked
// layout oneDNN reorders BF16 linear weights into at load (linear_bf16.cpp), so no second copy
// exists. Why not oneDNN itself: its matmul at M ≤ 64 runs 15–25 % slower than this kernel on
// weights streamed from DRAM (M = 1–16) and below it at M = 32–64 (docs/performance.md, issue 8):
// here every 64-column panel of W is read once from memory for all M rows, 16 rows per AMX tile.
//
// The layout ("BA16a64b2a" in oneDNN's tag notation, Wᵀ as [K, N]): 64-column panels, each
// ceil(K / 32) blocks of [16 K pairs][64 columns][2] BF16, i.e. four AMX B tiles side by side;
// K and N zero-padded to multiples of 32 and 64. Accumulation is FP32 in the tiles (the same
// products as the reference, summed in a different order).

#include <cstdint>
#include <optional>

#include <dnnl.hpp>

#include "dayzero/core/parallel.h"

namespace dz::kernels {

inline constexpr int64_t kGemmSmallBf16MaxTokens = 64;

struct AmxPanelWeight {
  const uint16_t* data = nullptr;  // panels [padded_out / 64][padded_in / 32][16][64][2]
  int64_t in_features = 0;         // K
  int64_t out_features = 0;        // N
  int64_t padded_in = 0;           // K rounded up to 32
  int64_t padded_out = 0;          // N rounded up to 64
};

// True when the CPU has AMX-BF16 and AVX512_BF16 (and the ISA is not forced generic), and Linux
// grants this process the AMX tile state (asked for once).
bool gemm_small_bf16_amx_available();

// The weight as this kernel reads it, if `desc` (Wᵀ [K, N] BF16, as chosen by oneDNN) is exactly
// the layout above and AMX is available; nullopt otherwise (the caller keeps using oneDNN).
std::optional<AmxPanelWeight> amx_panel_weight(const dnnl::memory::desc& desc, const void* data,
                                               int64_t in_features, int64_t out_features);

// y [num_tokens, out_features] (row stride out_features) = x · Wᵀ. x [num_tokens, in_features]
// holds floats that are rounded to BF16 (RNE) first, as LinearWeight::forward does for oneDNN.
// 1 ≤ num_tokens ≤ kGemmSmallBf16MaxTokens. Parallel over 64-column panels (one contiguous range
// of panels per thread: one sequential stream of W each).
void gemm_small_bf16_amx(const ExecContext& ctx, const AmxPanelWeight& weight, const float* x,
                         int64_t num_tokens, float* y);

// Packs W [out, in] BF16 codes (row-major) into the panel layout (tests; oneDNN's reorder does it
// in the engine). out_panels holds padded_out · padded_in codes.
void pack_amx_panels(const uint16_t* w, int64_t out_features, int64_t in_features,
                     uint16_t* out_panels);

}  // namespace dz::kernels
