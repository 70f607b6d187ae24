#pragma once
// Kernels behind the FP8 block and MXFP4 linear formats (linear_fp8_block.h, linear_mxfp4.h),
// internal to kernels/. The AVX-512 variants live in linear_fp8_avx512.cpp,
// linear_fp8_bf16_avx512.cpp and linear_mxfp4_avx512.cpp; linear_ref.cpp holds the scalar oracle
// they are tested against. E4M3 is decoded exactly through FP16 (docs/formats.md §6.2 + §6.3): FP16
// bits (code & 0x80) << 8 | (code & 0x7F) << 7 hold value · 2^-8 for every finite code, and
// VCVTPH2PS widens them exactly; the 2^8 is folded back once per output (GEMV) or into the scale
// (tiles).

#include <array>
#include <cstddef>
#include <cstdint>

#include "dayzero/formats/fp8_block.h"

namespace dz::kernels::detail {

// out[e] = the BF16 code nearest x[e] (RNE, NaN → 0x7FC0, as formats::encode_bf16), and/or
// out_f32[e] = its value; either output may be null.
void round_to_bf16_avx512(const float* x, int64_t num_elems, uint16_t* out, float* out_f32);

// Most tokens one GEMV pass keeps in registers; more are done in passes of this many.
inline constexpr int64_t kFp8GemvMaxTokens = 8;

// Tokens per pass of a GEMV kernel below (at most max_tokens). Each weight row re-reads every
// activation of the pass, so those activations, with the weights the kernel prefetches into L1
// ahead of itself, must fit the L1 data cache, or each row evicts what the next one reads. Budget:
// L1D − l1_prefetch_bytes − 1 KiB (the row's scales, outputs and stack). Measured on AMD Zen 5
// (48 KiB L1D), 1 thread, weights from DRAM: MXFP4 [3072, 3584] 8 tokens in one pass 1.51 ms, in
// 4 + 4 1.02 ms; FP8 [2048, 7168] 4 tokens 1.54 ms, 2 + 2 1.15 ms, 8 tokens 2.59 ms, 3 + 3 + 2
// 1.98 ms (docs/performance.md).
int64_t gemv_tokens_per_pass(int64_t x_bytes_per_token, int64_t l1_prefetch_bytes,
                             int64_t max_tokens);
// Calls pass(first_token, count) for passes of at most tokens_per_pass covering num_tokens, as
// even as possible (8 tokens at most 3 per pass: 3 + 3 + 2).
template <class Pass>
void for_each_token_pass(int64_t num_tokens, int64_t tokens_per_pass, Pass&& pass) {
  const int64_t num_passes = (num_tokens + tokens_per_pass - 1) / tokens_per_pass;
  for (int64_t p = 0, first = 0; p < num_passes; ++p) {
    const int64_t count = (num_tokens - first) / (num_passes - p);
    pass(first, count);
    first += count;
  }
}

// y[t, i] = Σ_j x[t, j] · W[i, j] for output rows i in [row_begin, row_end), W[i, j] =
// decode(codes[i, j]) · scale_inv[i / block_rows, j / block_cols]. x [num_tokens, in] must already
// hold BF16-valued floats; y is [num_tokens, out]. FP32 FMAs within a column block, the block's
// sum times its scale added to an FP32 total. num_tokens <= kFp8GemvMaxTokens.
void fp8_gemv_rows_avx512(const uint8_t* codes, const float* scale_inv,
                          const formats::Fp8BlockShape& shape, const float* x, int64_t num_tokens,
                          float* y, int64_t row_begin, int64_t row_end);

// The BF16 variant (linear_fp8_bf16_avx512.cpp, AVX-512 VBMI + BF16; docs/formats.md §6.4a): codes
// decoded exactly to BF16 by VPERMI2B byte tables, VDPBF16PS against BF16 activations, FP32
// partial sum per column block times its scale. Needs block_cols % 64 == 0 (a 64-code load never
// straddles two blocks). Activation layout: per 64 elements two halves of 32 BF16 codes, word
// 8L + k of half h being element 16L + 8h + k (L < 4, k < 8: the order VPUNPCKL/HBW leave the
// decoded words in); a partial last 64 is zero-padded. One token takes fp8_gemv_x_elems(in) codes.
inline int64_t fp8_gemv_x_elems(int64_t in) {
  return (in + 63) / 64 * 64;
}
inline bool fp8_bf16_gemv_takes(const formats::Fp8BlockShape& shape) {
  return shape.block_cols % 64 == 0;
}
// The BF16 GEMV requests each line of codes into L2 this far ahead and into L1 this far ahead
// (one core's DRAM stream needs requests far ahead of the decode).
inline constexpr int64_t kFp8GemvPrefetchL2Bytes = 32768;
inline constexpr int64_t kFp8GemvPrefetchL1Bytes = 4096;
// out [fp8_gemv_x_elems(in)] = x [in] rounded to BF16 (RNE) in that layout.
void fp8_pack_x_avx512(const float* x, int64_t in, uint16_t* out);
// y[t, i] for rows [row_begin, row_end) as fp8_gemv_rows_avx512, x in the layout above (tokens
// fp8_gemv_x_elems(in) apart, 64-byte aligned). num_tokens <= kFp8GemvMaxTokens.
void fp8_gemv_bf16_rows_avx512(const uint8_t* codes, const float* scale_inv,
                               const formats::Fp8BlockShape& shape, const uint16_t* x,
                               int64_t num_tokens, float* y, int64_t row_begin, int64_t row_end);

// Activations for the FP8 GEMMs (fp8_pack_x_tiles, linear_fp8_bf16_avx512.cpp): per tile of 16
// tokens, fp8_x_tile_chunks(in) chunks of 512 words, row r of chunk c holding for each token n
// the pair of words 2r, 2r + 1 of chunk c (32 words) of that token's fp8_pack_x_avx512 layout
// (tokens past num_tokens zero). It is an AMX B tile per chunk, and for VDPBF16PS one vector of
// the 16 tokens' pairs per row.
inline int64_t fp8_x_tile_chunks(int64_t in) {
  return fp8_gemv_x_elems(in) / 32;
}
inline int64_t fp8_x_tile_words(int64_t in, int64_t num_tokens) {
  return (num_tokens + 15) / 16 * fp8_x_tile_chunks(in) * 512;
}
// Token tiles [tile_begin, tile_end) of x [num_tokens, in] into `out` (fp8_x_tile_words in all).
void fp8_pack_x_tiles(const float* x, int64_t in, int64_t num_tokens, int64_t tile_begin,
                      int64_t tile_end, uint16_t* out);

// The FP8 GEMMs, any finite block scales, fp8_bf16_gemv_takes(shape): the same sums as
// fp8_gemv_bf16_rows_avx512 (exact BF16 products, FP32 sum per column block times its scale),
// activations xb packed by fp8_pack_x_tiles; y [num_tokens, out] for the output rows of groups
// [group_begin, group_end) of 16 rows. On AMX tiles (linear_fp8_amx_avx512.cpp, AMX-BF16 + VBMI;
// the decoded weights as the A operand), or on VDPBF16PS (linear_fp8_bf16_avx512.cpp, VBMI + BF16:
// CPUs without AMX; the 16 tokens of a tile are the vector lanes, each decoded weight pair is
// broadcast).
void fp8_amx_gemm_groups(const uint8_t* codes, const float* scale_inv,
                         const formats::Fp8BlockShape& shape, const uint16_t* xb,
                         int64_t num_tokens, float* y, int64_t group_begin, int64_t group_end);
void fp8_bf16_gemm_groups(const uint8_t* codes, const float* scale_inv,
                          const formats::Fp8BlockShape& shape, const uint16_t* xb,
                          int64_t num_tokens, float* y, int64_t group_begin, int64_t group_end);

// Rows [row_begin, row_end) of W, dequantized into out [row_end − row_begin, in] row-major, as
// BF16 codes (only exact when every scale of those rows is a power of two: the caller checks) or
// as FP32. Both equal formats::dequantize_fp8_block value for value.
void fp8_dequantize_rows_bf16_avx512(const uint8_t* codes, const float* scale_inv,
                                     const formats::Fp8BlockShape& shape, int64_t row_begin,
                                     int64_t row_end, uint16_t* out);
void fp8_dequantize_rows_f32_avx512(const uint8_t* codes, const float* scale_inv,
                                    const formats::Fp8BlockShape& shape, int64_t row_begin,
                                    int64_t row_end, float* out);

// MXFP4 (docs/formats.md §3.4): packed [out, in/2] E2M1 nibbles (element 2b in the low nibble of
// byte b), scales [out, in/32] E8M0 codes (never 0xFF: the loader refuses them), in % 32 == 0.
// Kernels in linear_mxfp4_avx512.cpp (AVX-512 BW + BF16).

// BF16 bits of the 16 E2M1 codes (docs/formats.md §1.3), twice: VPERMW reads 5 index bits, so the
// bit above a nibble may be anything.
alignas(64) inline constexpr std::array<uint16_t, 32> kE2m1Bf16 = {
    0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80,
    0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0, 0x0000, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4040,
    0x4080, 0x40C0, 0x8000, 0xBF00, 0xBF80, 0xBFC0, 0xC000, 0xC040, 0xC080, 0xC0C0};

// Most tokens one GEMV pass keeps in registers.
inline constexpr int64_t kMxfp4GemvMaxTokens = 8;
// The GEMV and the tile dequantization request each line of weights into L1 this far ahead (the
// GEMV's own rate is barely above one core's DRAM rate, so memory must be requested far ahead to
// overlap: measured on a [3072, 3584] set, 256 B ahead gave 5.3 GB/s, 4 KiB 8.5, 16 KiB 9.0,
// 32 KiB no better).
inline constexpr int64_t kMxfp4GemvPrefetchBytes = 16384;

// The GEMV's activation layout: per 128 elements (four blocks), BF16 codes in four parts of 32,
// word k of part q being element 4k + q; a partial last 128 is zero-padded. One token takes
// mxfp4_gemv_x_elems(in) codes (64-byte aligned when the buffer is).
inline int64_t mxfp4_gemv_x_elems(int64_t in) {
  return (in + 127) / 128 * 128;
}
// out [mxfp4_gemv_x_elems(in)] = x [in] rounded to BF16 (RNE) in that layout.
void mxfp4_pack_x_avx512(const float* x, int64_t in, uint16_t* out);

// y[t · y_stride + i] = Σ_j bf16(x)[t, j] · W[i, j] for rows i in [row_begin, row_end), x in the
// layout above (tokens mxfp4_gemv_x_elems(in) apart, 64-byte aligned). Per block: VDPBF16PS
// products (exact; pairs added with separate roundings) then × 2^(E−127) in FP32, FMA into an FP32
// total. num_tokens <= kMxfp4GemvMaxTokens.
void mxfp4_gemv_rows_avx512(const uint8_t* packed, const uint8_t* scales, int64_t in,
                            const uint16_t* x, int64_t num_tokens, float* y, int64_t y_stride,
                            int64_t row_begin, int64_t row_end);

// Rows [row_begin, row_end) of W dequantized into [row_end − row_begin, in] row-major, as BF16
// codes (out_bf16) or FP32 (out_f32; exactly one is non-null). Both are exact: every value
// E2M1 · 2^(E−127) has two significant bits (BF16 subnormals for codes 0 and 1, which BF16 GEMMs
// may flush: the caller uses FP32 tiles for rows that have them).
void mxfp4_dequantize_rows_avx512(const uint8_t* packed, const uint8_t* scales, int64_t in,
                                  int64_t row_begin, int64_t row_end, uint16_t* out_bf16,
                                  float* out_f32);

// The AMX kernels (linear_mxfp4_amx_avx512.cpp) over the layout of mxfp4_amx_layout.h, for the
// row groups [group_begin, group_end); x is BF16 [tokens, in] row-major, y[t · y_stride + i].
// The GEMV: num_tokens <= kMxfp4AmxGemvMaxTokens; each block's product scaled in FP32 (every scale
// code).
inline constexpr int64_t kMxfp4AmxGemvMaxTokens = 16;
void mxfp4_amx_gemv_groups(const uint8_t* packed, const uint8_t* scales, int64_t in, int64_t out,
                           const uint16_t* x, int64_t num_tokens, float* y, int64_t y_stride,
                           int64_t group_begin, int64_t group_end);
// The folded GEMV: num_tokens <= kMxfp4AmxGemvMaxTokens, scales folded into the BF16 values (every
// block holding a nonzero element must have a scale code in [2, 252]).
void mxfp4_amx_gemv_folded_groups(const uint8_t* packed, const uint8_t* scales, int64_t in,
                                  int64_t out, const uint16_t* x, int64_t num_tokens, float* y,
                                  int64_t y_stride, int64_t group_begin, int64_t group_end);
// The GEMM: any token count, x zero-padded to a multiple of 16 rows; the scales folded into the
// BF16 values, so every block holding a nonzero element must have a scale code in [2, 252].
void mxfp4_amx_gemm_groups(const uint8_t* packed, const uint8_t* scales, int64_t in, int64_t out,
                           const uint16_t* x, int64_t num_tokens, float* y, int64_t y_stride,
                           int64_t group_begin, int64_t group_end);

// MXFP4 weights with MXINT8 activations (formats/mxint8.h), the 8-bit mode of linear_mxfp4.h: on
// AVX-512 VNNI (linear_mxfp4_mxint8_avx512.cpp) and in linear_mxfp4_mxint8_ref (linear_ref.h),
// which give the same bits. Per 32-block b of a row and token, with weight scale code E_b and
// activation codes q and scale s_b: S_b = Σ 2·e2m1_i · q_i (exact in int32: |S_b| ≤ 32 · 12 · 127)
// and term_b = fl(S_b) · fl(2^(E_b−127) · s_b/2) (s_b/2 undoes the doubled weights; the product of
// two powers of two is exact unless it leaves the FP32 range). The output adds the terms in 16
// lanes, lane j taking blocks j, 16 + j, 32 + j, … by FMA in that order, then the lanes pairwise
// (lane j plus lane j + 8, then + 4, + 2, + 1). The order depends on nothing but `in`, so a token
// gets the same bits at every token count.
inline constexpr int64_t kMxint8GroupBlocks = 16;  // one lane per block: 512 elements per group
inline constexpr int64_t kMxint8GroupElems = kMxint8GroupBlocks * 32;
inline int64_t mxint8_num_groups(int64_t in) {
  return (in + kMxint8GroupElems - 1) / kMxint8GroupElems;
}
// Weights (mxfp4_vnni_repack): per row and group 256 bytes; the low nibbles of bytes 64k … 64k + 63
// are vector 2k, the high nibbles vector 2k + 1, and byte 4j + i of vector v holds element
// 32j + 4v + i of the group (block j in dword lane j). A partial last group is padded with code 0.
inline constexpr int64_t kMxint8GroupWeightBytes = kMxint8GroupElems / 2;
// Where element `col` of a row sits in that layout: byte offset in the row, nibble shift (0 or 4).
struct Mxfp4VnniNibble {
  int64_t byte;
  int shift;
};
inline Mxfp4VnniNibble mxfp4_vnni_nibble(int64_t col) {
  const int64_t group = col / kMxint8GroupElems, r = col % kMxint8GroupElems;
  const int64_t v = (r % 32) / 4;
  return {group * kMxint8GroupWeightBytes + 64 * (v / 2) + 4 * (r / 32) + r % 4,
          static_cast<int>(4 * (v % 2))};
}
// One row of packed [in/2] nibbles (linear_mxfp4.h's order) into that layout
// (mxint8_num_groups(in) · 256 bytes).
void mxfp4_vnni_repack_row(const uint8_t* packed_row, int64_t in, uint8_t* out);
// Activations (mxint8_pack_x_avx512): per token and group, the 512 code bytes in the weights'
// order (int8, vector v byte 4j + i = element 32j + 4v + i), then 16 int32 offsets −12 · Σ_i q_i of
// block j (VPDPBUSD takes the weights unsigned as 2·e2m1 + 12), then 16 FP32 s_j/2; padding blocks
// have codes, offsets and scales 0.
inline constexpr int64_t kMxint8GroupXBytes = kMxint8GroupElems + 2 * 64;
inline int64_t mxint8_x_bytes(int64_t in) {
  return mxint8_num_groups(in) * kMxint8GroupXBytes;
}
// out [mxint8_x_bytes(in)], 64-byte aligned = x [in] quantized (formats::quantize_mxint8_block per
// block) in that layout.
void mxint8_pack_x_avx512(const float* x, int64_t in, std::byte* out);
// Most tokens one pass keeps in registers.
inline constexpr int64_t kMxint8GemvMaxTokens = 8;
// y[t · y_stride + i] for rows i in [row_begin, row_end) of the repacked weight, x packed as above
// (tokens mxint8_x_bytes(in) apart), scales [out, in/32] E8M0 as stored.
// num_tokens <= kMxint8GemvMaxTokens.
void mxfp4_mxint8_gemv_rows_avx512(const uint8_t* vnni_packed, const uint8_t* scales, int64_t in,
                                   const std::byte* x, int64_t num_tokens, float* y,
                                   int64_t y_stride, int64_t row_begin, int64_t row_end);

}  // namespace dz::kernels::detail
