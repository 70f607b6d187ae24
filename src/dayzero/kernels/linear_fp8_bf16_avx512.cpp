// The FP8-block GEMV on BF16 dot products (docs/formats.md §6.4a): E4M3 codes become their exact
// BF16 values through two 128-entry byte tables (VPERMI2B gives the high and the low byte of
// |value| from the code's low 7 bits, the sign is ORed into the high byte), VPUNPCKL/HBW pair the
// bytes into words, and VDPBF16PS multiplies them with BF16 activations into FP32. Every E4M3
// value, subnormals included, is a normal BF16, so the decode is exact and needs no scale folding;
// the 128-column block scale multiplies each block's FP32 partial sum. About 5 shuffle/logic
// instructions per 64 codes, against ≈ 24 for the E4M3 → FP16 → FP32 path of
// linear_fp8_avx512.cpp, which stays for block widths that are not multiples of 64.
// The same decode feeds the GEMM of CPUs without AMX (fp8_bf16_gemm_groups, >= 9 tokens): 16 rows
// decoded once per column block into L1, the 16 tokens of a tile in the vector lanes, each
// decoded weight pair broadcast into one VDPBF16PS per row: no horizontal sums, and every decoded
// weight serves all the call's tokens.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/kernels/e4m3_bf16_avx512.h"
#include "dayzero/kernels/linear_common.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/transpose_avx512.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels::detail {
namespace {

// Software prefetch (kFp8GemvPrefetchL1Bytes / L2Bytes): 1 token, 1 thread, weights from DRAM,
// CPU time, on the loaded machine (runs spread by ±15 %): no prefetch 6.0–6.3 GB/s, L1 only
// 16 KiB ahead 7.1–9.7, L2 32 KiB + L1 4 KiB ahead 7.3–9.5 with the best mean of three alternating
// rounds (9.2 vs 7.9; the DRAM read loop 9.9–11.9 in the same runs).

template <int kTokens>
void gemv_rows(const uint8_t* codes, const float* scale_inv, const formats::Fp8BlockShape& shape,
               const uint16_t* x, float* y, int64_t row_begin, int64_t row_end) {
  // With one or two tokens a block's dot products form one chain per token; two accumulators per
  // token (halves a and b) halve its length. More tokens give enough independent chains.
  constexpr int kSplit = kTokens <= 2 ? 2 : 1;
  const E4m3Bf16Decoder decoder;
  const int64_t in = shape.num_cols, out = shape.num_rows;
  const int64_t num_scale_cols = shape.num_scale_cols(), block_cols = shape.block_cols;
  const int64_t x_elems = fp8_gemv_x_elems(in);
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* w = codes + i * in;
    const float* scale_row = scale_inv + (i / shape.block_rows) * num_scale_cols;
    __m512 total[kTokens];
    DZ_UNROLL(8)
    for (int t = 0; t < kTokens; ++t) total[t] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < num_scale_cols; ++kb) {
      const int64_t col_begin = kb * block_cols;
      const int64_t col_end = col_begin + block_cols < in ? col_begin + block_cols : in;
      __m512 acc[kSplit][kTokens];
      DZ_UNROLL(8)
      for (int s = 0; s < kSplit; ++s) {
        DZ_UNROLL(8)
        for (int t = 0; t < kTokens; ++t) acc[s][t] = _mm512_setzero_ps();
      }
      const auto step = [&](int64_t j, __m512i c) {
        __m512i a, b;
        decoder.decode(c, a, b);
        DZ_UNROLL(8)
        for (int t = 0; t < kTokens; ++t) {
          const uint16_t* xt = x + t * x_elems + j;
          acc[0][t] = _mm512_dpbf16_ps(acc[0][t], as_bh(a), as_bh(_mm512_load_si512(xt)));
          acc[kSplit - 1][t] =
              _mm512_dpbf16_ps(acc[kSplit - 1][t], as_bh(b), as_bh(_mm512_load_si512(xt + 32)));
        }
      };
      int64_t j = col_begin;
      for (; j + 64 <= col_end; j += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + j + kFp8GemvPrefetchL1Bytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + j + kFp8GemvPrefetchL2Bytes), _MM_HINT_T1);
        step(j, _mm512_loadu_si512(w + j));
      }
      // A partial last chunk: masked-off codes load as 0 (BF16 +0) and the activations are
      // zero-padded, so they add nothing.
      if (j < col_end)
        step(j, _mm512_maskz_loadu_epi8((~uint64_t{0}) >> (64 - (col_end - j)), w + j));
      const __m512 scale = _mm512_set1_ps(scale_row[kb]);
      DZ_UNROLL(8)
      for (int t = 0; t < kTokens; ++t) {
        const __m512 sum = kSplit == 2 ? _mm512_add_ps(acc[0][t], acc[kSplit - 1][t]) : acc[0][t];
        total[t] = _mm512_fmadd_ps(sum, scale, total[t]);
      }
    }
    DZ_UNROLL(8)
    for (int t = 0; t < kTokens; ++t) y[t * out + i] = _mm512_reduce_add_ps(total[t]);
  }
}

constexpr int64_t kXTileWords = 512;  // one chunk of a token tile: 16 pairs × 16 tokens × 2 words
constexpr int64_t kGemmRows = 16;     // output rows per group: one accumulator each

// One row group of the VDPBF16PS GEMM over every column block. Per block, the group's 16 rows are
// decoded once into `decoded` (row m, chunk c of 32 words at m · block_words + 32c: the decoder's
// a and b halves) and transposed into `pairs_by_step` [pair][row]; then for each token tile the 16
// accumulators (lanes: tokens) take one VDPBF16PS per row and pair, the pair broadcast, and the
// block's sums are scaled per row into `totals` [tile][row][token].
void gemm_group(const uint8_t* codes, const float* scale_inv, const formats::Fp8BlockShape& shape,
                const uint16_t* xb, int64_t num_tokens, float* y, int64_t row0, uint16_t* decoded,
                int32_t* pairs_by_step, float* totals) {
  const E4m3Bf16Decoder decoder;
  const int64_t in = shape.num_cols, out = shape.num_rows;
  const int64_t num_blocks = shape.num_scale_cols(), block_cols = shape.block_cols;
  const int64_t num_chunks = fp8_x_tile_chunks(in), block_chunks = block_cols / 32;
  const int64_t block_words = block_chunks * 32;
  const int64_t num_tiles = (num_tokens + 15) / 16;
  const int64_t rows = std::min(kGemmRows, out - row0);
  const uint8_t* row_codes[kGemmRows];
  const float* scale_rows[kGemmRows];
  for (int64_t m = 0; m < kGemmRows; ++m) {
    const int64_t i = row0 + std::min(m, rows - 1);  // rows past the matrix repeat the last one
    row_codes[m] = codes + i * in;
    scale_rows[m] = scale_inv + i / shape.block_rows * num_blocks;
  }
  for (int64_t e = 0; e < num_tiles * kGemmRows * 16; e += 16)
    _mm512_store_ps(totals + e, _mm512_setzero_ps());
  for (int64_t kb = 0; kb < num_blocks; ++kb) {
    const int64_t col_begin = kb * block_cols;
    const int64_t chunks = std::min(block_chunks, num_chunks - kb * block_chunks);  // even
    for (int64_t m = 0; m < kGemmRows; ++m) {
      const uint8_t* w = row_codes[m] + col_begin;
      for (int64_t line = 0; line < block_cols; line += 64)  // the next block of this row
        _mm_prefetch(reinterpret_cast<const char*>(w + block_cols + line), _MM_HINT_T0);
      for (int64_t p = 0; 2 * p < chunks; ++p) {
        const int64_t n = in - (col_begin + 64 * p);
        const __m512i c = n >= 64 ? _mm512_loadu_si512(w + 64 * p)
                                  : _mm512_maskz_loadu_epi8((~uint64_t{0}) >> (64 - n), w + 64 * p);
        __m512i a, b;
        decoder.decode(c, a, b);
        _mm512_store_si512(decoded + m * block_words + 64 * p, a);
        _mm512_store_si512(decoded + m * block_words + 64 * p + 32, b);
      }
    }
    // Pair q of the 16 rows made one 64-byte line: a step's 16 broadcasts then read one base
    // address at fixed offsets (16 row pointers spilled registers in the loop below).
    const int64_t row_pairs = block_words / 2;
    for (int64_t q = 0; q < row_pairs; q += 16)
      transpose16(reinterpret_cast<const float*>(decoded) + q, row_pairs,
                  reinterpret_cast<float*>(pairs_by_step) + 16 * q, 16);
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
      const uint16_t* x = xb + (tile * num_chunks + kb * block_chunks) * kXTileWords;
      __m512 acc[kGemmRows];
#pragma GCC unroll 16
      for (int m = 0; m < kGemmRows; ++m) acc[m] = _mm512_setzero_ps();
      for (int64_t q = 0; q < chunks * 16; ++q) {
        const __m512i xq = _mm512_load_si512(x + 32 * q);
        const int32_t* step_pairs = pairs_by_step + 16 * q;
#pragma GCC unroll 16
        for (int m = 0; m < kGemmRows; ++m)
          acc[m] = _mm512_dpbf16_ps(acc[m], as_bh(_mm512_set1_epi32(step_pairs[m])), as_bh(xq));
      }
      float* t = totals + tile * kGemmRows * 16;
#pragma GCC unroll 16
      for (int m = 0; m < kGemmRows; ++m)
        _mm512_store_ps(t + 16 * m, _mm512_fmadd_ps(acc[m], _mm512_set1_ps(scale_rows[m][kb]),
                                                    _mm512_load_ps(t + 16 * m)));
    }
  }
  // totals[tile] is [row][token]: transposed into y [token][row].
  const auto valid = static_cast<__mmask16>((1u << rows) - 1);
  alignas(64) float by_token[256];
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    transpose16(totals + tile * kGemmRows * 16, 16, by_token, 16);
    const int64_t tokens = std::min<int64_t>(16, num_tokens - 16 * tile);
    for (int64_t n = 0; n < tokens; ++n)
      _mm512_mask_storeu_ps(y + (16 * tile + n) * out + row0, valid,
                            _mm512_load_ps(by_token + 16 * n));
  }
}

}  // namespace

void fp8_pack_x_avx512(const float* x, int64_t in, uint16_t* out) {
  // Word 8L + k of half h of each 64 is element 16L + 8h + k (the unpack order above).
  alignas(64) uint16_t words[64];
  for (int64_t g = 0; g < in; g += 64) {
    const int64_t n = in - g < 64 ? in - g : 64;
    if (n < 64)
      for (auto& w : words) w = 0;
    round_to_bf16_avx512(x + g, n, words, nullptr);
    for (int h = 0; h < 2; ++h)
      for (int lane = 0; lane < 4; ++lane)
        for (int k = 0; k < 8; ++k) out[g + 32 * h + 8 * lane + k] = words[16 * lane + 8 * h + k];
  }
}

void fp8_pack_x_tiles(const float* x, int64_t in, int64_t num_tokens, int64_t tile_begin,
                      int64_t tile_end, uint16_t* out) {
  const int64_t x_elems = fp8_gemv_x_elems(in), num_chunks = fp8_x_tile_chunks(in);
  thread_local AlignedBuffer token_rows;
  auto* rows = reinterpret_cast<uint16_t*>(
      ensure(token_rows, static_cast<size_t>(16 * x_elems) * sizeof(uint16_t)));
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    // Each token in the GEMV's order (word 8L + k of half h of each 64 is element 16L + 8h + k,
    // the decoder's order), then per chunk of 32 words the 16 × 16 dwords transposed: row r of a
    // B tile holds pair r of every token.
    for (int64_t n = 0; n < 16; ++n) {
      const int64_t token = 16 * tile + n;
      if (token < num_tokens)
        fp8_pack_x_avx512(x + token * in, in, rows + n * x_elems);
      else
        std::fill_n(rows + n * x_elems, x_elems, uint16_t{0});
    }
    for (int64_t c = 0; c < num_chunks; ++c)
      transpose16(reinterpret_cast<const float*>(rows + 32 * c), x_elems / 2,
                  reinterpret_cast<float*>(out + (tile * num_chunks + c) * kXTileWords), 16);
  }
}

void fp8_bf16_gemm_groups(const uint8_t* codes, const float* scale_inv,
                          const formats::Fp8BlockShape& shape, const uint16_t* xb,
                          int64_t num_tokens, float* y, int64_t group_begin, int64_t group_end) {
  thread_local AlignedBuffer decoded, totals;
  // The group's decoded rows [16][block_cols] words, then the same pairs by step
  // [block_cols/2][16].
  const int64_t decoded_words = kGemmRows * shape.block_cols;
  auto* decoded_rows = reinterpret_cast<uint16_t*>(
      ensure(decoded, static_cast<size_t>(2 * decoded_words) * sizeof(uint16_t)));
  auto* pairs_by_step = reinterpret_cast<int32_t*>(decoded_rows + decoded_words);
  auto* total_tiles = reinterpret_cast<float*>(
      ensure(totals, static_cast<size_t>((num_tokens + 15) / 16 * kGemmRows * 16) * sizeof(float)));
  for (int64_t group = group_begin; group < group_end; ++group)
    gemm_group(codes, scale_inv, shape, xb, num_tokens, y, group * kGemmRows, decoded_rows,
               pairs_by_step, total_tiles);
}

void fp8_gemv_bf16_rows_avx512(const uint8_t* codes, const float* scale_inv,
                               const formats::Fp8BlockShape& shape, const uint16_t* x,
                               int64_t num_tokens, float* y, int64_t row_begin, int64_t row_end) {
  switch (num_tokens) {
    case 1:
      return gemv_rows<1>(codes, scale_inv, shape, x, y, row_begin, row_end);
    case 2:
      return gemv_rows<2>(codes, scale_inv, shape, x, y, row_begin, row_end);
    case 3:
      return gemv_rows<3>(codes, scale_inv, shape, x, y, row_begin, row_end);
    case 4:
      return gemv_rows<4>(codes, scale_inv, shape, x, y, row_begin, row_end);
    case 5:
      return gemv_rows<5>(codes, scale_inv, shape, x, y, row_begin, row_end);
    case 6:
      return gemv_rows<6>(codes, scale_inv, shape, x, y, row_begin, row_end);
    case 7:
      return gemv_rows<7>(codes, scale_inv, shape, x, y, row_begin, row_end);
    case 8:
      return gemv_rows<8>(codes, scale_inv, shape, x, y, row_begin, row_end);
    default:
      __builtin_trap();
  }
}

}  // namespace dz::kernels::detail
