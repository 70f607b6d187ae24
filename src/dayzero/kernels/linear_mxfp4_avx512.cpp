// MXFP4 kernels behind LinearWeight (docs/formats.md §3.4, §6.6): E2M1 nibbles become BF16 by a
// 32-word VPERMW table (the table repeats after 16 entries, so the index's bit 4 is ignored),
// VDPBF16PS multiplies them with BF16 activations, and each block's 2^(E−127) is applied in FP32
// after the block's dot product. The scale is never folded into the BF16 operand: codes 0 and 1
// would make it subnormal, which VDPBF16PS flushes (docs/formats.md §6).
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <array>
#include <type_traits>

#include "dayzero/formats/decode_tables.h"
#include "dayzero/kernels/e8m0_avx512.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels::detail {
namespace {

inline __m512bh as_bh(__m512i v) {
  return (__m512bh)v;  // same bits, BF16 lanes
}

// One row, kTokens tokens; x holds the tokens' activations in the GEMV layout (linear_kernels.h),
// x_elems apart. One step reads 64 bytes (4 blocks, 128 elements) of the row as 32 words: word k
// holds elements 4k … 4k + 3 in its four nibbles, and VPERMW on the word shifted by 0, 4, 8, 12
// bits gives part q (element 4k + q) of every word — no widening shuffle needed. The kernel is
// bound by port 5 (VPERMW, VPERMD and VDPBF16PS, which measured ≈ 2 cycles of throughput and
// competes with VPERMW here), so all three shifts are VPSRLW on port 0 (a VPSHUFB for the 8-bit one
// ran 5 % slower with the weights in L2). Lane j of a VDPBF16PS result sums elements 8j … 8j + 7
// over the four parts, so lanes 4b … 4b + 3 belong to block b and one scale vector applies all
// four blocks' 2^(E−127) after the dot. Scales are decoded 16 blocks (a quad of 4 steps) at a time
// and spread over the lanes of each step by VPERMD. The last quad may be partial: its missing
// blocks load as code 0 (BF16 +0 against zero-padded activations) with scale code 0.
template <int kTokens>
inline void gemv_row(const uint8_t* packed, const uint8_t* scales, int64_t in, const uint16_t* x,
                     int64_t x_elems, float* y, int64_t y_stride, int64_t row) {
  const int64_t row_bytes = in / 2, num_blocks = in / 32;
  const __m512i table = _mm512_load_si512(kE2m1Bf16.data());
  // Lane j of step `sub` of a quad ← block 4 · sub + j / 4.
  const __m512i quad_lanes = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
  const uint8_t* w_row = packed + row * row_bytes;
  const uint8_t* s_row = scales + row * num_blocks;
  __m512 total[kTokens];
  DZ_UNROLL(8)
  for (int t = 0; t < kTokens; ++t) total[t] = _mm512_setzero_ps();
  // Step g with its scale vector; the codes are loaded by the caller.
  const auto step = [&](int64_t g, __m512i codes, __m512 scale) {
    const __m512i part0 = _mm512_permutexvar_epi16(codes, table);
    const __m512i part1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 4), table);
    const __m512i part2 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 8), table);
    const __m512i part3 = _mm512_permutexvar_epi16(_mm512_srli_epi16(codes, 12), table);
    DZ_UNROLL(8)
    for (int t = 0; t < kTokens; ++t) {
      const uint16_t* xt = x + t * x_elems + 128 * g;
      __m512 dot =
          _mm512_dpbf16_ps(_mm512_setzero_ps(), as_bh(part0), as_bh(_mm512_load_si512(xt)));
      dot = _mm512_dpbf16_ps(dot, as_bh(part1), as_bh(_mm512_load_si512(xt + 32)));
      dot = _mm512_dpbf16_ps(dot, as_bh(part2), as_bh(_mm512_load_si512(xt + 64)));
      dot = _mm512_dpbf16_ps(dot, as_bh(part3), as_bh(_mm512_load_si512(xt + 96)));
      total[t] = _mm512_fmadd_ps(dot, scale, total[t]);
    }
  };
  // Quad q: 16 blocks (kFull) or the last one's `blocks`.
  const auto quad = [&]<bool kFull>(std::bool_constant<kFull>, int64_t q, int64_t blocks) {
    const uint8_t* w = w_row + 256 * q;
    __m128i codes16;
    if constexpr (kFull)
      codes16 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s_row + 16 * q));
    else
      codes16 = _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << blocks) - 1), s_row + 16 * q);
    const __m512i bits = e8m0_scale_bits(_mm512_slli_epi32(_mm512_cvtepu8_epi32(codes16), 23));
    DZ_UNROLL(8)
    for (int sub = 0; sub < 4; ++sub) {
      const int64_t step_blocks = kFull ? 4 : blocks - 4 * sub;
      if (step_blocks <= 0) break;
      _mm_prefetch(reinterpret_cast<const char*>(w + 64 * sub + kMxfp4GemvPrefetchBytes),
                   _MM_HINT_T0);
      const __m512 scale = _mm512_castsi512_ps(
          _mm512_permutexvar_epi32(_mm512_add_epi32(quad_lanes, _mm512_set1_epi32(4 * sub)), bits));
      const __m512i codes =
          step_blocks >= 4
              ? _mm512_loadu_si512(w + 64 * sub)
              : _mm512_maskz_loadu_epi8((~uint64_t{0}) >> (64 - 16 * step_blocks), w + 64 * sub);
      step(4 * q + sub, codes, scale);
    }
  };
  int64_t q = 0;
  for (; 16 * (q + 1) <= num_blocks; ++q) quad(std::true_type{}, q, 16);
  if (16 * q < num_blocks) quad(std::false_type{}, q, num_blocks - 16 * q);
  DZ_UNROLL(8)
  for (int t = 0; t < kTokens; ++t) y[t * y_stride + row] = _mm512_reduce_add_ps(total[t]);
}

// One row at a time: one sequential DRAM stream (4 interleaved rows ran at 5.3 GB/s, one at 7.7,
// before the far prefetch; 2 rows with it measured 10–30 % slower on Zen 5); the steps of a row are
// independent but for one FMA each.
template <int kTokens>
void gemv_rows(const uint8_t* packed, const uint8_t* scales, int64_t in, const uint16_t* x,
               float* y, int64_t y_stride, int64_t row_begin, int64_t row_end) {
  const int64_t x_elems = mxfp4_gemv_x_elems(in);
  for (int64_t row = row_begin; row < row_end; ++row)
    gemv_row<kTokens>(packed, scales, in, x, x_elems, y, y_stride, row);
}

}  // namespace

void mxfp4_pack_x_avx512(const float* x, int64_t in, uint16_t* out) {
  // Word q · 32 + k of each 128 is element 4k + q.
  alignas(64) uint16_t words[128];
  for (int64_t g = 0; g < in; g += 128) {
    const int64_t n = in - g < 128 ? in - g : 128;
    if (n < 128)
      for (auto& w : words) w = 0;
    round_to_bf16_avx512(x + g, n, words, nullptr);
    for (int q = 0; q < 4; ++q)
      for (int k = 0; k < 32; ++k) out[g + 32 * q + k] = words[4 * k + q];
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
  const __m512i bf16_table = _mm512_load_si512(kE2m1Bf16.data());
  const int64_t row_bytes = in / 2, num_blocks = in / 32;
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* w = packed + i * row_bytes;
    const uint8_t* s = scales + i * num_blocks;
    const int64_t out_row = (i - row_begin) * in;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const int64_t offset = out_row + 32 * b;
      // The decode is light: without prefetch it waited on DRAM latency (rows follow each other,
      // so this runs into the next rows).
      if (b % 4 == 0)
        _mm_prefetch(reinterpret_cast<const char*>(w + 16 * b + kMxfp4GemvPrefetchBytes),
                     _MM_HINT_T0);
      if (out_bf16 != nullptr && s[b] >= 2 && s[b] <= 252) {
        // Dword k = byte k; k | k << 12 puts its low nibble in the low word's index bits and its
        // high nibble in the high word's, so one VPERMW gives elements 2k, 2k + 1 in order. The
        // scale goes into the exponent (docs/formats.md §6.7): every nonzero E2M1 value · 2^(E−127)
        // stays a normal BF16 for 2 ≤ E ≤ 252; zeros keep their bits (±0).
        const __m512i bytes =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * b)));
        __m512i bits = _mm512_permutexvar_epi16(
            _mm512_or_si512(bytes, _mm512_slli_epi32(bytes, 12)), bf16_table);
        const __mmask32 nonzero = _mm512_test_epi16_mask(bits, _mm512_set1_epi16(0x7FFF));
        bits = _mm512_mask_add_epi16(bits, nonzero, bits,
                                     _mm512_set1_epi16(static_cast<int16_t>((s[b] - 127) * 128)));
        _mm512_storeu_si512(out_bf16 + offset, bits);
        continue;
      }
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
