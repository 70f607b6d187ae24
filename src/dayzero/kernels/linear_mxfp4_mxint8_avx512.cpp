// MXFP4 weights with MXINT8 activations on AVX-512 VNNI (linear_kernels.h gives the layouts and the
// order of the sums). A group of 16 blocks is 8 vectors of 64 bytes whose dword lane j belongs to
// block j, so each token's 8 VPDPBUSD leave block j's whole integer dot product in lane j: one
// conversion and one FMA per 16 blocks, against one VDPBF16PS per 32 products and an FMA per four
// blocks on the BF16 path. E2M1 nibbles become unsigned bytes 2·value + 12 by one VPSHUFB (the
// weight bytes VPDPBUSD needs unsigned; the activations' per-block −12 · Σq, ready in the packed
// activations, starts each token's sum and removes the +12 exactly).
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Compiled with -mavx512vnni on top of the AVX-512 flags (kernels/CMakeLists.txt), this file only:
// the other AVX-512 files also run on CPUs without VNNI.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "dayzero/formats/mxint8.h"
#include "dayzero/kernels/e8m0_avx512.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels::detail {
namespace {

// 2·e2m1(code) + 12 for the 16 codes (sign in bit 3), repeated in each 128-bit lane for VPSHUFB.
alignas(64) constexpr std::array<uint8_t, 16> kE2m1Doubled = {12, 13, 14, 15, 16, 18, 20, 24,
                                                              12, 11, 10, 9,  8,  6,  4,  0};

// 2^(E−127) of 16 E8M0 codes.
inline __m512 weight_scales(__m128i codes) {
  return _mm512_castsi512_ps(e8m0_scale_bits(_mm512_slli_epi32(_mm512_cvtepu8_epi32(codes), 23)));
}

// Lane j + lane j + 8, then + 4, + 2, + 1 (linear_kernels.h's order).
inline float lanes_sum(__m512 v) {
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
  const __m128 pair = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
}

// How far ahead the weights are requested (as the BF16 GEMV's kMxfp4GemvPrefetchBytes, in weight
// bytes: one core's DRAM stream needs requests far ahead).
constexpr int64_t kPrefetchBytes = 16384;

template <int kTokens>
void gemv_row(const uint8_t* w_row, const uint8_t* s_row, int64_t num_blocks, int64_t groups,
              const std::byte* x, int64_t x_stride, float* y, int64_t y_stride, int64_t row) {
  const __m512i table =
      _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(kE2m1Doubled.data())));
  const __m512i low_nibbles = _mm512_set1_epi8(0x0F);
  __m512 total[kTokens];
  DZ_UNROLL(8)
  for (int t = 0; t < kTokens; ++t) total[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* w = w_row + g * kMxint8GroupWeightBytes;
    DZ_UNROLL(4)
    for (int k = 0; k < 4; ++k)
      _mm_prefetch(reinterpret_cast<const char*>(w + 64 * k + kPrefetchBytes), _MM_HINT_T0);
    const int64_t blocks = std::min<int64_t>(kMxint8GroupBlocks, num_blocks - 16 * g);
    const __m128i codes =
        blocks == kMxint8GroupBlocks
            ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(s_row + 16 * g))
            : _mm_maskz_loadu_epi8(static_cast<__mmask16>((1u << blocks) - 1), s_row + 16 * g);
    const __m512 w_scale = weight_scales(codes);
    __m512i wv[8];
    DZ_UNROLL(4)
    for (int k = 0; k < 4; ++k) {
      const __m512i bytes = _mm512_load_si512(w + 64 * k);
      wv[2 * k] = _mm512_shuffle_epi8(table, _mm512_and_si512(bytes, low_nibbles));
      wv[2 * k + 1] =
          _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low_nibbles));
    }
    DZ_UNROLL(8)
    for (int t = 0; t < kTokens; ++t) {
      const std::byte* xg = x + t * x_stride + g * kMxint8GroupXBytes;
      __m512i dot = _mm512_load_si512(xg + kMxint8GroupElems);
      DZ_UNROLL(8)
      for (int v = 0; v < 8; ++v)
        dot = _mm512_dpbusd_epi32(dot, wv[v], _mm512_load_si512(xg + 64 * v));
      const __m512 scale = _mm512_mul_ps(w_scale, _mm512_load_ps(xg + kMxint8GroupElems + 64));
      total[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, total[t]);
    }
  }
  DZ_UNROLL(8)
  for (int t = 0; t < kTokens; ++t) y[t * y_stride + row] = lanes_sum(total[t]);
}

template <int kTokens>
void gemv_rows(const uint8_t* vnni_packed, const uint8_t* scales, int64_t in, const std::byte* x,
               float* y, int64_t y_stride, int64_t row_begin, int64_t row_end) {
  const int64_t groups = mxint8_num_groups(in), num_blocks = in / 32;
  const int64_t row_bytes = groups * kMxint8GroupWeightBytes, x_stride = mxint8_x_bytes(in);
  for (int64_t row = row_begin; row < row_end; ++row)
    gemv_row<kTokens>(vnni_packed + row * row_bytes, scales + row * num_blocks, num_blocks, groups,
                      x, x_stride, y, y_stride, row);
}

}  // namespace

void mxint8_pack_x_avx512(const float* x, int64_t in, std::byte* out) {
  const int64_t num_blocks = in / 32;
  std::memset(out, 0, static_cast<size_t>(mxint8_x_bytes(in)));
  for (int64_t b = 0; b < num_blocks; ++b) {
    const int64_t g = b / kMxint8GroupBlocks, j = b % kMxint8GroupBlocks;
    std::byte* group = out + g * kMxint8GroupXBytes;
    auto* offsets = reinterpret_cast<int32_t*>(group + kMxint8GroupElems);
    auto* scales = reinterpret_cast<float*>(group + kMxint8GroupElems + 64);
    const __m512 lo = _mm512_loadu_ps(x + 32 * b), hi = _mm512_loadu_ps(x + 32 * b + 16);
    // NaN (quiet 0x01, signalling 0x80) or ±Inf (0x08, 0x10) anywhere: the block's scale is NaN.
    if ((_mm512_fpclass_ps_mask(lo, 0x99) | _mm512_fpclass_ps_mask(hi, 0x99)) != 0) {
      scales[j] = __builtin_nanf("");
      continue;
    }
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
    if (amax == 0.0f) continue;
    // The scale is a power of two, so multiplying by its inverse is the exact division; below
    // 2^−126 the inverse does not exist in FP32 and the reference divides.
    const int e = formats::mxint8_exponent(amax);
    const float scale = formats::mxint8_pow2(e);
    __m512i q_lo, q_hi;
    if (e >= -126) {
      const __m512 inverse = _mm512_set1_ps(formats::mxint8_pow2(-e));
      q_lo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, inverse));
      q_hi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, inverse));
    } else {
      const __m512 divisor = _mm512_set1_ps(scale);
      q_lo = _mm512_cvtps_epi32(_mm512_div_ps(lo, divisor));
      q_hi = _mm512_cvtps_epi32(_mm512_div_ps(hi, divisor));
    }
    offsets[j] = -12 * _mm512_reduce_add_epi32(_mm512_add_epi32(q_lo, q_hi));
    scales[j] = 0.5f * scale;
    // Dword v of the block (elements 4v … 4v + 3) goes to vector v, lane j.
    alignas(16) int8_t codes[32];
    _mm_store_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(q_lo));
    _mm_store_si128(reinterpret_cast<__m128i*>(codes + 16), _mm512_cvtepi32_epi8(q_hi));
    for (int v = 0; v < 8; ++v) std::memcpy(group + 64 * v + 4 * j, codes + 4 * v, 4);
  }
}

void mxfp4_mxint8_gemv_rows_avx512(const uint8_t* vnni_packed, const uint8_t* scales, int64_t in,
                                   const std::byte* x, int64_t num_tokens, float* y,
                                   int64_t y_stride, int64_t row_begin, int64_t row_end) {
  switch (num_tokens) {
    case 1:
      return gemv_rows<1>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 2:
      return gemv_rows<2>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 3:
      return gemv_rows<3>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 4:
      return gemv_rows<4>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 5:
      return gemv_rows<5>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 6:
      return gemv_rows<6>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 7:
      return gemv_rows<7>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    case 8:
      return gemv_rows<8>(vnni_packed, scales, in, x, y, y_stride, row_begin, row_end);
    default:
      __builtin_trap();
  }
}

}  // namespace dz::kernels::detail
