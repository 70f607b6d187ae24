// The absorbed MLA split on AVX-512 and AMX (mla_attention_vec.h): one tile of records is decoded
// (exactly, to BF16) once and serves every head, so each record byte read feeds H heads' products.
// Two splits: FP32 FMAs on AVX-512, BF16 tile products on AMX (below, each with its loop shape).
//
// Tile columns are the record's channels in the decoder's order (e4m3_bf16_avx512.h: a 64-code
// block comes out as a then b, lane by lane); q is packed in the same column order and the
// accumulators are put back in channel order once per split, so no shuffle fixes the order
// inside the loops.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/amx_tiles.h"
#include "dayzero/kernels/bf16_avx512.h"
#include "dayzero/kernels/e4m3_bf16_avx512.h"
#include "dayzero/kernels/exp_avx512.h"
#include "dayzero/kernels/mla_attention_vec.h"
#include "dayzero/kernels/transpose_avx512.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels::detail {
namespace {

constexpr int64_t kChunk = 32;     // BF16 channels per vector
constexpr int64_t kFp8Tile = 128;  // channels per FP8 scale (docs/formats.md §5.2)
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Typed arrays one after another, 64-aligned, in the caller's scratch: a layout walked once with
// no base counts the bytes, walked again with the scratch hands out the pointers.
class ScratchLayout {
 public:
  explicit ScratchLayout(std::span<std::byte> scratch = {}) : scratch_(scratch) {}
  template <typename T>
  T* take(int64_t num_elems) {
    const size_t offset = used_;
    used_ += (static_cast<size_t>(num_elems) * sizeof(T) + 63) / 64 * 64;
    if (scratch_.data() == nullptr) return nullptr;
    DZ_CHECK(used_ <= scratch_.size(), "MLA split scratch of {} bytes is too small",
             scratch_.size());
    return reinterpret_cast<T*>(scratch_.data() + offset);
  }
  size_t used() const { return used_; }

 private:
  std::span<std::byte> scratch_;
  size_t used_ = 0;
};

// Scratch bytes of a split whose arrays S::lay_out takes.
template <typename S, typename... Args>
size_t scratch_bytes_of(const Args&... args) {
  ScratchLayout layout;
  S s;
  s.lay_out(layout, args...);
  return layout.used();
}

struct Dims {
  int64_t r_kv, d_r, width;
  int64_t padded_width;   // columns of a tile row, a multiple of kChunk
  int64_t padded_latent;  // accumulator columns per head, a multiple of kChunk
};

Dims dims_of(const MlaCacheLayout& layout) {
  const int64_t width = layout.latent_dim + layout.rope_dim;
  return {.r_kv = layout.latent_dim,
          .d_r = layout.rope_dim,
          .width = width,
          .padded_width = round_up(width, kChunk),
          .padded_latent = round_up(layout.latent_dim, kChunk)};
}

// Channel of tile column j. FP8 latent: within each 64-code block the decoder's order (word j of
// the block holds code 16·L + 8·half + k for half = j / 32, lane L = j % 32 / 8, k = j % 8); the
// rope part and BF16 records keep their order.
void fill_column_channels(const MlaCacheLayout& layout, const Dims& d, int32_t* column_channel) {
  for (int64_t j = 0; j < d.padded_width; ++j) {
    int64_t channel = j < d.width ? j : -1;
    if (layout.dtype == KvCacheDtype::kFp8 && j < d.r_kv) {
      const int64_t block = j / 64, w = j % 64;
      channel = block * 64 + 16 * (w % 32 / 8) + 8 * (w / 32) + w % 8;
    }
    column_channel[j] = static_cast<int32_t>(channel);
  }
}

// Accumulator element e of a kChunk-column chunk ↔ its tile column within the chunk: the value
// product interleaves two records per lane (VPUNPCKLWD gives columns 8L…8L+3 of lane L, VPUNPCKHWD
// columns 8L+4…8L+7), the low half's results go to elements 0…15, the high half's to 16…31.
int64_t accumulator_column(int64_t e) {
  const int64_t half = e / 16, lane = e % 16 / 4, k = e % 4;
  return 8 * lane + 4 * half + k;
}

// One record into a tile row: FP8 codes through the byte tables, each 128-code tile's power-of-two
// scale added to the BF16 exponents (exact while the results stay normal; other scales take the
// scalar decode), k_pe copied; padding columns zero.
void decode_record(const MlaCacheLayout& layout, const Dims& d, const std::byte* record,
                   const E4m3Bf16Decoder& decoder, const int32_t* column_channel, uint16_t* row) {
  if (layout.dtype == KvCacheDtype::kBf16) {
    std::memcpy(row, record, static_cast<size_t>(d.width) * 2);
  } else {
    const std::byte* scales = record + d.r_kv;
    for (int64_t t = 0; t < d.r_kv / kFp8Tile; ++t) {
      float scale;
      std::memcpy(&scale, scales + t * 4, 4);
      uint32_t bits;
      std::memcpy(&bits, &scale, 4);
      const int exponent = static_cast<int>(bits >> 23 & 0xFF) - 127;
      // E4M3 magnitudes have BF16 exponents 118…135: stay within 1…254 after the shift.
      const bool shiftable = (bits & 0x807FFFFF) == 0 && exponent >= -117 && exponent <= 119;
      const uint8_t* codes = reinterpret_cast<const uint8_t*>(record) + t * kFp8Tile;
      uint16_t* out = row + t * kFp8Tile;
      if (!shiftable) {
        for (int64_t j = 0; j < kFp8Tile; ++j) {
          const int64_t channel = column_channel[t * kFp8Tile + j] - t * kFp8Tile;
          out[j] = formats::encode_bf16(formats::decode_e4m3(codes[channel]) * scale);
        }
        continue;
      }
      const __m512i shift = _mm512_set1_epi16(static_cast<int16_t>(exponent * 128));
      const __m512i magnitude = _mm512_set1_epi16(0x7FFF);
      const __m512i infinity = _mm512_set1_epi16(0x7F80);
      for (int64_t half = 0; half < kFp8Tile; half += 64) {
        __m512i a, b;
        decoder.decode(_mm512_loadu_si512(codes + half), a, b);
        for (__m512i* v : {&a, &b}) {
          const __m512i mag = _mm512_and_si512(*v, magnitude);
          const __mmask32 finite_nonzero =
              _mm512_test_epi16_mask(mag, mag) & _mm512_cmplt_epu16_mask(mag, infinity);
          *v = _mm512_mask_add_epi16(*v, finite_nonzero, *v, shift);
        }
        _mm512_storeu_si512(out + half, a);
        _mm512_storeu_si512(out + half + 32, b);
      }
    }
    std::memcpy(row + d.r_kv, scales + d.r_kv / kFp8Tile * 4, static_cast<size_t>(d.d_r) * 2);
  }
  std::fill(row + d.width, row + d.padded_width, uint16_t{0});
}

// The accumulators [padded_heads, padded_latent] (accumulator order) into split.acc, channel order.
void write_accumulators(const Dims& d, const float* acc, const int32_t* column_channel,
                        const MlaSplit& split) {
  for (int64_t h = 0; h < split.num_heads; ++h)
    for (int64_t c = 0; c < d.padded_latent; c += kChunk)
      for (int64_t e = 0; e < kChunk; ++e) {
        const int32_t channel = column_channel[c + accumulator_column(e)];
        if (channel >= 0 && channel < d.r_kv)
          split.acc[h * d.r_kv + channel] = acc[h * d.padded_latent + c + e];
      }
}

constexpr int kProbTerms = 3;  // BF16 terms of a probability

// Head h's q in tile column order as three BF16 terms hi + mid + lo (|q − hi − mid − lo| ≤
// 2^-24·|q|), rows [3][padded_width]; padding
// columns and heads past the split's are zero.
void q_term_rows(const MlaSplit& split, const Dims& d, const int32_t* column_channel, int64_t h,
                 uint16_t* rows) {
  const int64_t w = d.padded_width;
  alignas(64) float q[16];
  for (int64_t c = 0; c < w; c += 16) {
    for (int64_t e = 0; e < 16; ++e)
      q[e] = h < split.num_heads && c + e < d.width
                 ? split.q_cat[h * d.width + column_channel[c + e]]
                 : 0.0f;
    __m512 rest = _mm512_load_ps(q);
    for (int t = 0; t < 3; ++t) {
      const __m256i term = encode_bf16_16(rest);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(rows + t * w + c), term);
      rest = _mm512_sub_ps(rest, decode_bf16_16(term));
    }
  }
}

// The kProbTerms BF16 terms of 32 FP32 values (keys 0…15 in a, 16…31 in b), in order.
inline void split_bf16_32(__m512 a, __m512 b, __m512i (&terms)[kProbTerms]) {
  for (int t = 0; t < kProbTerms; ++t) {
    terms[t] = (__m512i)_mm512_cvtne2ps_pbh(b, a);
    if (t + 1 == kProbTerms) break;
    a = _mm512_sub_ps(a, _mm512_castsi512_ps(_mm512_slli_epi32(
                             _mm512_cvtepu16_epi32(_mm512_castsi512_si256(terms[t])), 16)));
    b = _mm512_sub_ps(b, _mm512_castsi512_ps(_mm512_slli_epi32(
                             _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(terms[t], 1)), 16)));
  }
}

// exp(m_old − m_new) per lane: 0 where no key was seen yet (m_old = −inf), 1 where the maximum
// stayed.
inline __m512 softmax_correction(__m512 m_old, __m512 m_new) {
  const __mmask16 moved = _mm512_cmp_ps_mask(m_new, m_old, _CMP_NEQ_OQ);
  const __mmask16 seen = _mm512_cmp_ps_mask(m_old, _mm512_set1_ps(kNegInf), _CMP_NEQ_OQ);
  return _mm512_maskz_mov_ps(
      seen, _mm512_mask_blend_ps(moved, _mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(m_old, m_new))));
}

// acc[h] *= factor[h] for the heads whose factor is not 1.
void rescale_rows(float* acc, int64_t row_stride, int64_t num_rows, const float* factor) {
  for (int64_t h = 0; h < num_rows; ++h) {
    if (factor[h] == 1.0f) continue;
    float* row = acc + h * row_stride;
    const __m512 f = _mm512_set1_ps(factor[h]);
    for (int64_t j = 0; j < row_stride; j += 16)
      _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), f));
  }
}

// Gathers the next tile of up to max_keys valid keys from entry *j on, decoded into tile rows;
// rows from the last key up to a multiple of `zero_to` are zeroed. Returns the number of keys.
int64_t gather_tile(const MlaSplit& split, const Dims& d, const E4m3Bf16Decoder& decoder,
                    const int32_t* column_channel, int64_t max_keys, int64_t zero_to, int64_t& j,
                    uint16_t* tile) {
  const MlaCacheView& cache = *split.cache;
  const int64_t record_bytes = cache.layout.record_bytes();
  int64_t num_keys = 0;
  for (; j < split.entry_end && num_keys < max_keys; ++j) {
    const int32_t pos = mla_key_entry(*split.keys, split.query, j);
    if (pos < 0) continue;
    decode_record(cache.layout, d, cache.pool + mla_slot_of_position(cache, pos) * record_bytes,
                  decoder, column_channel, tile + num_keys * d.padded_width);
    ++num_keys;
  }
  std::fill(tile + num_keys * d.padded_width, tile + round_up(num_keys, zero_to) * d.padded_width,
            uint16_t{0});
  return num_keys;
}

// ---- The split on AVX-512 FP32 FMAs -------------------------------------------------------------
//
// CPUs without AMX: FP32 products (VDPBF16PS would need three BF16 terms per factor for FP32
// accuracy, slower than FP32 FMAs on every AVX-512 CPU we run on), every head against each tile:
//   scores  S[h, k] = q_h · r_k: 16 heads in the vector lanes (q transposed), each record value
//           broadcast into one FMA per key of the tile, then one 16 × 16 transpose;
//   values  acc_h += Σ_k P[h, k] r_k(c_kv): 8 heads × 32 columns per register block, the
//           probability broadcast.

constexpr int64_t kFp32Keys = 16;    // records per tile: 16 × 576 FP32 stay in L1
constexpr int64_t kHeadBlock = 8;    // heads per register block of the value product
constexpr int64_t kScoreHeads = 16;  // heads per vector of the scores
// Channels each lane of a score sums in order before the partial sums are added: an FP32 error
// of ≈ 2^-24·(√64 + √(width/64)) relative, as small as a reduction tree's.
constexpr int64_t kScoreChunk = 64;

struct Fp32Scratch {
  int64_t padded_heads = 0;  // a multiple of kScoreHeads (and so of kHeadBlock)
  float* q;                  // [padded_width, padded_heads]: column-major, tile column order
  uint16_t* row;             // [padded_width] one record in BF16
  float* tile;               // [kFp32Keys, padded_width] records
  float* scores;             // [padded_heads, kFp32Keys]
  float* acc;                // [padded_heads, padded_latent], tile column order
  int32_t* column_channel;   // [padded_width] channel of each tile column, −1 padding

  void lay_out(ScratchLayout& layout, const Dims& d, int64_t num_heads) {
    padded_heads = round_up(num_heads, kScoreHeads);
    q = layout.take<float>(padded_heads * d.padded_width);
    row = layout.take<uint16_t>(d.padded_width);
    tile = layout.take<float>(kFp32Keys * d.padded_width);
    scores = layout.take<float>(padded_heads * kFp32Keys);
    acc = layout.take<float>(padded_heads * d.padded_latent);
    column_channel = layout.take<int32_t>(d.padded_width);
  }
};

// The next tile of up to kFp32Keys valid keys as FP32 rows (through the exact BF16 decode);
// the rows past the last key are zero.
int64_t gather_fp32_tile(const MlaSplit& split, const Dims& d, const E4m3Bf16Decoder& decoder,
                         const Fp32Scratch& s, int64_t& j) {
  const MlaCacheView& cache = *split.cache;
  const int64_t record_bytes = cache.layout.record_bytes(), w = d.padded_width;
  int64_t num_keys = 0;
  for (; j < split.entry_end && num_keys < kFp32Keys; ++j) {
    const int32_t pos = mla_key_entry(*split.keys, split.query, j);
    if (pos < 0) continue;
    const std::byte* record = cache.pool + mla_slot_of_position(cache, pos) * record_bytes;
    // A BF16 record is the row already: widened straight from the pool, no copy in between.
    const uint16_t* row = reinterpret_cast<const uint16_t*>(record);
    if (cache.layout.dtype != KvCacheDtype::kBf16 || w != d.width) {
      decode_record(cache.layout, d, record, decoder, s.column_channel, s.row);
      row = s.row;
    }
    float* out = s.tile + num_keys * w;
    for (int64_t c = 0; c < w; c += 16)
      _mm512_storeu_ps(
          out + c,
          _mm512_castsi512_ps(_mm512_slli_epi32(
              _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + c))),
              16)));
    ++num_keys;
  }
  std::fill(s.tile + num_keys * w, s.tile + kFp32Keys * w, 0.0f);
  return num_keys;
}

// Every key of the tile (the rows past the last one are zero) against every head: each q and record
// value is loaded once per block of 16 heads, and no sum crosses lanes until the transpose.
void fp32_scores(const Dims& d, const Fp32Scratch& s) {
  const int64_t w = d.padded_width;
  for (int64_t h0 = 0; h0 < s.padded_heads; h0 += kScoreHeads) {
    alignas(64) float sums[kFp32Keys][kScoreHeads] = {};  // [key][head]
    for (int64_t c0 = 0; c0 < w; c0 += kScoreChunk) {
      const int64_t c1 = std::min(c0 + kScoreChunk, w);
      __m512 acc[kFp32Keys];
      DZ_UNROLL(16)
      for (int k = 0; k < kFp32Keys; ++k) acc[k] = _mm512_setzero_ps();
      for (int64_t c = c0; c < c1; ++c) {
        const __m512 qv = _mm512_load_ps(s.q + c * s.padded_heads + h0);
        DZ_UNROLL(16)
        for (int k = 0; k < kFp32Keys; ++k)
          acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(s.tile[k * w + c]), qv, acc[k]);
      }
      DZ_UNROLL(16)
      for (int k = 0; k < kFp32Keys; ++k)
        _mm512_store_ps(sums[k], _mm512_add_ps(_mm512_load_ps(sums[k]), acc[k]));
    }
    transpose16(&sums[0][0], kScoreHeads, s.scores + h0 * kFp32Keys, kFp32Keys);
  }
}

// Online softmax of one tile for every real head; an accumulator whose maximum moved is rescaled.
// The probabilities overwrite the scores.
void fp32_softmax(const Dims& d, const Fp32Scratch& s, const MlaSplit& split, int64_t num_keys) {
  const __m512 scale = _mm512_set1_ps(split.softmax_scale);
  const __mmask16 valid = static_cast<__mmask16>((1u << num_keys) - 1);
  for (int64_t h = 0; h < split.num_heads; ++h) {
    float* row = s.scores + h * kFp32Keys;
    const __m512 sc =
        _mm512_mask_mul_ps(_mm512_set1_ps(kNegInf), valid, _mm512_loadu_ps(row), scale);
    const float m_new = std::max(split.m[h], _mm512_reduce_max_ps(sc));
    const float correction = std::exp(split.m[h] - m_new);  // 0 on the first tile (m = −inf)
    const __m512 p = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(sc, _mm512_set1_ps(m_new))));
    _mm512_storeu_ps(row, p);
    split.l[h] = split.l[h] * correction + _mm512_reduce_add_ps(p);
    split.m[h] = m_new;
    if (correction != 1.0f)
      rescale_rows(s.acc + h * d.padded_latent, d.padded_latent, 1, &correction);
  }
}

void fp32_values(const Dims& d, const Fp32Scratch& s, int64_t num_keys) {
  const int64_t w = d.padded_width;
  for (int64_t h0 = 0; h0 < s.padded_heads; h0 += kHeadBlock) {
    for (int64_t c = 0; c < d.padded_latent; c += kChunk) {
      __m512 lo[kHeadBlock], hi[kHeadBlock];
      for (int64_t i = 0; i < kHeadBlock; ++i) {
        lo[i] = _mm512_loadu_ps(s.acc + (h0 + i) * d.padded_latent + c);
        hi[i] = _mm512_loadu_ps(s.acc + (h0 + i) * d.padded_latent + c + 16);
      }
      for (int64_t k = 0; k < num_keys; ++k) {
        const __m512 r_lo = _mm512_loadu_ps(s.tile + k * w + c);
        const __m512 r_hi = _mm512_loadu_ps(s.tile + k * w + c + 16);
#pragma GCC unroll 8
        for (int64_t i = 0; i < kHeadBlock; ++i) {
          const __m512 p = _mm512_set1_ps(s.scores[(h0 + i) * kFp32Keys + k]);
          lo[i] = _mm512_fmadd_ps(p, r_lo, lo[i]);
          hi[i] = _mm512_fmadd_ps(p, r_hi, hi[i]);
        }
      }
      for (int64_t i = 0; i < kHeadBlock; ++i) {
        _mm512_storeu_ps(s.acc + (h0 + i) * d.padded_latent + c, lo[i]);
        _mm512_storeu_ps(s.acc + (h0 + i) * d.padded_latent + c + 16, hi[i]);
      }
    }
  }
}

// ---- The split on AMX tiles --------------------------------------------------------------------
//
// FP32 accuracy from BF16 products: a record is exact in BF16 (E4M3 codes times a power of two;
// k_pe and BF16 caches are BF16), so only the other factor is split into BF16 terms, each
// multiplied with the exact record: q = q_hi + q_mid + q_lo and P = P_hi + P_lo + P_rest, each with
// a remainder ≤ 2^-24 relative, FP32's own rounding (two terms, 2^-16, left a 3e-6 error that
// flipped BF16 roundings downstream and made decode disagree with prefill).
//
// Per block of 16 heads and tile of kAmxKeys records:
//   scores  Sᵀ[key, head] = R · Qᵀ: A = the record rows as decoded (16 keys × 32 columns), B = q of
//           the 16 heads as column pairs (packed once per split), one C tile per 16 keys;
//   softmax over keys with 16 heads per vector (the rows of Sᵀ), the probabilities' terms turned
//           into A tiles [head, key] by a 16 × 16 transpose of key pairs;
//   values  acc[head, column] += P · R: B = two records interleaved per row (VPUNPCKL/HWD, whose
//           column order accumulator_column undoes), packed once per tile for every head block;
//           the accumulators live in memory and pass through C tiles.

constexpr int64_t kAmxKeys = 64;   // records per tile: each accumulator load serves 4 products
constexpr int64_t kAmxHeads = 16;  // heads per block (tile rows / columns)
constexpr int64_t kAmxRowBytes = 64;

struct AmxScratch {
  int64_t num_blocks = 0;   // blocks of 16 heads
  uint32_t* q_hi;           // [num_blocks][padded_width / 2][16]: B tiles of the scores
  uint32_t* q_mid;          // the same, the second term
  uint32_t* q_lo;           // the same, the third
  uint16_t* tile;           // [kAmxKeys, padded_width] BF16 records
  uint16_t* value_tiles;    // [padded_latent / 32][key halves 2][lo/hi 2][16 rows][32]
  float* scores;            // [kAmxKeys][16]: Sᵀ of one head block
  uint32_t* prob_pairs;     // [kAmxKeys / 2][16]: (P[2p], P[2p + 1]) per head, one term
  uint16_t* prob_tiles;     // [kProbTerms][key halves 2][16 heads][32 keys]: A tiles of values
  float* acc;               // [num_blocks · 16, padded_latent], accumulator order
  float* m;                 // [num_blocks · 16]
  float* l;                 // [num_blocks · 16]
  int32_t* column_channel;  // [padded_width]

  void lay_out(ScratchLayout& layout, const Dims& d, int64_t num_heads) {
    num_blocks = round_up(num_heads, kAmxHeads) / kAmxHeads;
    const int64_t heads = num_blocks * kAmxHeads;
    q_hi = layout.take<uint32_t>(heads * d.padded_width / 2);
    q_mid = layout.take<uint32_t>(heads * d.padded_width / 2);
    q_lo = layout.take<uint32_t>(heads * d.padded_width / 2);
    tile = layout.take<uint16_t>(kAmxKeys * d.padded_width);
    value_tiles = layout.take<uint16_t>(d.padded_latent / kChunk * 4 * 16 * kChunk);
    scores = layout.take<float>(kAmxKeys * 16);
    prob_pairs = layout.take<uint32_t>(kAmxKeys / 2 * 16);
    prob_tiles = layout.take<uint16_t>(kProbTerms * 2 * 16 * 32);
    acc = layout.take<float>(heads * d.padded_latent);
    m = layout.take<float>(heads);
    l = layout.take<float>(heads);
    column_channel = layout.take<int32_t>(d.padded_width);
  }
  uint16_t* value_tile(int64_t chunk, int64_t key_half, int64_t half) const {
    return value_tiles + ((chunk * 2 + key_half) * 2 + half) * 16 * kChunk;
  }
  uint16_t* prob_tile(int64_t term, int64_t key_half) const {
    return prob_tiles + (term * 2 + key_half) * 16 * 32;
  }
};

// Records 2p and 2p + 1 interleaved, per 32-column chunk: row p of the (lo, hi) B tiles.
void pack_value_tiles(const Dims& d, const AmxScratch& s) {
  const int64_t w = d.padded_width;
  for (int64_t chunk = 0; chunk < d.padded_latent / kChunk; ++chunk)
    for (int64_t key_half = 0; key_half < 2; ++key_half)
      for (int64_t p = 0; p < 16; ++p) {
        const int64_t key = 32 * key_half + 2 * p;
        const __m512i a = _mm512_loadu_si512(s.tile + key * w + chunk * kChunk);
        const __m512i b = _mm512_loadu_si512(s.tile + (key + 1) * w + chunk * kChunk);
        _mm512_store_si512(s.value_tile(chunk, key_half, 0) + p * kChunk,
                           _mm512_unpacklo_epi16(a, b));
        _mm512_store_si512(s.value_tile(chunk, key_half, 1) + p * kChunk,
                           _mm512_unpackhi_epi16(a, b));
      }
}

__attribute__((target("amx-tile,amx-bf16"))) void amx_scores(const Dims& d, const AmxScratch& s,
                                                             int64_t block) {
  const int64_t w = d.padded_width;
  const uint32_t* q_hi = s.q_hi + block * (w / 2) * 16;
  const uint32_t* q_mid = s.q_mid + block * (w / 2) * 16;
  const uint32_t* q_lo = s.q_lo + block * (w / 2) * 16;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t c = 0; c < w; c += kChunk) {
    _tile_loadd(4, q_hi + c / 2 * 16, kAmxRowBytes);
    _tile_loadd(5, q_mid + c / 2 * 16, kAmxRowBytes);
    _tile_loadd(6, q_lo + c / 2 * 16, kAmxRowBytes);
    _tile_loadd(7, s.tile + c, w * 2);
    _tile_dpbf16ps(0, 7, 4);
    _tile_dpbf16ps(0, 7, 5);
    _tile_dpbf16ps(0, 7, 6);
    _tile_loadd(7, s.tile + 16 * w + c, w * 2);
    _tile_dpbf16ps(1, 7, 4);
    _tile_dpbf16ps(1, 7, 5);
    _tile_dpbf16ps(1, 7, 6);
    _tile_loadd(7, s.tile + 32 * w + c, w * 2);
    _tile_dpbf16ps(2, 7, 4);
    _tile_dpbf16ps(2, 7, 5);
    _tile_dpbf16ps(2, 7, 6);
    _tile_loadd(7, s.tile + 48 * w + c, w * 2);
    _tile_dpbf16ps(3, 7, 4);
    _tile_dpbf16ps(3, 7, 5);
    _tile_dpbf16ps(3, 7, 6);
  }
  _tile_stored(0, s.scores, kAmxRowBytes);
  _tile_stored(1, s.scores + 16 * 16, kAmxRowBytes);
  _tile_stored(2, s.scores + 32 * 16, kAmxRowBytes);
  _tile_stored(3, s.scores + 48 * 16, kAmxRowBytes);
}

// Online softmax of Sᵀ for the 16 heads of `block` (a vector per key); the A tiles of P.
void amx_softmax(const Dims& d, const AmxScratch& s, int64_t block, float softmax_scale,
                 int64_t num_keys) {
  const __m512 scale = _mm512_set1_ps(softmax_scale);
  float* m = s.m + block * kAmxHeads;
  float* l = s.l + block * kAmxHeads;
  __m512 tile_max = _mm512_set1_ps(kNegInf);
  for (int64_t k = 0; k < num_keys; ++k)
    tile_max = _mm512_max_ps(tile_max, _mm512_mul_ps(_mm512_load_ps(s.scores + k * 16), scale));
  const __m512 m_old = _mm512_load_ps(m);
  const __m512 m_new = _mm512_max_ps(m_old, tile_max);
  const __m512 correction = softmax_correction(m_old, m_new);
  // Word 2h of an interleaved pair holds key 2p of head h, word 2h + 1 key 2p + 1.
  const __m512i interleave =
      _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  __m512 sum = _mm512_setzero_ps();
  __m512i terms[kAmxKeys / 2][kProbTerms];
  for (int64_t p = 0; p < kAmxKeys / 2; ++p) {
    __m512 pr[2];
    for (int64_t j = 0; j < 2; ++j) {
      const int64_t k = 2 * p + j;
      pr[j] = k < num_keys ? exp_ps(_mm512_sub_ps(
                                 _mm512_mul_ps(_mm512_load_ps(s.scores + k * 16), scale), m_new))
                           : _mm512_setzero_ps();
    }
    sum = _mm512_add_ps(sum, _mm512_add_ps(pr[0], pr[1]));
    split_bf16_32(pr[0], pr[1], terms[p]);  // key 2p's 16 heads, then 2p + 1's
  }
  for (int64_t term = 0; term < kProbTerms; ++term) {
    for (int64_t p = 0; p < kAmxKeys / 2; ++p)
      _mm512_store_si512(s.prob_pairs + p * 16,
                         _mm512_permutexvar_epi16(interleave, terms[p][term]));
    for (int64_t key_half = 0; key_half < 2; ++key_half)
      transpose16(reinterpret_cast<const float*>(s.prob_pairs + key_half * 16 * 16), 16,
                  reinterpret_cast<float*>(s.prob_tile(term, key_half)), 16);
  }
  _mm512_store_ps(l, _mm512_fmadd_ps(_mm512_load_ps(l), correction, sum));
  _mm512_store_ps(m, m_new);
  alignas(64) float factor[16];
  _mm512_store_ps(factor, correction);
  rescale_rows(s.acc + block * kAmxHeads * d.padded_latent, d.padded_latent, kAmxHeads, factor);
}

__attribute__((target("amx-tile,amx-bf16"))) void amx_values(const Dims& d, const AmxScratch& s,
                                                             int64_t block) {
  const int64_t stride = d.padded_latent * 4;
  float* acc = s.acc + block * kAmxHeads * d.padded_latent;
  static_assert(kProbTerms == 3, "the tile products below take three terms");
  for (int64_t chunk = 0; chunk < d.padded_latent / kChunk; ++chunk) {
    float* lo = acc + chunk * kChunk;
    float* hi = lo + 16;
    _tile_loadd(0, lo, stride);
    _tile_loadd(1, hi, stride);
    for (int64_t key_half = 0; key_half < 2; ++key_half) {
      _tile_loadd(6, s.value_tile(chunk, key_half, 0), kAmxRowBytes);
      _tile_loadd(7, s.value_tile(chunk, key_half, 1), kAmxRowBytes);
      _tile_loadd(2, s.prob_tile(0, key_half), kAmxRowBytes);
      _tile_loadd(3, s.prob_tile(1, key_half), kAmxRowBytes);
      _tile_loadd(4, s.prob_tile(2, key_half), kAmxRowBytes);
      _tile_dpbf16ps(0, 2, 6);
      _tile_dpbf16ps(1, 2, 7);
      _tile_dpbf16ps(0, 3, 6);
      _tile_dpbf16ps(1, 3, 7);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
    }
    _tile_stored(0, lo, stride);
    _tile_stored(1, hi, stride);
  }
}

}  // namespace

size_t mla_split_fp32_scratch_bytes(const MlaCacheLayout& layout, int64_t num_heads) {
  return scratch_bytes_of<Fp32Scratch>(dims_of(layout), num_heads);
}

void mla_split_fp32_avx512(const MlaSplit& split, std::span<std::byte> scratch) {
  const MlaCacheLayout& layout = split.cache->layout;
  const Dims d = dims_of(layout);
  ScratchLayout carve(scratch);
  Fp32Scratch s;
  s.lay_out(carve, d, split.num_heads);
  const int64_t w = d.padded_width;
  fill_column_channels(layout, d, s.column_channel);
  // q transposed, in tile column order; padding heads and columns zero (their scores are never
  // used).
  std::fill_n(s.q, w * s.padded_heads, 0.0f);
  for (int64_t j = 0; j < d.width; ++j)
    for (int64_t h = 0; h < split.num_heads; ++h)
      s.q[j * s.padded_heads + h] = split.q_cat[h * d.width + s.column_channel[j]];
  std::fill_n(s.scores, s.padded_heads * kFp32Keys, 0.0f);
  std::fill_n(s.acc, s.padded_heads * d.padded_latent, 0.0f);
  std::fill_n(split.m, split.num_heads, kNegInf);
  std::fill_n(split.l, split.num_heads, 0.0f);

  const E4m3Bf16Decoder decoder;
  for (int64_t j = split.entry_begin; j < split.entry_end;) {
    const int64_t num_keys = gather_fp32_tile(split, d, decoder, s, j);
    if (num_keys == 0) continue;
    fp32_scores(d, s);
    fp32_softmax(d, s, split, num_keys);
    fp32_values(d, s, num_keys);
  }
  // The accumulators are in tile column order.
  for (int64_t h = 0; h < split.num_heads; ++h)
    for (int64_t c = 0; c < d.padded_latent; ++c) {
      const int32_t channel = s.column_channel[c];
      if (channel >= 0 && channel < d.r_kv)
        split.acc[h * d.r_kv + channel] = s.acc[h * d.padded_latent + c];
    }
}

size_t mla_split_amx_scratch_bytes(const MlaCacheLayout& layout, int64_t num_heads) {
  return scratch_bytes_of<AmxScratch>(dims_of(layout), num_heads);
}

void mla_split_amx(const MlaSplit& split, std::span<std::byte> scratch) {
  const MlaCacheLayout& layout = split.cache->layout;
  const Dims d = dims_of(layout);
  ScratchLayout carve(scratch);
  AmxScratch s;
  s.lay_out(carve, d, split.num_heads);
  const int64_t w = d.padded_width;
  fill_column_channels(layout, d, s.column_channel);
  // q as column pairs per head block (tile column order, three BF16 terms); padding zero. The
  // term rows of one head go through the record tile, free until the first gather.
  uint16_t* const term_rows = s.tile;
  for (int64_t h = 0; h < s.num_blocks * kAmxHeads; ++h) {
    q_term_rows(split, d, s.column_channel, h, term_rows);
    uint32_t* const terms[3] = {s.q_hi, s.q_mid, s.q_lo};
    for (int t = 0; t < 3; ++t)
      for (int64_t p = 0; p < w / 2; ++p) {
        uint32_t pair;
        std::memcpy(&pair, term_rows + t * w + 2 * p, 4);
        terms[t][(h / kAmxHeads * (w / 2) + p) * kAmxHeads + h % kAmxHeads] = pair;
      }
  }
  const int64_t heads = s.num_blocks * kAmxHeads;
  std::fill_n(s.acc, heads * d.padded_latent, 0.0f);
  std::fill_n(s.m, heads, kNegInf);
  std::fill_n(s.l, heads, 0.0f);

  configure_amx_tiles(8);
  const E4m3Bf16Decoder decoder;
  for (int64_t j = split.entry_begin; j < split.entry_end;) {
    // Every row of the tile takes part in the products: rows past the last key are zero.
    const int64_t num_keys =
        gather_tile(split, d, decoder, s.column_channel, kAmxKeys, kAmxKeys, j, s.tile);
    if (num_keys == 0) continue;
    pack_value_tiles(d, s);
    for (int64_t b = 0; b < s.num_blocks; ++b) {
      amx_scores(d, s, b);
      amx_softmax(d, s, b, split.softmax_scale, num_keys);
      amx_values(d, s, b);
    }
  }
  release_amx_tiles();

  write_accumulators(d, s.acc, s.column_channel, split);
  std::copy_n(s.m, split.num_heads, split.m);
  std::copy_n(s.l, split.num_heads, split.l);
}

}  // namespace dz::kernels::detail
