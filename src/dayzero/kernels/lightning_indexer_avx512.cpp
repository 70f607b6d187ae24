// AVX-512 lightning indexer. Keys are streamed chunk by chunk (16 keys of one block) and decoded
// E4M3 → FP32 or BF16 exactly (docs/formats.md §6.4a: two 128-entry VPERMI2B byte tables give the
// BF16 high and low bytes, which are the FP32 value's top two bytes); a tile of queries, each
// transposed to [key_dim, heads], is scored against the chunk as a small GEMM (heads × keys on FP32
// FMAs, VDPBF16PS or AMX tiles; accumulators 64 heads × 6 keys in vectors), then ReLU, head
// weights and the key scale, and each query keeps its best k_t positions in a buffer compacted by
// nth_element (TopKBuffer). Memory is O(tile · top_k), never O(L²).
//
// Everything here has internal linkage (see lightning_indexer_detail.h); the helpers with external
// linkage it calls are compiled without AVX-512 flags.

// GCC 12 reports its own _mm512_undefined_ps() inside the intrinsics headers as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <type_traits>

#include "dayzero/formats/decode_tables.h"
#include "dayzero/kernels/amx_tiles.h"
#include "dayzero/kernels/e4m3_bf16_avx512.h"
#include "dayzero/kernels/lightning_indexer.h"
#include "dayzero/kernels/lightning_indexer_detail.h"

namespace dz::kernels {
namespace {

using indexer_detail::Avx512WorkerLayout;
using indexer_detail::kChunkKeys;
using indexer_detail::kTileQueries;
using indexer_detail::ScoredPos;

struct E4m3Decoder {
  __m512i hi_lo_half, hi_hi_half, lo_lo_half, lo_hi_half, sign_bits;
  __m512i spread[4];       // byte indices placing lo/hi of codes 16j..16j+15 in dwords
  __m512i bf16_spread[2];  // byte indices placing lo/hi of codes 32j..32j+31 in words

  E4m3Decoder() {
    // BF16 high/low bytes of |decode(code)|: every E4M3 value is exact in BF16 (3 mantissa bits),
    // so BF16 bits << 16 are its FP32 bits.
    const detail::E4m3ByteTables& tables = detail::kE4m3ByteTables;
    hi_lo_half = _mm512_load_si512(tables.hi.data());
    hi_hi_half = _mm512_load_si512(tables.hi.data() + 64);
    lo_lo_half = _mm512_load_si512(tables.lo.data());
    lo_hi_half = _mm512_load_si512(tables.lo.data() + 64);
    sign_bits = _mm512_set1_epi8(static_cast<char>(0x80));
    for (int j = 0; j < 4; ++j) {
      alignas(64) std::array<uint8_t, 64> index{};
      for (int i = 0; i < 16; ++i) {
        index[static_cast<size_t>(4 * i + 2)] = static_cast<uint8_t>(16 * j + i);       // lo
        index[static_cast<size_t>(4 * i + 3)] = static_cast<uint8_t>(64 + 16 * j + i);  // hi
      }
      spread[j] = _mm512_load_si512(index.data());
    }
    for (int j = 0; j < 2; ++j) {
      alignas(64) std::array<uint8_t, 64> index{};
      for (int i = 0; i < 32; ++i) {
        index[static_cast<size_t>(2 * i)] = static_cast<uint8_t>(32 * j + i);           // lo
        index[static_cast<size_t>(2 * i + 1)] = static_cast<uint8_t>(64 + 32 * j + i);  // hi
      }
      bf16_spread[j] = _mm512_load_si512(index.data());
    }
  }

  // out[0, 64) = BF16 bits of decode(codes[0, 64)), exactly.
  void decode64_bf16(const uint8_t* codes, uint16_t* out) const {
    const __m512i c = _mm512_loadu_si512(codes);
    __m512i hi = _mm512_permutex2var_epi8(hi_lo_half, c, hi_hi_half);
    const __m512i lo = _mm512_permutex2var_epi8(lo_lo_half, c, lo_hi_half);
    hi = _mm512_ternarylogic_epi32(hi, c, sign_bits, 0xF8);
    _mm512_store_si512(out, _mm512_permutex2var_epi8(lo, bf16_spread[0], hi));
    _mm512_store_si512(out + 32, _mm512_permutex2var_epi8(lo, bf16_spread[1], hi));
  }

  // out[0, 64) = decode(codes[0, 64)), exactly.
  void decode64(const uint8_t* codes, float* out) const {
    const __m512i c = _mm512_loadu_si512(codes);
    __m512i hi = _mm512_permutex2var_epi8(hi_lo_half, c, hi_hi_half);  // index bits 0–6
    const __m512i lo = _mm512_permutex2var_epi8(lo_lo_half, c, lo_hi_half);
    hi = _mm512_ternarylogic_epi32(hi, c, sign_bits, 0xF8);  // hi | (c & 0x80)
    for (size_t j = 0; j < 4; ++j) {
      const __m512i bits = _mm512_maskz_permutex2var_epi8(0xCCCCCCCCCCCCCCCCull, lo, spread[j], hi);
      _mm512_store_ps(out + 16 * j, _mm512_castsi512_ps(bits));
    }
  }
};

// ---------------------------------------------------------------- FMA and VDPBF16PS scoring
// The chunk's scores as a small GEMM, heads in the vector lanes and each key's value broadcast,
// in one of two element types:
//   FP32 (Q = float, K = float): q as [key_dim, heads], one FMA per element;
//   BF16 pairs (Q = uint32_t, K = uint16_t): q as [key_dim / 2, heads] words, each the BF16 pair
//     (q_h[2p], q_h[2p+1]), and key pair p broadcast into VDPBF16PS: twice the multiplies per
//     instruction. E4M3 values are normal BF16 numbers and their products are exact in FP32, so
//     only the summation order differs from the FMA path (as on AMX).

// partial[j] += Σ_{h in group} w_h · ReLU(q_h · k_j) for keys j < KG, heads of HV 16-lane vectors.
// q: the query rows above at the group's first head, head_stride apart; keys: [KG, key_dim].
template <int HV, int KG, typename Q, typename K>
inline void score_key_group(const Q* q, int64_t head_stride, const float* w, const K* keys,
                            int64_t key_dim, float* partial) {
  constexpr bool kPairs = std::is_same_v<Q, uint32_t>;
  static_assert(kPairs ? std::is_same_v<K, uint16_t>
                       : std::is_same_v<Q, float> && std::is_same_v<K, float>);
  __m512 acc[HV][KG];
#pragma GCC unroll 8
  for (int hv = 0; hv < HV; ++hv)
#pragma GCC unroll 8
    for (int j = 0; j < KG; ++j) acc[hv][j] = _mm512_setzero_ps();
  constexpr int64_t kStep = kPairs ? 2 : 1;  // key elements per q row
  for (int64_t d = 0; d < key_dim; d += kStep) {
    const Q* q_row = q + d / kStep * head_stride;
    if constexpr (kPairs) {
      __m512bh qv[HV];
#pragma GCC unroll 8
      for (int hv = 0; hv < HV; ++hv) qv[hv] = detail::as_bh(_mm512_load_si512(q_row + 16 * hv));
#pragma GCC unroll 8
      for (int j = 0; j < KG; ++j) {
        uint32_t pair;
        std::memcpy(&pair, keys + j * key_dim + d, sizeof(pair));
        const __m512bh k = detail::as_bh(_mm512_set1_epi32(static_cast<int>(pair)));
#pragma GCC unroll 8
        for (int hv = 0; hv < HV; ++hv) acc[hv][j] = _mm512_dpbf16_ps(acc[hv][j], qv[hv], k);
      }
    } else {
      __m512 qv[HV];
#pragma GCC unroll 8
      for (int hv = 0; hv < HV; ++hv) qv[hv] = _mm512_load_ps(q_row + 16 * hv);
#pragma GCC unroll 8
      for (int j = 0; j < KG; ++j) {
        const __m512 k = _mm512_set1_ps(keys[j * key_dim + d]);
#pragma GCC unroll 8
        for (int hv = 0; hv < HV; ++hv) acc[hv][j] = _mm512_fmadd_ps(qv[hv], k, acc[hv][j]);
      }
    }
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int j = 0; j < KG; ++j) {
    __m512 sum = _mm512_mul_ps(_mm512_load_ps(w), _mm512_max_ps(acc[0][j], zero));
#pragma GCC unroll 8
    for (int hv = 1; hv < HV; ++hv)
      sum = _mm512_fmadd_ps(_mm512_load_ps(w + 16 * hv), _mm512_max_ps(acc[hv][j], zero), sum);
    partial[j] += _mm512_reduce_add_ps(sum);
  }
}

template <int HV, typename Q, typename K>
void score_chunk_heads(const Q* q, int64_t head_stride, const float* w, const K* keys,
                       int64_t key_dim, float* partial) {
  static_assert(kChunkKeys == 16);
  score_key_group<HV, 6>(q, head_stride, w, keys, key_dim, partial);
  score_key_group<HV, 6>(q, head_stride, w, keys + 6 * key_dim, key_dim, partial + 6);
  score_key_group<HV, 4>(q, head_stride, w, keys + 12 * key_dim, key_dim, partial + 12);
}

// chunk_scores[j] = Σ_h w_h · ReLU(q_h · k_j) over all (padded) heads, for the kChunkKeys keys.
template <typename Q, typename K>
void score_chunk(const Q* q, int64_t padded_heads, const float* w, const K* keys, int64_t key_dim,
                 float* chunk_scores) {
  for (int64_t j = 0; j < kChunkKeys; ++j) chunk_scores[j] = 0.0f;
  for (int64_t head = 0; head < padded_heads; head += 64) {
    const Q* q_group = q + head;
    const float* w_group = w + head;
    switch ((padded_heads - head) / 16) {
      case 1:
        score_chunk_heads<1>(q_group, padded_heads, w_group, keys, key_dim, chunk_scores);
        break;
      case 2:
        score_chunk_heads<2>(q_group, padded_heads, w_group, keys, key_dim, chunk_scores);
        break;
      case 3:
        score_chunk_heads<3>(q_group, padded_heads, w_group, keys, key_dim, chunk_scores);
        break;
      default:
        score_chunk_heads<4>(q_group, padded_heads, w_group, keys, key_dim, chunk_scores);
        break;
    }
  }
}

// ---------------------------------------------------------------- AMX-BF16 scoring
// C[key, head] (16 × 16 FP32 tiles 0–3, one per group of 16 heads) += A[key, d] (tile 4: 16 keys ×
// 32 BF16 of a key chunk) · B[d, head] (tiles 5–6: the query in VNNI pairs). E4M3 values are normal
// BF16 numbers and their products are exact in FP32, so the tiles compute the same dots as the FMA
// path up to the FP32 summation order.

constexpr int64_t kTileDepth = indexer_detail::kAmxTileDepth;
// How far ahead (in key positions) Worker::run prefetches the cached keys.
constexpr int64_t kPrefetchKeys = 16 * indexer_detail::kChunkKeys;

// q_vnni: the query as B tiles, [head_group][d / 32][16 pairs][16 heads][2] BF16.
uint16_t* vnni_tile(uint16_t* q_vnni, int64_t group, int64_t step, int64_t num_steps) {
  return q_vnni + (group * num_steps + step) * 16 * 32;
}

template <int G>
__attribute__((target("amx-tile,amx-bf16"))) void amx_dots(const uint16_t* keys, int64_t key_dim,
                                                           const uint16_t* q_vnni, int64_t group0,
                                                           float* c_tiles) {
  const int64_t num_steps = key_dim / kTileDepth;
  const auto key_stride = static_cast<int>(key_dim * 2);
  _tile_zero(0);
  if constexpr (G > 1) _tile_zero(1);
  if constexpr (G > 2) _tile_zero(2);
  if constexpr (G > 3) _tile_zero(3);
  auto b = [&](int64_t group, int64_t step) {
    return q_vnni + ((group0 + group) * num_steps + step) * 16 * 32;
  };
  for (int64_t step = 0; step < num_steps; ++step) {
    _tile_loadd(4, keys + step * kTileDepth, key_stride);
    _tile_loadd(5, b(0, step), 64);
    _tile_dpbf16ps(0, 4, 5);
    if constexpr (G > 1) {
      _tile_loadd(6, b(1, step), 64);
      _tile_dpbf16ps(1, 4, 6);
    }
    if constexpr (G > 2) {
      _tile_loadd(5, b(2, step), 64);
      _tile_dpbf16ps(2, 4, 5);
    }
    if constexpr (G > 3) {
      _tile_loadd(6, b(3, step), 64);
      _tile_dpbf16ps(3, 4, 6);
    }
  }
  _tile_stored(0, c_tiles, 64);
  if constexpr (G > 1) _tile_stored(1, c_tiles + 256, 64);
  if constexpr (G > 2) _tile_stored(2, c_tiles + 512, 64);
  if constexpr (G > 3) _tile_stored(3, c_tiles + 768, 64);
}

// chunk_scores[j] = Σ_h w_h · ReLU(q_h · k_j) for the kChunkKeys keys (BF16, [16, key_dim]).
void score_chunk_amx(const uint16_t* q_vnni, int64_t padded_heads, const float* w,
                     const uint16_t* keys, int64_t key_dim, float* c_tiles, float* chunk_scores) {
  for (int64_t j = 0; j < kChunkKeys; ++j) chunk_scores[j] = 0.0f;
  const __m512 zero = _mm512_setzero_ps();
  for (int64_t head = 0; head < padded_heads; head += 64) {
    const int64_t num_groups = std::min<int64_t>(4, (padded_heads - head) / 16);
    const int64_t group0 = head / 16;
    switch (num_groups) {
      case 1:
        amx_dots<1>(keys, key_dim, q_vnni, group0, c_tiles);
        break;
      case 2:
        amx_dots<2>(keys, key_dim, q_vnni, group0, c_tiles);
        break;
      case 3:
        amx_dots<3>(keys, key_dim, q_vnni, group0, c_tiles);
        break;
      default:
        amx_dots<4>(keys, key_dim, q_vnni, group0, c_tiles);
        break;
    }
    for (int64_t j = 0; j < kChunkKeys; ++j) {
      __m512 sum = _mm512_mul_ps(_mm512_load_ps(w + head),
                                 _mm512_max_ps(_mm512_load_ps(c_tiles + j * 16), zero));
      for (int64_t g = 1; g < num_groups; ++g)
        sum = _mm512_fmadd_ps(_mm512_load_ps(w + head + 16 * g),
                              _mm512_max_ps(_mm512_load_ps(c_tiles + g * 256 + j * 16), zero), sum);
      chunk_scores[j] += _mm512_reduce_add_ps(sum);
    }
  }
}

// The best `keep` entries of a stream whose positions ascend. Candidates are appended to a buffer
// of 2·keep + one chunk; when it fills, nth_element keeps the best `keep` and their worst rank
// becomes the threshold: a later candidate ranked at or below it (an equal score loses the tie on
// its higher position) cannot enter. A heap paid a sift of log2(keep) NaN-aware comparisons for
// every entry; this pays a store, and the compactions amortise to a few comparisons per entry.
struct TopKBuffer {
  ScoredPos* entries = nullptr;  // [indexer_detail::kept_buffer_entries(keep)]
  int64_t size = 0;
  int64_t keep = 0;
  bool bounded = false;  // a compaction has happened: `threshold` filters
  float threshold = 0.0f;

  void compact() {
    std::nth_element(entries, entries + keep - 1, entries + size, indexer_detail::kRanksBefore);
    size = keep;
    threshold = indexer_detail::rank_of(entries[keep - 1].score);
    bounded = true;
  }
  // Room for one chunk's candidates, compacting first if needed.
  void reserve_chunk() {
    if (size + kChunkKeys > indexer_detail::kept_buffer_entries(keep)) compact();
  }
  void push(ScoredPos candidate) { entries[size++] = candidate; }
  // The kept entries (any order) once the stream has ended.
  int64_t finish() {
    if (size > keep) compact();
    return size;
  }
};

// Which instructions compute the chunk's dots.
enum class Dots { kFma, kBf16Pairs, kAmx };

struct Worker {
  const IndexKeyCache& keys;
  const IndexerQueries& queries;
  const Avx512WorkerLayout& layout;
  const E4m3Decoder& decoder;
  int64_t top_k;
  std::byte* base;  // this worker's workspace slice
  Dots dots;        // kBf16Pairs and kAmx keep BF16 keys and BF16 queries in the FP32 slots

  float* key_buffer() const { return reinterpret_cast<float*>(base + layout.keys_offset); }
  float* q_t(int64_t i) const {
    return reinterpret_cast<float*>(base + layout.q_offset) +
           i * keys.layout.key_dim * layout.padded_heads;
  }
  float* weights(int64_t i) const {
    return reinterpret_cast<float*>(base + layout.w_offset) + i * layout.padded_heads;
  }
  uint16_t* q_vnni(int64_t i) const { return reinterpret_cast<uint16_t*>(q_t(i)); }
  uint32_t* q_pairs(int64_t i) const { return reinterpret_cast<uint32_t*>(q_t(i)); }
  float* c_tiles() const { return reinterpret_cast<float*>(base + layout.c_tiles_offset); }
  ScoredPos* kept_entries(int64_t i) const {
    return reinterpret_cast<ScoredPos*>(base + layout.kept_offset) +
           i * indexer_detail::kept_buffer_entries(top_k);
  }

  // Queries [query_begin, query_end) (at most kTileQueries) against the keys of blocks
  // [block_begin, block_end) of the sequence; the numbers kept come back in kept_sizes.
  void run(int64_t query_begin, int64_t query_end, int64_t block_begin, int64_t block_end,
           int64_t* kept_sizes) const;
};

void Worker::run(int64_t query_begin, int64_t query_end, int64_t block_begin, int64_t block_end,
                 int64_t* kept_sizes) const {
  const int64_t num_heads = queries.num_heads;
  const int64_t padded_heads = layout.padded_heads;
  const int64_t key_dim = keys.layout.key_dim;
  const int64_t block_size = keys.layout.block_size;
  const int64_t num_tile = query_end - query_begin;
  std::array<TopKBuffer, kTileQueries> best;
  std::array<int64_t, kTileQueries> last_visible{};
  int64_t max_last_visible = -1;
  for (int64_t i = 0; i < num_tile; ++i) {
    const int64_t t = query_begin + i;
    last_visible[i] = queries.positions[static_cast<size_t>(t)];
    max_last_visible = std::max(max_last_visible, last_visible[i]);
    best[i] = TopKBuffer{.entries = kept_entries(i), .keep = std::min(top_k, last_visible[i] + 1)};
    // q_t[d, h] = decode(q[h, d]); padding heads are zero and carry zero weight.
    const uint8_t* codes = queries.q_codes + t * num_heads * key_dim;
    float* w = weights(i);
    if (dots == Dots::kAmx) {
      const int64_t num_steps = key_dim / kTileDepth;
      for (int64_t h = 0; h < padded_heads; ++h)
        for (int64_t d = 0; d < key_dim; ++d) {
          const float value = h < num_heads ? formats::kE4m3Values[codes[h * key_dim + d]] : 0.0f;
          uint16_t* tile = vnni_tile(q_vnni(i), h / 16, d / kTileDepth, num_steps);
          tile[(d % kTileDepth / 2) * 32 + (h % 16) * 2 + d % 2] =
              static_cast<uint16_t>(std::bit_cast<uint32_t>(value) >> 16);
        }
    } else if (dots == Dots::kBf16Pairs) {
      // q_pairs[p, h] = BF16 pair (q[h, 2p], q[h, 2p + 1]).
      uint32_t* pairs = q_pairs(i);
      auto bf16_bits = [](float value) { return std::bit_cast<uint32_t>(value) >> 16; };
      for (int64_t p = 0; p < key_dim / 2; ++p) {
        for (int64_t h = 0; h < num_heads; ++h) {
          const uint8_t* pair_codes = codes + h * key_dim + 2 * p;
          pairs[p * padded_heads + h] = bf16_bits(formats::kE4m3Values[pair_codes[0]]) |
                                        bf16_bits(formats::kE4m3Values[pair_codes[1]]) << 16;
        }
        for (int64_t h = num_heads; h < padded_heads; ++h) pairs[p * padded_heads + h] = 0;
      }
    } else {
      float* qt = q_t(i);
      for (int64_t d = 0; d < key_dim; ++d) {
        for (int64_t h = 0; h < num_heads; ++h)
          qt[d * padded_heads + h] = formats::kE4m3Values[codes[h * key_dim + d]];
        for (int64_t h = num_heads; h < padded_heads; ++h) qt[d * padded_heads + h] = 0.0f;
      }
    }
    for (int64_t h = 0; h < padded_heads; ++h)
      w[h] = h < num_heads ? queries.head_weights[t * num_heads + h] : 0.0f;
  }

  // Blocks sit anywhere in the pool, so the hardware prefetcher restarts at each one; with AMX the
  // work per chunk is short enough for DRAM latency to show. Fetch the codes and scales of the
  // chunk kPrefetchKeys positions ahead.
  auto prefetch_chunk = [&](int64_t pos, int64_t end_pos) {
    if (pos >= end_pos) return;
    const int64_t block_id = keys.block_table[static_cast<size_t>(pos / block_size)];
    const char* chunk_base = reinterpret_cast<const char*>(keys.pool) +
                             block_id * keys.layout.block_bytes() + pos % block_size * key_dim;
    for (int64_t line = 0; line < kChunkKeys * key_dim; line += 64)
      _mm_prefetch(chunk_base + line, _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(keys.pool) + block_id * keys.layout.block_bytes() +
                     block_size * key_dim + pos % block_size * 4,
                 _MM_HINT_T0);
  };
  float* key_buf = key_buffer();
  // A local copy whose address never escapes: the decode stores (__m512i-typed) could otherwise
  // alias the referenced tables and force a reload of every table after every store.
  const E4m3Decoder tables = decoder;
  const bool bf16_keys = dots != Dots::kFma;
  // BF16 keys: two chunk buffers used in turn (both fit in the FP32 chunk's slot), so that the
  // decode of a chunk does not overwrite memory the previous chunk's tile loads may still read.
  uint16_t* key_bf16 = reinterpret_cast<uint16_t*>(key_buf);
  int64_t chunk_count = 0;
  if (dots == Dots::kAmx) detail::configure_amx_tiles(7);
  alignas(64) float chunk_scores[kChunkKeys];
  for (int64_t block = block_begin; block < block_end; ++block) {
    const int64_t block_id = keys.block_table[static_cast<size_t>(block)];
    const std::byte* block_base = keys.pool + block_id * keys.layout.block_bytes();
    const auto* block_codes = reinterpret_cast<const uint8_t*>(block_base);
    const auto* block_scales = reinterpret_cast<const float*>(block_base + block_size * key_dim);
    for (int64_t offset = 0; offset < block_size; offset += kChunkKeys) {
      const int64_t first_pos = block * block_size + offset;
      if (first_pos > max_last_visible) break;
      prefetch_chunk(first_pos + kPrefetchKeys,
                     std::min(block_end * block_size, max_last_visible + 1));
      key_bf16 = reinterpret_cast<uint16_t*>(key_buf) + (chunk_count++ % 2) * kChunkKeys * key_dim;
      for (int64_t j = 0; j < kChunkKeys; ++j)
        for (int64_t d = 0; d < key_dim; d += 64) {
          const uint8_t* codes = block_codes + (offset + j) * key_dim + d;
          if (bf16_keys)
            tables.decode64_bf16(codes, key_bf16 + j * key_dim + d);
          else
            tables.decode64(codes, key_buf + j * key_dim + d);
        }
      alignas(64) float key_scales[kChunkKeys];
      std::memcpy(key_scales, block_scales + offset, sizeof(key_scales));
      for (int64_t i = 0; i < num_tile; ++i) {
        if (first_pos > last_visible[i]) continue;
        if (dots == Dots::kAmx)
          score_chunk_amx(q_vnni(i), padded_heads, weights(i), key_bf16, key_dim, c_tiles(),
                          chunk_scores);
        else if (dots == Dots::kBf16Pairs)
          score_chunk(q_pairs(i), padded_heads, weights(i), key_bf16, key_dim, chunk_scores);
        else
          score_chunk(q_t(i), padded_heads, weights(i), key_buf, key_dim, chunk_scores);
        const __m512 scored =
            _mm512_mul_ps(_mm512_load_ps(key_scales), _mm512_load_ps(chunk_scores));
        _mm512_store_ps(chunk_scores, scored);
        const int64_t num_visible = std::min(kChunkKeys, last_visible[i] - first_pos + 1);
        auto candidates = static_cast<uint32_t>((uint64_t{1} << num_visible) - 1);
        TopKBuffer& kept = best[i];
        kept.reserve_chunk();
        if (kept.bounded)
          candidates &= _mm512_cmp_ps_mask(scored, _mm512_set1_ps(kept.threshold), _CMP_GT_OQ);
        while (candidates != 0) {
          const int j = std::countr_zero(candidates);
          candidates &= candidates - 1;
          kept.push(ScoredPos{chunk_scores[j], static_cast<int32_t>(first_pos + j)});
        }
      }
    }
  }
  if (dots == Dots::kAmx) detail::release_amx_tiles();
  for (int64_t i = 0; i < num_tile; ++i) kept_sizes[i] = best[i].finish();
}

void run_indexer(const ExecContext& ctx, const IndexKeyCache& keys, const IndexerQueries& queries,
                 int64_t top_k, std::span<int32_t> selection, std::span<float> scores,
                 std::span<std::byte> workspace, Dots dots) {
  const int64_t num_queries = queries.num_queries();
  const Avx512WorkerLayout layout =
      indexer_detail::avx512_worker_layout(queries.num_heads, keys.layout.key_dim, top_k);
  const E4m3Decoder decoder;
  const int64_t num_threads = std::max(ctx.num_threads, 1);
  const int64_t num_tiles = (num_queries + kTileQueries - 1) / kTileQueries;
  const int64_t num_blocks =
      (indexer_detail::max_visible_keys(queries) + keys.layout.block_size - 1) /
      keys.layout.block_size;
  auto worker_at = [&](int64_t w) {
    return Worker{keys,    queries, layout,
                  decoder, top_k,   workspace.data() + static_cast<size_t>(w) * layout.worker_bytes,
                  dots};
  };
  auto write_row = [&](int64_t t, ScoredPos* chosen, int64_t num_chosen) {
    indexer_detail::write_selection_row(chosen, num_chosen, top_k, selection.data() + t * top_k,
                                        scores.empty() ? nullptr : scores.data() + t * top_k);
  };

  const bool split_keys = num_tiles == 1 && num_threads > 1 && num_blocks >= 2 * num_threads;
  if (!split_keys) {
    // Prefill: tiles round-robin over workers (causal tiles grow with the position).
    const int64_t num_workers = std::min(num_threads, num_tiles);
    parallel_for(ctx, num_workers, 1, [&](int64_t worker_begin, int64_t worker_end) {
      for (int64_t w = worker_begin; w < worker_end; ++w) {
        const Worker worker = worker_at(w);
        for (int64_t tile = w; tile < num_tiles; tile += num_workers) {
          const int64_t query_begin = tile * kTileQueries;
          const int64_t query_end = std::min(num_queries, query_begin + kTileQueries);
          std::array<int64_t, kTileQueries> kept_sizes{};
          worker.run(query_begin, query_end, 0, num_blocks, kept_sizes.data());
          for (int64_t t = query_begin; t < query_end; ++t)
            write_row(t, worker.kept_entries(t - query_begin), kept_sizes[t - query_begin]);
        }
      }
    });
    return;
  }

  // Decode (one tile, long context): the key blocks are split over the workers, each keeps its own
  // best entries and sorts them by rank, and the caller merges the sorted lists per query (a
  // selection and sort of all of them on the caller alone was ≈ 30 % of a 32K-key call while the
  // other threads waited).
  const int64_t num_workers = std::min(num_threads, indexer_detail::kMaxSplitWorkers);
  auto* merged = reinterpret_cast<ScoredPos*>(workspace.data() + static_cast<size_t>(num_threads) *
                                                                     layout.worker_bytes);
  std::array<std::array<int64_t, kTileQueries>, indexer_detail::kMaxSplitWorkers> kept_sizes{};
  parallel_for(ctx, num_workers, 1, [&](int64_t worker_begin, int64_t worker_end) {
    for (int64_t w = worker_begin; w < worker_end; ++w) {
      const Worker worker = worker_at(w);
      worker.run(0, num_queries, num_blocks * w / num_workers, num_blocks * (w + 1) / num_workers,
                 kept_sizes[w].data());
      for (int64_t t = 0; t < num_queries; ++t)
        std::sort(worker.kept_entries(t), worker.kept_entries(t) + kept_sizes[w][t],
                  indexer_detail::kRanksBefore);
    }
  });
  for (int64_t t = 0; t < num_queries; ++t) {
    const int64_t num_chosen =
        std::min(top_k, int64_t{queries.positions[static_cast<size_t>(t)]} + 1);
    std::array<const ScoredPos*, indexer_detail::kMaxSplitWorkers> next{}, end{};
    for (int64_t w = 0; w < num_workers; ++w) {
      next[w] = worker_at(w).kept_entries(t);
      end[w] = next[w] + kept_sizes[w][t];
    }
    int64_t num_merged = 0;
    for (; num_merged < num_chosen; ++num_merged) {  // the best head of the lists, each time
      int64_t best = -1;
      for (int64_t w = 0; w < num_workers; ++w)
        if (next[w] < end[w] && (best < 0 || indexer_detail::ranks_before(*next[w], *next[best])))
          best = w;
      if (best < 0) break;
      merged[num_merged] = *next[best]++;
    }
    indexer_detail::write_ranked_selection_row(
        merged, num_merged, top_k, selection.data() + t * top_k,
        scores.empty() ? nullptr : scores.data() + t * top_k);
  }
}

}  // namespace

void lightning_indexer_avx512(const ExecContext& ctx, const IndexKeyCache& keys,
                              const IndexerQueries& queries, int64_t top_k,
                              std::span<int32_t> selection, std::span<float> scores,
                              std::span<std::byte> workspace) {
  run_indexer(ctx, keys, queries, top_k, selection, scores, workspace, Dots::kFma);
}

void lightning_indexer_avx512_bf16(const ExecContext& ctx, const IndexKeyCache& keys,
                                   const IndexerQueries& queries, int64_t top_k,
                                   std::span<int32_t> selection, std::span<float> scores,
                                   std::span<std::byte> workspace) {
  run_indexer(ctx, keys, queries, top_k, selection, scores, workspace, Dots::kBf16Pairs);
}

void lightning_indexer_amx(const ExecContext& ctx, const IndexKeyCache& keys,
                           const IndexerQueries& queries, int64_t top_k,
                           std::span<int32_t> selection, std::span<float> scores,
                           std::span<std::byte> workspace) {
  run_indexer(ctx, keys, queries, top_k, selection, scores, workspace, Dots::kAmx);
}

}  // namespace dz::kernels
