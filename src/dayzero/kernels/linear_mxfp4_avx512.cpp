// MXFP4 kernels behind LinearWeight (formats.md §3.4, §6.6): E2M1 nibbles become BF16 by a 32-word
// VPERMW table (the table repeats after 16 entries, so the index's bit 4 is ignored), VDPBF16PS
// multiplies them with BF16 activations, and each block's 2^(E−127) is applied in FP32 after the
// block's dot product. The scale is never folded into the BF16 operand: codes 0 and 1 would make
// it subnormal, which VDPBF16PS flushes (formats.md §6).
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <array>

#include "dayzero/formats/decode_tables.h"
#include "dayzero/kernels/linear_kernels.h"

namespace dz::kernels::detail {
namespace {

// BF16 bits of the 16 E2M1 codes (formats.md §1.3), twice.
alignas(64) constexpr std::array<uint16_t, 32> kE2m1Bf16 = {
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80,
    0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0, 0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040,
    0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};

inline __m512bh as_bh(__m512i v) {
  return (__m512bh)v;  // same bits, BF16 lanes
}

// Loops over rows and tokens must be unrolled so that the accumulators stay in registers.
#if defined(__clang__)
#define DZ_MXFP4_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define DZ_MXFP4_UNROLL _Pragma("GCC unroll 8")
#else
#define DZ_MXFP4_UNROLL
#endif

// Software prefetch distance in bytes ahead of each row's current pair of blocks.
constexpr int64_t kPrefetchBytes = 512;

// kRows rows starting at `row`, kTokens tokens. x holds the tokens' activations in the GEMV layout
// (linear_kernels.h), x_elems apart. Pair p of a row is bytes [32p, 32p + 32): codes widened to
// words, VPERMW on the low nibble gives the even elements of the 64, on the high nibble the odd
// ones, matching the activations' layout; FP32 lanes 0–7 of the dot then belong to the first
// block and 8–15 to the second, so one scale vector (two broadcasts) serves both.
template <int kTokens, int kRows>
inline void gemv_row_group(const uint8_t* packed, const uint8_t* scales, int64_t in,
                           const uint16_t* x, int64_t x_elems, float* y, int64_t y_stride,
                           int64_t row) {
  const int64_t row_bytes = in / 2, num_blocks = in / 32, num_pairs = num_blocks / 2;
  const __m512i table = _mm512_load_si512(kE2m1Bf16.data());
  const float* scale_values = formats::kE8m0Values.data();
  const uint8_t* w_rows = packed + row * row_bytes;
  const uint8_t* s_rows = scales + row * num_blocks;
  __m512 total[kRows][kTokens];
  DZ_MXFP4_UNROLL
  for (int r = 0; r < kRows; ++r) {
    DZ_MXFP4_UNROLL
    for (int t = 0; t < kTokens; ++t) total[r][t] = _mm512_setzero_ps();
  }
  // One pair of blocks of every row; `lone`: a last single block (16 bytes, one scale).
  const auto step = [&](int64_t p, bool lone) {
    __m512i xe[kTokens], xo[kTokens];
    DZ_MXFP4_UNROLL
    for (int t = 0; t < kTokens; ++t) {
      xe[t] = _mm512_load_si512(x + t * x_elems + 64 * p);
      xo[t] = _mm512_load_si512(x + t * x_elems + 64 * p + 32);
    }
    DZ_MXFP4_UNROLL
    for (int r = 0; r < kRows; ++r) {
      const uint8_t* w = w_rows + r * row_bytes + 32 * p;
      const uint8_t* s = s_rows + r * num_blocks + 2 * p;
      __m512i codes;
      __m512 scale;
      if (lone) {
        codes = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(0xFFFF, w));
        scale = _mm512_maskz_mov_ps(0x00FF, _mm512_set1_ps(scale_values[s[0]]));
      } else {
        codes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
        scale = _mm512_mask_mov_ps(_mm512_set1_ps(scale_values[s[0]]), 0xFF00,
                                   _mm512_set1_ps(scale_values[s[1]]));
      }
      const __m512i even = _mm512_permutexvar_epi16(codes, table);
      const __m512i odd = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), table);
      DZ_MXFP4_UNROLL
      for (int t = 0; t < kTokens; ++t) {
        __m512 dot = _mm512_dpbf16_ps(_mm512_setzero_ps(), as_bh(even), as_bh(xe[t]));
        dot = _mm512_dpbf16_ps(dot, as_bh(odd), as_bh(xo[t]));
        total[r][t] = _mm512_fmadd_ps(dot, scale, total[r][t]);
      }
    }
  };
  int64_t p = 0;
  for (; p + 2 <= num_pairs; p += 2) {
    // One cache line of every row per iteration, prefetched once.
    DZ_MXFP4_UNROLL
    for (int r = 0; r < kRows; ++r)
      _mm_prefetch(reinterpret_cast<const char*>(w_rows + r * row_bytes + 32 * p + kPrefetchBytes),
                   _MM_HINT_T0);
    step(p, false);
    step(p + 1, false);
  }
  if (p < num_pairs) step(p, false);
  if (num_blocks % 2 != 0) step(num_pairs, true);
  DZ_MXFP4_UNROLL
  for (int r = 0; r < kRows; ++r) {
    DZ_MXFP4_UNROLL
    for (int t = 0; t < kTokens; ++t) y[t * y_stride + row + r] = _mm512_reduce_add_ps(total[r][t]);
  }
}

template <int kTokens>
void gemv_rows(const uint8_t* packed, const uint8_t* scales, int64_t in, const uint16_t* x,
               float* y, int64_t y_stride, int64_t row_begin, int64_t row_end) {
  // Several rows per pass: independent FMA chains and several DRAM streams; fewer as the tokens'
  // accumulators fill the registers.
  constexpr int kRows = kTokens <= 2 ? 4 : (kTokens <= 4 ? 2 : 1);
  const int64_t x_elems = mxfp4_gemv_x_elems(in);
  int64_t row = row_begin;
  for (; row + kRows <= row_end; row += kRows)
    gemv_row_group<kTokens, kRows>(packed, scales, in, x, x_elems, y, y_stride, row);
  for (; row < row_end; ++row)
    gemv_row_group<kTokens, 1>(packed, scales, in, x, x_elems, y, y_stride, row);
}

}  // namespace

void mxfp4_pack_x_avx512(const float* x, int64_t in, uint16_t* out) {
  // Word i of the first 32 is element 2i of the 64, word i of the second 32 element 2i + 1.
  alignas(64) static constexpr std::array<uint16_t, 32> kEven = {
      0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30,
      32, 34, 36, 38, 40, 42, 44, 46, 48, 50, 52, 54, 56, 58, 60, 62};
  const __m512i even_idx = _mm512_load_si512(kEven.data());
  const __m512i odd_idx = _mm512_add_epi16(even_idx, _mm512_set1_epi16(1));
  alignas(64) uint16_t words[64];
  for (int64_t g = 0; g < in; g += 64) {
    const int64_t n = in - g < 64 ? in - g : 64;
    if (n < 64)
      for (auto& w : words) w = 0;
    round_to_bf16_avx512(x + g, n, words, nullptr);
    const __m512i a = _mm512_load_si512(words);
    const __m512i b = _mm512_load_si512(words + 32);
    _mm512_store_si512(out + g, _mm512_permutex2var_epi16(a, even_idx, b));
    _mm512_store_si512(out + g + 32, _mm512_permutex2var_epi16(a, odd_idx, b));
  }
}

void mxfp4_gemv_rows_avx512(const uint8_t* packed, const uint8_t* scales, int64_t in,
                            const uint16_t* x, int64_t num_tokens, float* y, int64_t y_stride,
                            int64_t row_begin, int64_t row_end) {
  switch (num_tokens) {
    case 1:
      return gemv_rows<1>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 2:
      return gemv_rows<2>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 3:
      return gemv_rows<3>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 4:
      return gemv_rows<4>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 5:
      return gemv_rows<5>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 6:
      return gemv_rows<6>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 7:
      return gemv_rows<7>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 8:
      return gemv_rows<8>(packed, scales, in, x, y, y_stride, row_begin, row_end);
    default:
      __builtin_trap();
  }
}

void mxfp4_dequantize_rows_avx512(const uint8_t* packed, const uint8_t* scales, int64_t in,
                                  int64_t row_begin, int64_t row_end, uint16_t* out_bf16,
                                  float* out_f32) {
  alignas(64) static constexpr std::array<int32_t, 16> kLo = {0, 16, 1, 17, 2, 18, 3, 19,
                                                              4, 20, 5, 21, 6, 22, 7, 23};
  const __m512i lo_idx = _mm512_load_si512(kLo.data());
  const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(8));
  const __m512 table = _mm512_loadu_ps(formats::kE2m1Values.data());
  const int64_t row_bytes = in / 2, num_blocks = in / 32;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* w = packed + i * row_bytes;
    const uint8_t* s = scales + i * num_blocks;
    const int64_t out_row = (i - row_begin) * in;
    for (int64_t b = 0; b < num_blocks; ++b) {
      // Byte k of the block → lane k: the low nibble is element 2k, the high one 2k + 1. Both
      // factors of each product are exact and the product is a FP32 value (subnormal only for
      // scale codes 0 and 1, kept with DAZ clear), so it equals the formats reference.
      const __m512i codes =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * b)));
      const __m512 scale = _mm512_set1_ps(formats::kE8m0Values[s[b]]);
      const __m512 even = _mm512_mul_ps(_mm512_permutexvar_ps(codes, table), scale);
      const __m512 odd =
          _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(codes, 4), table), scale);
      const __m512 first = _mm512_permutex2var_ps(even, lo_idx, odd);
      const __m512 second = _mm512_permutex2var_ps(even, hi_idx, odd);
      const int64_t offset = out_row + 32 * b;
      if (out_f32 != nullptr) {
        _mm512_storeu_ps(out_f32 + offset, first);
        _mm512_storeu_ps(out_f32 + offset + 16, second);
      } else {
        // Every product is a BF16 value (2 significant bits), so dropping 16 bits is exact.
        const __m256i a = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(first), 16));
        const __m256i c = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(second), 16));
        _mm512_storeu_si512(out_bf16 + offset, _mm512_inserti64x4(_mm512_castsi256_si512(a), c, 1));
      }
    }
  }
}

}  // namespace dz::kernels::detail
