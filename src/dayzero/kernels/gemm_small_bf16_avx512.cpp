// AMX body of gemm_small_bf16.h. Tiles: 0–3 accumulators C, 4–5 activations A (16 tokens × 32 K
// each), 5–7 weights B (32 K × 16 columns of a panel). Per 32-deep K block:
// - up to 16 tokens: one A tile against the panel's four B tiles (C = 16 tokens × 64 columns), so
//   the whole 4 KiB block is used once, in memory order;
// - 17–32 tokens (and each 32-token group of more): two A tiles against two B tiles (C = 32 × 32),
//   the panel in two passes of 32 columns; the first pass prefetches each block into L2 a few
//   blocks ahead so that the second pass (and the next 32-token group) finds it there.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "dayzero/kernels/amx_tiles.h"
#include "dayzero/kernels/gemm_small_bf16.h"

namespace dz::kernels::detail {
namespace {

constexpr int64_t kPanelCols = 64;
constexpr int64_t kBlockDepth = 32;
constexpr int64_t kBlockElems = kBlockDepth * kPanelCols;  // BF16 codes per 32 × 64 block
constexpr int kBRowBytes = kPanelCols * 2 * 2;             // one K pair of a block row
constexpr int64_t kPrefetchBlocks = 4;

// 16 tokens × 64 columns: c [16][64].
__attribute__((target("amx-tile,amx-bf16"))) void tile_16x64(const uint16_t* x, int64_t padded_in,
                                                             const uint16_t* panel, float* c) {
  const int64_t num_blocks = padded_in / kBlockDepth;
  const auto x_stride = static_cast<int>(padded_in * 2);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < num_blocks; ++kb) {
    const uint16_t* block = panel + kb * kBlockElems;
    _tile_loadd(4, x + kb * kBlockDepth, x_stride);
    _tile_loadd(5, block, kBRowBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, block + 32, kBRowBytes);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, block + 64, kBRowBytes);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, block + 96, kBRowBytes);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, c, 64 * 4);
  _tile_stored(1, c + 16, 64 * 4);
  _tile_stored(2, c + 32, 64 * 4);
  _tile_stored(3, c + 48, 64 * 4);
}

// 32 tokens × the 32 columns [32·half, 32·half + 32) of the panel: c [32][32].
__attribute__((target("amx-tile,amx-bf16"))) void tile_32x32(const uint16_t* x, int64_t padded_in,
                                                             const uint16_t* panel, int64_t half,
                                                             bool prefetch, float* c) {
  const int64_t num_blocks = padded_in / kBlockDepth;
  const auto x_stride = static_cast<int>(padded_in * 2);
  const uint16_t* x_low = x + 16 * padded_in;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t kb = 0; kb < num_blocks; ++kb) {
    const uint16_t* block = panel + kb * kBlockElems + half * 64;
    if (prefetch && kb + kPrefetchBlocks < num_blocks) {
      const char* ahead =
          reinterpret_cast<const char*>(panel + (kb + kPrefetchBlocks) * kBlockElems);
      for (int line = 0; line < kBlockElems * 2; line += 64)
        _mm_prefetch(ahead + line, _MM_HINT_T1);
    }
    _tile_loadd(4, x + kb * kBlockDepth, x_stride);
    _tile_loadd(6, block, kBRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, x_low + kb * kBlockDepth, x_stride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(7, block + 32, kBRowBytes);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, 32 * 4);
  _tile_stored(1, c + 16, 32 * 4);
  _tile_stored(2, c + 16 * 32, 32 * 4);
  _tile_stored(3, c + 16 * 32 + 16, 32 * 4);
}

}  // namespace

void gemm_small_bf16_amx_rows(const Bf16PanelWeight& weight, const uint16_t* x_bf16,
                              int64_t padded_tokens, int64_t num_tokens, int64_t panel_begin,
                              int64_t panel_end, float* y) {
  const int64_t K = weight.padded_in, N = weight.out_features;
  alignas(64) float c[32 * 64];
  configure_amx_tiles(8);
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const uint16_t* panel = weight.data + p * K * kPanelCols;
    const int64_t col0 = p * kPanelCols, cols = std::min(kPanelCols, N - col0);
    for (int64_t m0 = 0; m0 < padded_tokens; m0 += 32) {
      const int64_t rows = std::min<int64_t>(32, num_tokens - m0);
      if (padded_tokens - m0 <= 16) {
        tile_16x64(x_bf16 + m0 * K, K, panel, c);
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(y + (m0 + i) * N + col0, c + i * 64, static_cast<size_t>(cols) * 4);
        continue;
      }
      for (int64_t half = 0; half < 2 && half * 32 < cols; ++half) {
        tile_32x32(x_bf16 + m0 * K, K, panel, half, m0 == 0 && half == 0, c);
        const int64_t n = std::min<int64_t>(32, cols - half * 32);
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(y + (m0 + i) * N + col0 + half * 32, c + i * 32, static_cast<size_t>(n) * 4);
      }
    }
  }
  release_amx_tiles();
}

void round_rows_to_bf16_avx512(const float* x, int64_t num_rows, int64_t cols, int64_t padded_cols,
                               int64_t padded_rows, uint16_t* out) {
  for (int64_t r = 0; r < padded_rows; ++r) {
    uint16_t* dst = out + r * padded_cols;
    if (r >= num_rows) {
      std::memset(dst, 0, static_cast<size_t>(padded_cols) * 2);
      continue;
    }
    const float* src = x + r * cols;
    int64_t c = 0;
    for (; c + 16 <= cols; c += 16) {
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + c));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + c), reinterpret_cast<const __m256i&>(v));
    }
    if (c < cols) {
      const auto mask = static_cast<__mmask16>((1u << (cols - c)) - 1);
      const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + c));
      _mm256_mask_storeu_epi16(dst + c, mask, reinterpret_cast<const __m256i&>(v));
    }
    if (padded_cols > cols) std::memset(dst + cols, 0, static_cast<size_t>(padded_cols - cols) * 2);
  }
}

}  // namespace dz::kernels::detail
