// The FP8-block GEMM on AMX tiles (linear_kernels.h), for every block scale: E4M3 codes decode
// exactly to BF16 (e4m3_bf16_avx512.h), so the products are exact as in the VDPBF16PS GEMV, and
// each column block's partial sums are scaled in FP32, as the GEMV and the reference do.
// - The weights are the A operand: one decoded row of 32 codes is one tile row as the decoder
//   leaves it (no transpose, no re-layout at load), 16 output rows per tile. The activations are
//   the B operand (16 tokens, BF16 pairs), packed once per call in the decoder's element order.
// - A column block's products go to a C tile, one per tile of 16 tokens (up to four at a time, so
//   a decoded tile serves 64 tokens); the tile is stored, scaled per row and added to the row
//   group's FP32 accumulators. The next block is decoded while the tiles multiply this one.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/kernels/amx_tiles.h"
#include "dayzero/kernels/e4m3_bf16_avx512.h"
#include "dayzero/kernels/linear_common.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/transpose_avx512.h"

namespace dz::kernels::detail {
namespace {

constexpr int64_t kTileWords = 512;  // 16 rows × 64 bytes
constexpr int64_t kGroupRows = 16;   // output rows per A tile
constexpr int64_t kBatchTiles = 4;   // token tiles per pass over a row group (C tiles 0–3)

struct Fp8AmxBuffers {
  AlignedBuffer decoded;  // two halves of one column block's A tiles
  alignas(64) float c[kBatchTiles][256];
  alignas(64) float acc[kBatchTiles][256];  // [row][token] per token tile
};

struct Fp8AmxGroup {
  const uint8_t* codes;  // the group's first row
  int64_t rows;          // valid rows (16 except in the last group)
  int64_t in, block_cols;
  E4m3Bf16Decoder decoder;

  // The A tiles of column block kb into `to`: tile 2p + h, row m is half h of codes
  // [kb · block_cols + 64p, + 64) of row m; rows past `rows` and codes past `in` are zero.
  void decode(int64_t kb, int64_t chunks, uint16_t* to, const uint8_t* prefetch,
              int64_t prefetch_bytes) const {
    for (int64_t line = 0; line < prefetch_bytes; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(prefetch + line), _MM_HINT_T1);
    const int64_t col_begin = kb * block_cols;
    for (int64_t m = 0; m < kGroupRows; ++m) {
      const uint8_t* w = codes + m * in + col_begin;
      for (int64_t p = 0; 2 * p < chunks; ++p) {
        __m512i a = _mm512_setzero_si512(), b = _mm512_setzero_si512();
        if (m < rows) {
          const int64_t n = in - (col_begin + 64 * p);
          const __m512i c = n >= 64
                                ? _mm512_loadu_si512(w + 64 * p)
                                : _mm512_maskz_loadu_epi8((~uint64_t{0}) >> (64 - n), w + 64 * p);
          decoder.decode(c, a, b);
        }
        _mm512_store_si512(to + (2 * p) * kTileWords + 32 * m, a);
        _mm512_store_si512(to + (2 * p + 1) * kTileWords + 32 * m, b);
      }
    }
  }
};

// One chunk's A tile (tile a_tile, from `a`) times kTiles token tiles (B tiles 6–7 in turn, from
// b, b + b_tile_stride, …) into C tiles 0 … kTiles − 1. Tile numbers must be literals.
#define DZ_FP8_AMX_CHUNK(a_tile, a, b)             \
  do {                                             \
    _tile_loadd(a_tile, a, 64);                    \
    _tile_loadd(6, b, 64);                         \
    _tile_dpbf16ps(0, a_tile, 6);                  \
    if constexpr (kTiles > 1) {                    \
      _tile_loadd(7, (b) + b_tile_stride, 64);     \
      _tile_dpbf16ps(1, a_tile, 7);                \
    }                                              \
    if constexpr (kTiles > 2) {                    \
      _tile_loadd(6, (b) + 2 * b_tile_stride, 64); \
      _tile_dpbf16ps(2, a_tile, 6);                \
    }                                              \
    if constexpr (kTiles > 3) {                    \
      _tile_loadd(7, (b) + 3 * b_tile_stride, 64); \
      _tile_dpbf16ps(3, a_tile, 7);                \
    }                                              \
  } while (false)

// Rows of one group × kTiles token tiles starting at token tile `tile0`, over every column block.
template <int kTiles>
__attribute__((target("amx-tile,amx-bf16"))) void group_batch(
    const Fp8AmxGroup& g, const float* scale_inv, const formats::Fp8BlockShape& shape, int64_t row0,
    const uint16_t* xb, int64_t tile0, int64_t num_tokens, float* y, Fp8AmxBuffers& buffers,
    const uint8_t* prefetch, int64_t prefetch_per_block) {
  const int64_t num_blocks = shape.num_scale_cols();
  const int64_t chunks_per_block = 2 * ((shape.block_cols + 63) / 64);
  const int64_t num_chunks = fp8_x_tile_chunks(shape.num_cols);
  const int64_t b_tile_stride = num_chunks * kTileWords;
  auto* decoded = reinterpret_cast<uint16_t*>(buffers.decoded.data());
  const int64_t half_words = chunks_per_block * kTileWords;
  // The scale of each row of the group, per column block: its row of scale_inv.
  const float* scale_rows[kGroupRows];
  for (int64_t m = 0; m < kGroupRows; ++m)
    scale_rows[m] =
        scale_inv + std::min(row0 + m, shape.num_rows - 1) / shape.block_rows * num_blocks;
  for (int t = 0; t < kTiles; ++t)
    for (int64_t e = 0; e < 256; e += 16) _mm512_store_ps(buffers.acc[t] + e, _mm512_setzero_ps());
  const auto chunks_of = [&](int64_t kb) {
    const int64_t cols = std::min(shape.block_cols, shape.num_cols - kb * shape.block_cols);
    return 2 * ((cols + 63) / 64);
  };
  g.decode(0, chunks_of(0), decoded, prefetch, prefetch_per_block);
  for (int64_t kb = 0; kb < num_blocks; ++kb) {
    const uint16_t* current = decoded + (kb % 2) * half_words;
    const uint16_t* b = xb + tile0 * b_tile_stride + kb * chunks_per_block * kTileWords;
    const int64_t chunks = chunks_of(kb);
    _tile_zero(0);
    if constexpr (kTiles > 1) _tile_zero(1);
    if constexpr (kTiles > 2) _tile_zero(2);
    if constexpr (kTiles > 3) _tile_zero(3);
    int64_t c = 0;
    for (; c + 2 <= chunks; c += 2) {
      DZ_FP8_AMX_CHUNK(4, current + c * kTileWords, b + c * kTileWords);
      DZ_FP8_AMX_CHUNK(5, current + (c + 1) * kTileWords, b + (c + 1) * kTileWords);
    }
    if (kb + 1 < num_blocks)
      g.decode(kb + 1, chunks_of(kb + 1), decoded + ((kb + 1) % 2) * half_words,
               prefetch + (kb + 1) * prefetch_per_block, prefetch_per_block);
    _tile_stored(0, buffers.c[0], 64);
    if constexpr (kTiles > 1) _tile_stored(1, buffers.c[1], 64);
    if constexpr (kTiles > 2) _tile_stored(2, buffers.c[2], 64);
    if constexpr (kTiles > 3) _tile_stored(3, buffers.c[3], 64);
    for (int64_t m = 0; m < kGroupRows; ++m) {
      const __m512 scale = _mm512_set1_ps(scale_rows[m][kb]);
      for (int t = 0; t < kTiles; ++t)
        _mm512_store_ps(buffers.acc[t] + 16 * m,
                        _mm512_fmadd_ps(_mm512_load_ps(buffers.c[t] + 16 * m), scale,
                                        _mm512_load_ps(buffers.acc[t] + 16 * m)));
    }
  }
  // acc[t] is [row][token]: transposed into y [token][row].
  const int64_t out = shape.num_rows;
  const auto valid = static_cast<__mmask16>((1u << g.rows) - 1);
  alignas(64) float by_token[256];
  for (int t = 0; t < kTiles; ++t) {
    transpose16(buffers.acc[t], 16, by_token, 16);
    const int64_t token0 = (tile0 + t) * 16;
    const int64_t tokens = std::min<int64_t>(16, num_tokens - token0);
    for (int64_t n = 0; n < tokens; ++n)
      _mm512_mask_storeu_ps(y + (token0 + n) * out + row0, valid,
                            _mm512_load_ps(by_token + 16 * n));
  }
}

}  // namespace

void fp8_amx_gemm_groups(const uint8_t* codes, const float* scale_inv,
                         const formats::Fp8BlockShape& shape, const uint16_t* xb,
                         int64_t num_tokens, float* y, int64_t group_begin, int64_t group_end) {
  thread_local Fp8AmxBuffers buffers;
  const int64_t in = shape.num_cols, out = shape.num_rows;
  const int64_t chunks_per_block = 2 * ((shape.block_cols + 63) / 64);
  ensure(buffers.decoded,
         static_cast<size_t>(2 * chunks_per_block * kTileWords) * sizeof(uint16_t));
  const int64_t num_tiles = (num_tokens + 15) / 16;
  const int64_t group_bytes = kGroupRows * in;  // contiguous
  const int64_t prefetch_per_block = (group_bytes / shape.num_scale_cols() + 63) / 64 * 64;
  configure_amx_tiles(8);
  // Token tiles outer: one pass's B tiles (≤ 4 × in / 32 KiB) stay in L2 over every group, and the
  // weights are streamed once per pass of 64 tokens.
  for (int64_t tile0 = 0; tile0 < num_tiles; tile0 += kBatchTiles) {
    for (int64_t group = group_begin; group < group_end; ++group) {
      const int64_t row0 = group * kGroupRows;
      const Fp8AmxGroup g{codes + row0 * in, std::min(kGroupRows, out - row0), in, shape.block_cols,
                          E4m3Bf16Decoder()};
      // The next group's codes (a full group; not past the range) stream in over this one's blocks.
      const bool prefetch_next = group + 1 < group_end && row0 + 2 * kGroupRows <= out;
      const uint8_t* prefetch = prefetch_next ? codes + (row0 + kGroupRows) * in : codes;
      const int64_t prefetch_bytes = prefetch_next ? prefetch_per_block : 0;
      switch (std::min(kBatchTiles, num_tiles - tile0)) {
        case 1:
          group_batch<1>(g, scale_inv, shape, row0, xb, tile0, num_tokens, y, buffers, prefetch,
                         prefetch_bytes);
          break;
        case 2:
          group_batch<2>(g, scale_inv, shape, row0, xb, tile0, num_tokens, y, buffers, prefetch,
                         prefetch_bytes);
          break;
        case 3:
          group_batch<3>(g, scale_inv, shape, row0, xb, tile0, num_tokens, y, buffers, prefetch,
                         prefetch_bytes);
          break;
        default:
          group_batch<4>(g, scale_inv, shape, row0, xb, tile0, num_tokens, y, buffers, prefetch,
                         prefetch_bytes);
          break;
      }
    }
  }
  release_amx_tiles();
}

}  // namespace dz::kernels::detail
