// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() idiom
// (GCC bug 105593); the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include "dayzero/kernels/bf16_avx512.h"
#include "dayzero/kernels/linear_kernels.h"

namespace dz::kernels::detail {
namespace {

// 16 FP16 lanes per 256 bits → two FP32 vectors each holding value · 2^-8 (see linear_fp8.h).
// Sign-extending the byte puts the sign in bits 8..15; after << 7 bit 15 is the sign and bit 14 a
// copy of it, which the mask clears, leaving eeee.mmm in bits 13..7.
inline void decode_32(__m256i codes, __m512& lo, __m512& hi) {
  __m512i h = _mm512_cvtepi8_epi16(codes);
  h = _mm512_and_si512(_mm512_slli_epi16(h, 7), _mm512_set1_epi16(static_cast<int16_t>(0xBF80)));
  lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
  hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
}

inline __mmask32 tail_mask32(int64_t num_left) {
  return num_left >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((uint64_t{1} << num_left) - 1);
}

// Output rows per tile: the tile's rows are swept one column block at a time, so the block of x
// (kTokens × block_cols floats, 4 KiB at 8 × 128) stays in L1 for all of them instead of all of
// x streaming from L2 once per row.
constexpr int64_t kGemvRowTile = 8;

template <int kTokens>
void gemv_rows(const uint8_t* codes, const float* scale_inv, const formats::Fp8BlockShape& shape,
               const float* x, float* y, int64_t row_begin, int64_t row_end) {
  constexpr int kGroups = kTokens == 1 ? 4 : (kTokens <= 3 ? 2 : 1);
  const int64_t in = shape.num_cols, out = shape.num_rows;
  const int64_t num_scale_cols = shape.num_scale_cols();
  __m512 total[kGemvRowTile][kTokens];
  for (int64_t tile_begin = row_begin; tile_begin < row_end; tile_begin += kGemvRowTile) {
    const int64_t num_rows =
        row_end - tile_begin < kGemvRowTile ? row_end - tile_begin : kGemvRowTile;
    for (int64_t r = 0; r < num_rows; ++r)
      for (int t = 0; t < kTokens; ++t) total[r][t] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < num_scale_cols; ++kb) {
      const int64_t col_begin = kb * shape.block_cols;
      const int64_t col_end = col_begin + shape.block_cols < in ? col_begin + shape.block_cols : in;
      for (int64_t r = 0; r < num_rows; ++r) {
        const int64_t i = tile_begin + r;
        const uint8_t* w_row = codes + i * in;
        // kGroups groups of 32 codes per step, two accumulators each: at least eight independent
        // FMA chains, which the FMA latency needs (one chain was latency-bound at ~8 B/cycle).
        __m512 acc[2 * kGroups][kTokens];
        for (auto& group : acc)
          for (auto& v : group) v = _mm512_setzero_ps();
        const auto step = [&](int64_t j, __mmask32 mask, int g) {
          __m512 w_lo, w_hi;
          decode_32(_mm256_maskz_loadu_epi8(mask, w_row + j), w_lo, w_hi);
          const auto mask_lo = static_cast<__mmask16>(mask);
          const auto mask_hi = static_cast<__mmask16>(mask >> 16);
          for (int t = 0; t < kTokens; ++t) {
            const float* xt = x + t * in + j;
            acc[2 * g][t] =
                _mm512_fmadd_ps(w_lo, _mm512_maskz_loadu_ps(mask_lo, xt), acc[2 * g][t]);
            acc[2 * g + 1][t] =
                _mm512_fmadd_ps(w_hi, _mm512_maskz_loadu_ps(mask_hi, xt + 16), acc[2 * g + 1][t]);
          }
        };
        int64_t j = col_begin;
        for (; j + 32 * kGroups <= col_end; j += 32 * kGroups)
          for (int g = 0; g < kGroups; ++g) step(j + 32 * g, ~__mmask32{0}, g);
        for (; j < col_end; j += 32) step(j, tail_mask32(col_end - j), 0);
        for (int g = 1; g < 2 * kGroups; ++g)
          for (int t = 0; t < kTokens; ++t) acc[0][t] = _mm512_add_ps(acc[0][t], acc[g][t]);
        const __m512 scale =
            _mm512_set1_ps(scale_inv[(i / shape.block_rows) * num_scale_cols + kb]);
        for (int t = 0; t < kTokens; ++t)
          total[r][t] = _mm512_fmadd_ps(acc[0][t], scale, total[r][t]);
      }
    }
    // × 2^8 undoes the FP16 decode's 2^-8 exactly.
    for (int64_t r = 0; r < num_rows; ++r)
      for (int t = 0; t < kTokens; ++t)
        y[t * out + tile_begin + r] = _mm512_reduce_add_ps(total[r][t]) * 256.0f;
  }
}

template <typename Store>
void dequantize_rows(const uint8_t* codes, const float* scale_inv,
                     const formats::Fp8BlockShape& shape, int64_t row_begin, int64_t row_end,
                     Store&& store) {
  const int64_t in = shape.num_cols;
  const int64_t num_scale_cols = shape.num_scale_cols();
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* w_row = codes + i * in;
    const float* scale_row = scale_inv + (i / shape.block_rows) * num_scale_cols;
    const int64_t out_row = (i - row_begin) * in;
    for (int64_t kb = 0; kb < num_scale_cols; ++kb) {
      const int64_t col_begin = kb * shape.block_cols;
      const int64_t col_end = col_begin + shape.block_cols < in ? col_begin + shape.block_cols : in;
      // (value · 2^-8) · (scale · 2^8): both factors exact, so the one rounding is that of
      // value · scale, as in formats::dequantize_fp8_block.
      const __m512 scale = _mm512_set1_ps(scale_row[kb] * 256.0f);
      for (int64_t j = col_begin; j < col_end; j += 32) {
        const __mmask32 mask = tail_mask32(col_end - j);
        __m512 w_lo, w_hi;
        decode_32(_mm256_maskz_loadu_epi8(mask, w_row + j), w_lo, w_hi);
        store(out_row + j, _mm512_mul_ps(w_lo, scale), _mm512_mul_ps(w_hi, scale), mask);
      }
    }
  }
}

}  // namespace

void round_to_bf16_avx512(const float* x, int64_t num_elems, uint16_t* out, float* out_f32) {
  for (int64_t e = 0; e < num_elems; e += 16) {
    const int64_t num_left = num_elems - e;
    const __mmask16 mask =
        num_left >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << num_left) - 1);
    const __m256i rounded = encode_bf16_16(_mm512_maskz_loadu_ps(mask, x + e));
    if (out != nullptr) _mm256_mask_storeu_epi16(out + e, mask, rounded);
    if (out_f32 != nullptr) _mm512_mask_storeu_ps(out_f32 + e, mask, decode_bf16_16(rounded));
  }
}

void fp8_gemv_rows_avx512(const uint8_t* codes, const float* scale_inv,
                          const formats::Fp8BlockShape& shape, const float* x, int64_t num_tokens,
                          float* y, int64_t row_begin, int64_t row_end) {
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

void fp8_dequantize_rows_bf16_avx512(const uint8_t* codes, const float* scale_inv,
                                     const formats::Fp8BlockShape& shape, int64_t row_begin,
                                     int64_t row_end, uint16_t* out) {
  // The products are BF16 values (4 significant bits times a power of two), so dropping the low
  // 16 bits is exact.
  dequantize_rows(
      codes, scale_inv, shape, row_begin, row_end,
      [out](int64_t offset, __m512 lo, __m512 hi, __mmask32 mask) {
        const __m256i lo16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(lo), 16));
        const __m256i hi16 = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(hi), 16));
        const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(lo16), hi16, 1);
        _mm512_mask_storeu_epi16(out + offset, mask, both);
      });
}

void fp8_dequantize_rows_f32_avx512(const uint8_t* codes, const float* scale_inv,
                                    const formats::Fp8BlockShape& shape, int64_t row_begin,
                                    int64_t row_end, float* out) {
  dequantize_rows(codes, scale_inv, shape, row_begin, row_end,
                  [out](int64_t offset, __m512 lo, __m512 hi, __mmask32 mask) {
                    _mm512_mask_storeu_ps(out + offset, static_cast<__mmask16>(mask), lo);
                    _mm512_mask_storeu_ps(out + offset + 16, static_cast<__mmask16>(mask >> 16),
                                          hi);
                  });
}

}  // namespace dz::kernels::detail
