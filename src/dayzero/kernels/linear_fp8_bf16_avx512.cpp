// The FP8-block GEMV on BF16 dot products (docs/formats.md §6.4a): E4M3 codes become their exact
// BF16 values through two 128-entry byte tables (VPERMI2B gives the high and the low byte of
// |value| from the code's low 7 bits, the sign is ORed into the high byte), VPUNPCKL/HBW pair the
// bytes into words, and VDPBF16PS multiplies them with BF16 activations into FP32. Every E4M3
// value, subnormals included, is a normal BF16, so the decode is exact and needs no scale folding;
// the 128-column block scale multiplies each block's FP32 partial sum. About 5 shuffle/logic
// instructions per 64 codes, against ≈ 24 for the E4M3 → FP16 → FP32 path of
// linear_fp8_avx512.cpp, which stays for block widths that are not multiples of 64.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <cstring>

#include "dayzero/formats/codecs.h"
#include "dayzero/formats/decode_tables.h"

#include "dayzero/kernels/e4m3_bf16_avx512.h"
#include "dayzero/kernels/linear_kernels.h"

namespace dz::kernels::detail {
namespace {

// Loops over tokens must be unrolled so that the accumulators stay in registers.
#if defined(__clang__)
#define DZ_FP8_UNROLL _Pragma("unroll")
#elif defined(__GNUC__)
#define DZ_FP8_UNROLL _Pragma("GCC unroll 8")
#else
#define DZ_FP8_UNROLL
#endif

// Software prefetch: one core's DRAM stream needs requests far ahead of the decode. Each 64-byte
// line is requested into L2 32 KiB ahead and into L1 4 KiB ahead. 1 token, 1 thread, weights
// from DRAM, CPU time, on the loaded machine (runs spread by ±15 %): no prefetch 6.0–6.3 GB/s,
// L1 only 16 KiB ahead 7.1–9.7, this pair 7.3–9.5 with the best mean of three alternating rounds
// (9.2 vs 7.9; the DRAM read loop 9.9–11.9 in the same runs).
constexpr int64_t kPrefetchL1Bytes = 4096;
constexpr int64_t kPrefetchL2Bytes = 32768;

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
    DZ_FP8_UNROLL
    for (int t = 0; t < kTokens; ++t) total[t] = _mm512_setzero_ps();
    for (int64_t kb = 0; kb < num_scale_cols; ++kb) {
      const int64_t col_begin = kb * block_cols;
      const int64_t col_end = col_begin + block_cols < in ? col_begin + block_cols : in;
      __m512 acc[kSplit][kTokens];
      DZ_FP8_UNROLL
      for (int s = 0; s < kSplit; ++s) {
        DZ_FP8_UNROLL
        for (int t = 0; t < kTokens; ++t) acc[s][t] = _mm512_setzero_ps();
      }
      const auto step = [&](int64_t j, __m512i c) {
        __m512i a, b;
        decoder.decode(c, a, b);
        DZ_FP8_UNROLL
        for (int t = 0; t < kTokens; ++t) {
          const uint16_t* xt = x + t * x_elems + j;
          acc[0][t] = _mm512_dpbf16_ps(acc[0][t], as_bh(a), as_bh(_mm512_load_si512(xt)));
          acc[kSplit - 1][t] =
              _mm512_dpbf16_ps(acc[kSplit - 1][t], as_bh(b), as_bh(_mm512_load_si512(xt + 32)));
        }
      };
      int64_t j = col_begin;
      for (; j + 64 <= col_end; j += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(w + j + kPrefetchL1Bytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + j + kPrefetchL2Bytes), _MM_HINT_T1);
        step(j, _mm512_loadu_si512(w + j));
      }
      // A partial last chunk: masked-off codes load as 0 (BF16 +0) and the activations are
      // zero-padded, so they add nothing.
      if (j < col_end)
        step(j, _mm512_maskz_loadu_epi8((~uint64_t{0}) >> (64 - (col_end - j)), w + j));
      const __m512 scale = _mm512_set1_ps(scale_row[kb]);
      DZ_FP8_UNROLL
      for (int t = 0; t < kTokens; ++t) {
        const __m512 sum = kSplit == 2 ? _mm512_add_ps(acc[0][t], acc[kSplit - 1][t]) : acc[0][t];
        total[t] = _mm512_fmadd_ps(sum, scale, total[t]);
      }
    }
    DZ_FP8_UNROLL
    for (int t = 0; t < kTokens; ++t) y[t * out + i] = _mm512_reduce_add_ps(total[t]);
  }
}

}  // namespace

void fp8_dequantize_rows_bf16_vbmi(const uint8_t* codes, const float* scale_inv,
                                   const formats::Fp8BlockShape& shape, int64_t row_begin,
                                   int64_t row_end, uint16_t* out) {
  const E4m3Bf16Decoder decoder;
  const int64_t in = shape.num_cols, num_scale_cols = shape.num_scale_cols();
  // Qwords of (a, b) in element order: a holds elements 16L … 16L + 7, b 16L + 8 … 16L + 15.
  const __m512i first_idx = _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0);
  const __m512i second_idx = _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4);
  const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
  for (int64_t i = row_begin; i < row_end; ++i) {
    const uint8_t* w = codes + i * in;
    const float* scale_row = scale_inv + (i / shape.block_rows) * num_scale_cols;
    uint16_t* o = out + (i - row_begin) * in;
    for (int64_t kb = 0; kb < num_scale_cols; ++kb) {
      const int64_t col_begin = kb * shape.block_cols;
      const int64_t col_end = col_begin + shape.block_cols < in ? col_begin + shape.block_cols : in;
      uint32_t scale_bits = 0;
      std::memcpy(&scale_bits, &scale_row[kb], sizeof(scale_bits));
      const int exponent = static_cast<int>(scale_bits >> 23);
      if ((scale_bits & 0x807FFFFF) != 0 || exponent == 0) {
        // Zero or negative scales (the caller guarantees powers of two): per element, exact.
        for (int64_t j = col_begin; j < col_end; ++j)
          o[j] = formats::encode_bf16(formats::decode_e4m3(w[j]) * scale_row[kb]);
        continue;
      }
      // × 2^(exponent − 127) adds to the BF16 exponent field of every nonzero value; with
      // |exponent − 127| <= 100 (the caller's check) the result stays a normal BF16: exact.
      const __m512i shift = _mm512_set1_epi16(static_cast<int16_t>((exponent - 127) * 128));
      for (int64_t j = col_begin; j < col_end; j += 64) {
        const int64_t n = col_end - j;
        _mm_prefetch(reinterpret_cast<const char*>(w + j + kPrefetchL1Bytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(w + j + kPrefetchL2Bytes), _MM_HINT_T1);
        const __m512i c = n >= 64 ? _mm512_loadu_si512(w + j)
                                  : _mm512_maskz_loadu_epi8((~uint64_t{0}) >> (64 - n), w + j);
        __m512i a, b;
        decoder.decode(c, a, b);
        __m512i first = _mm512_permutex2var_epi64(a, first_idx, b);
        __m512i second = _mm512_permutex2var_epi64(a, second_idx, b);
        first =
            _mm512_mask_add_epi16(first, _mm512_test_epi16_mask(first, magnitude), first, shift);
        second =
            _mm512_mask_add_epi16(second, _mm512_test_epi16_mask(second, magnitude), second, shift);
        if (n >= 64) {
          _mm512_storeu_si512(o + j, first);
          _mm512_storeu_si512(o + j + 32, second);
        } else {
          const auto mask_first = n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1);
          const auto mask_second =
              n > 32 ? static_cast<__mmask32>((uint64_t{1} << (n - 32)) - 1) : __mmask32{0};
          _mm512_mask_storeu_epi16(o + j, mask_first, first);
          _mm512_mask_storeu_epi16(o + j + 32, mask_second, second);
        }
      }
    }
  }
}

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
