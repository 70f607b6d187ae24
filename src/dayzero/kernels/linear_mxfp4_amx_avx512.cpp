// MXFP4 kernels on AMX tiles (linear_kernels.h), over the weight layout of mxfp4_amx_layout.h:
// four VPERMW per 64 bytes decode a block of 16 rows × 32 inputs straight into a BF16 B tile (no
// widening shuffle, no transpose), and one TDPBF16PS multiplies it with up to 16 tokens, so 2–16
// tokens read the weights at the one-token rate.
// - Scales folded (every nonzero block's code in 2–252, the caller checks): the decode table holds
//   each nonzero value with its exponent raised by 125 and zeros as +0, and one unsigned saturating
//   subtraction of (252 − E) << 7 per word gives value · 2^(E−127) as a normal BF16 (zeros stay 0,
//   so no mask). The C tiles then accumulate over the whole row. Blocks are decoded a chunk ahead
//   of the tiles that multiply them: decoding and multiplying one block at a time measured about
//   130 cycles per block with the weights in L2, the pipelined GEMV about 50 (VPERMW bound: it
//   measured 2 cycles of throughput on the Intel machine).
// - Any scale code (the exact GEMV): each block's product goes to its own C tile and the scale is
//   applied in FP32 afterwards, as the VDPBF16PS GEMV does; 1.5–2.5× slower (a C round trip per
//   block), taken only by weights with subnormal or huge scales.
#if defined(__GNUC__) && !defined(__clang__)  // GCC 12 AVX-512 headers: false positives
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <array>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/kernels/amx_tiles.h"
#include "dayzero/kernels/linear_common.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/mxfp4_amx_layout.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels::detail {
namespace {

// Software prefetch distance and level: the decode runs near the DRAM rate of one core, so lines
// must be requested well ahead. Measured on [3072, 3584] experts from DRAM (Intel, 1 and 2
// threads): into L2 (T1) 5–15 % faster than into L1 (T0), 8–64 KiB alike; NTA or none 1.8× slower.
constexpr int64_t kPrefetchBytes = 16384;
// Decoded B tiles of one group the GEMM keeps per thread (64 KiB: L2-resident across the token
// tiles that reuse them).
constexpr int64_t kGemmChunkBlocks = 64;
// Blocks the folded GEMV decodes before multiplying them (16 KiB, in L1).
constexpr int64_t kGemvChunkBlocks = 16;
constexpr int64_t kTileBytes = 1024;  // 16 rows × 64 bytes

// The table above with every nonzero value's exponent raised by 125 and −0 as +0 (see the top).
alignas(64) constexpr std::array<uint16_t, 32> kE2m1Bf16Raised = [] {
  std::array<uint16_t, 32> raised{};
  for (size_t i = 0; i < raised.size(); ++i)
    raised[i] = (kE2m1Bf16[i] & 0x7FFF) == 0 ? 0 : static_cast<uint16_t>(kE2m1Bf16[i] + (125 << 7));
  return raised;
}();

inline void prefetch_block(const uint8_t* src) {
  DZ_UNROLL(16)
  for (int line = 0; line < 4; ++line)
    _mm_prefetch(reinterpret_cast<const char*>(src + kPrefetchBytes + 64 * line), _MM_HINT_T1);
}

// Tile row r of the block at `src` (mxfp4_amx_layout.h) as BF16 into dst[r · 32 …], for r < 16.
// kFolded: with the raised table and `lower` ((252 − E) << 7 per word, by row), the scaled value.
template <bool kFolded>
inline void decode_block(const uint8_t* src, uint16_t* dst, __m512i table, __m512i lower) {
  prefetch_block(src);
  DZ_UNROLL(16)
  for (int chunk = 0; chunk < 4; ++chunk) {
    const __m512i codes = _mm512_loadu_si512(src + 64 * chunk);
    DZ_UNROLL(16)
    for (int q = 0; q < 4; ++q) {
      __m512i bits = _mm512_permutexvar_epi16(
          q == 0 ? codes : _mm512_srli_epi16(codes, static_cast<unsigned>(4 * q)), table);
      if constexpr (kFolded) bits = _mm512_subs_epu16(bits, lower);
      _mm512_store_si512(dst + 32 * (4 * chunk + q), bits);
    }
  }
}

// 2^(E−127) as FP32 for the 16 rows' codes of one block: E << 23, except E = 0 → 0x00400000.
inline __m512 block_scales(const uint8_t* codes) {
  const __m512i shifted = _mm512_slli_epi32(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))), 23);
  return _mm512_castsi512_ps(_mm512_max_epu32(shifted, _mm512_set1_epi32(0x00400000)));
}

// (252 − E) << 7 in both words of each row's dword, for the 16 rows' codes of one block.
inline __m512i block_exponent_lowering(const uint8_t* codes) {
  const __m512i lower = _mm512_slli_epi32(
      _mm512_sub_epi32(_mm512_set1_epi32(252), _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                                   reinterpret_cast<const __m128i*>(codes)))),
      7);
  return _mm512_or_si512(_mm512_and_si512(lower, _mm512_set1_epi32(0xFFFF)),
                         _mm512_slli_epi32(lower, 16));
}

// Tiles 0–3 (C) and a_tile, a_tile + 1 (A) with rows = tokens, the other two (B) 16 rows.
__attribute__((target("amx-tile"))) void configure_gemv_tiles(int tokens, int a_tile) {
  alignas(64) AmxTileConfig config;
  for (int tile = 0; tile < 8; ++tile) {
    config.rows[tile] =
        static_cast<uint8_t>(tile < 4 || tile == a_tile || tile == a_tile + 1 ? tokens : 16);
    config.colsb[tile] = 64;
  }
  asm volatile("ldtilecfg %0" : : "m"(config));  // see configure_amx_tiles
}

struct GemvBuffers {
  alignas(64) uint16_t b[4][kTileBytes / 2];
  alignas(64) float c[4][16 * 16];
};

template <int kTokens>
struct GemvGroup {
  const uint8_t* packed;
  const uint8_t* scales;
  const uint16_t* x;
  int64_t in;
  GemvBuffers* buffers;
  __m512i table;
  __m512 total[kTokens];

  // Block `block` decoded into buffer kSlot and its scales, once its C tile is in c[kSlot].
  template <int kSlot>
  inline const uint16_t* decode(int64_t block) {
    decode_block<false>(packed + block * kMxfp4AmxBlockBytes, buffers->b[kSlot], table,
                        _mm512_setzero_si512());
    return buffers->b[kSlot];
  }
  template <int kSlot>
  inline void accumulate(int64_t block) {
    const __m512 scale = block_scales(scales + block * kMxfp4AmxGroupRows);
    DZ_UNROLL(16)
    for (int t = 0; t < kTokens; ++t)
      total[t] = _mm512_fmadd_ps(_mm512_load_ps(buffers->c[kSlot] + 16 * t), scale, total[t]);
  }
};

// Block `block` of group g in slot `slot`: C tile `slot`, B and A tiles by parity (a block's tiles
// are not rewritten while the one before may still be in flight). The tile numbers of the AMX
// intrinsics must be literals, hence a macro.
#define DZ_MXFP4_AMX_GEMV_BLOCK(g, slot, b_tile, a_tile, block) \
  do {                                                          \
    _tile_loadd(b_tile, (g).template decode<slot>(block), 64);  \
    _tile_loadd(a_tile, (g).x + 32 * (block), 2 * (g).in);      \
    _tile_zero(slot);                                           \
    _tile_dpbf16ps(slot, a_tile, b_tile);                       \
    _tile_stored(slot, (g).buffers->c[slot], 64);               \
    (g).template accumulate<slot>(block);                       \
  } while (false)

template <int kTokens>
__attribute__((target("amx-tile,amx-bf16"))) void gemv_groups(
    const uint8_t* packed, const uint8_t* scales, int64_t in, int64_t out, const uint16_t* x,
    float* y, int64_t y_stride, int64_t group_begin, int64_t group_end) {
  thread_local GemvBuffers buffers;
  const int64_t num_blocks = in / 32;
  configure_gemv_tiles(kTokens, 6);
  for (int64_t group = group_begin; group < group_end; ++group) {
    GemvGroup<kTokens> g{packed + group * num_blocks * kMxfp4AmxBlockBytes,
                         scales + group * num_blocks * kMxfp4AmxGroupRows,
                         x,
                         in,
                         &buffers,
                         _mm512_load_si512(kE2m1Bf16.data()),
                         {}};
    DZ_UNROLL(16)
    for (int t = 0; t < kTokens; ++t) g.total[t] = _mm512_setzero_ps();
    int64_t block = 0;
    for (; block + 4 <= num_blocks; block += 4) {
      DZ_MXFP4_AMX_GEMV_BLOCK(g, 0, 4, 6, block);
      DZ_MXFP4_AMX_GEMV_BLOCK(g, 1, 5, 7, block + 1);
      DZ_MXFP4_AMX_GEMV_BLOCK(g, 2, 4, 6, block + 2);
      DZ_MXFP4_AMX_GEMV_BLOCK(g, 3, 5, 7, block + 3);
    }
    if (block < num_blocks) DZ_MXFP4_AMX_GEMV_BLOCK(g, 0, 4, 6, block);
    if (block + 1 < num_blocks) DZ_MXFP4_AMX_GEMV_BLOCK(g, 1, 5, 7, block + 1);
    if (block + 2 < num_blocks) DZ_MXFP4_AMX_GEMV_BLOCK(g, 2, 4, 6, block + 2);
    const int64_t row = group * kMxfp4AmxGroupRows;
    const auto rows = static_cast<unsigned>(std::min(kMxfp4AmxGroupRows, out - row));
    const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
    DZ_UNROLL(16)
    for (int t = 0; t < kTokens; ++t)
      _mm512_mask_storeu_ps(y + t * y_stride + row, valid, g.total[t]);
  }
  release_amx_tiles();
}

// One decoded block (B tile b_tile) times kTiles token tiles of 16 (A tiles 4–5 in turn, C tiles
// 0 … kTiles − 1); a holds the first token's 32 activations of the block, rows `in` apart.
#define DZ_MXFP4_AMX_GEMM_BLOCK(b_tile, b, a)     \
  do {                                            \
    _tile_loadd(b_tile, b, 64);                   \
    _tile_loadd(4, a, a_row_bytes);               \
    _tile_dpbf16ps(0, 4, b_tile);                 \
    if constexpr (kTiles > 1) {                   \
      _tile_loadd(5, (a) + 16 * in, a_row_bytes); \
      _tile_dpbf16ps(1, 5, b_tile);               \
    }                                             \
    if constexpr (kTiles > 2) {                   \
      _tile_loadd(4, (a) + 32 * in, a_row_bytes); \
      _tile_dpbf16ps(2, 4, b_tile);               \
    }                                             \
    if constexpr (kTiles > 3) {                   \
      _tile_loadd(5, (a) + 48 * in, a_row_bytes); \
      _tile_dpbf16ps(3, 5, b_tile);               \
    }                                             \
  } while (false)

// The GEMM over kTiles token tiles and the decoded blocks [0, num_blocks) of one chunk: C tile j
// starts from c[256 j …] (or zero when `first`) and is stored back there.
template <int kTiles>
__attribute__((target("amx-tile,amx-bf16"))) void gemm_token_tiles(const uint16_t* decoded,
                                                                   int64_t num_blocks,
                                                                   const uint16_t* x, int64_t in,
                                                                   float* c, bool first) {
  if (first) {
    _tile_zero(0);
    if constexpr (kTiles > 1) _tile_zero(1);
    if constexpr (kTiles > 2) _tile_zero(2);
    if constexpr (kTiles > 3) _tile_zero(3);
  } else {
    _tile_loadd(0, c, 64);
    if constexpr (kTiles > 1) _tile_loadd(1, c + 256, 64);
    if constexpr (kTiles > 2) _tile_loadd(2, c + 512, 64);
    if constexpr (kTiles > 3) _tile_loadd(3, c + 768, 64);
  }
  constexpr int64_t kBlockElems = kTileBytes / 2;
  const auto a_row_bytes = static_cast<long>(2 * in);
  int64_t block = 0;
  for (; block + 2 <= num_blocks; block += 2) {
    DZ_MXFP4_AMX_GEMM_BLOCK(6, decoded + block * kBlockElems, x + 32 * block);
    DZ_MXFP4_AMX_GEMM_BLOCK(7, decoded + (block + 1) * kBlockElems, x + 32 * (block + 1));
  }
  if (block < num_blocks) DZ_MXFP4_AMX_GEMM_BLOCK(6, decoded + block * kBlockElems, x + 32 * block);
  _tile_stored(0, c, 64);
  if constexpr (kTiles > 1) _tile_stored(1, c + 256, 64);
  if constexpr (kTiles > 2) _tile_stored(2, c + 512, 64);
  if constexpr (kTiles > 3) _tile_stored(3, c + 768, 64);
}

// The folded GEMV over a stream of chunks (kGemvChunkBlocks blocks of one group each, the groups'
// chunks in order). Software-pipelined so that neither the decode nor the tiles wait:
// - while the tiles multiply the blocks of one chunk (decoded earlier into one half of the
//   buffer), the next chunk, which may be the next group's first, is decoded into the other half;
// - a group accumulates into two C tiles, blocks alternating (two chains, so TDPBF16PS latency
//   overlaps): tiles 0–1 for even groups, 2–3 for odd ones, and a group's tiles are stored only
//   once the next group's first chunk is issued. A tiles 4–5, B tiles 6–7.
struct FoldedGemv {
  const uint8_t* packed;
  const uint8_t* scales;
  const uint16_t* x;
  int64_t in, out, num_tokens;
  float* y;
  int64_t y_stride;
  int64_t num_blocks;
  __m512i table;
  uint16_t* decoded;  // two halves of kGemvChunkBlocks decoded blocks

  static constexpr int64_t kBlockElems = kTileBytes / 2;

  void decode(int64_t group, int64_t block, uint16_t* to) const {
    decode_block<true>(
        packed + (group * num_blocks + block) * kMxfp4AmxBlockBytes, to, table,
        block_exponent_lowering(scales + (group * num_blocks + block) * kMxfp4AmxGroupRows));
  }

  // y for `group` from its two C tiles, stored in c[0] and c[1].
  void write_group(int64_t group, const float (*c)[16 * 16]) const {
    const int64_t row = group * kMxfp4AmxGroupRows;
    const auto rows = static_cast<unsigned>(std::min(kMxfp4AmxGroupRows, out - row));
    const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
    for (int64_t t = 0; t < num_tokens; ++t)
      _mm512_mask_storeu_ps(
          y + t * y_stride + row, valid,
          _mm512_add_ps(_mm512_load_ps(c[0] + 16 * t), _mm512_load_ps(c[1] + 16 * t)));
  }
};

#define DZ_MXFP4_AMX_FOLDED_BLOCK(c_tile, a_tile, b_tile, i)                              \
  do {                                                                                    \
    if ((i) < next_count) g.decode(next_group, next_first + (i), next + (i)*kBlockElems); \
    _tile_loadd(b_tile, current + (i)*kBlockElems, 64);                                   \
    _tile_loadd(a_tile, g.x + 32 * (first + (i)), a_row_bytes);                           \
    _tile_dpbf16ps(c_tile, a_tile, b_tile);                                               \
  } while (false)

// The blocks [first, first + count) of one chunk into C tiles kPair · 2 and kPair · 2 + 1,
// decoding next_count blocks of the next chunk on the way.
template <int kPair>
__attribute__((target("amx-tile,amx-bf16"))) void folded_chunk(
    const FoldedGemv& g, const uint16_t* current, int64_t first, int64_t count, uint16_t* next,
    int64_t next_group, int64_t next_first, int64_t next_count) {
  constexpr int64_t kBlockElems = FoldedGemv::kBlockElems;
  const auto a_row_bytes = static_cast<long>(2 * g.in);
  int64_t i = 0;
  for (; i + 2 <= count; i += 2) {
    if constexpr (kPair == 0) {
      DZ_MXFP4_AMX_FOLDED_BLOCK(0, 4, 6, i);
      DZ_MXFP4_AMX_FOLDED_BLOCK(1, 5, 7, i + 1);
    } else {
      DZ_MXFP4_AMX_FOLDED_BLOCK(2, 4, 6, i);
      DZ_MXFP4_AMX_FOLDED_BLOCK(3, 5, 7, i + 1);
    }
  }
  if (i < count) {
    if constexpr (kPair == 0)
      DZ_MXFP4_AMX_FOLDED_BLOCK(0, 4, 6, i);
    else
      DZ_MXFP4_AMX_FOLDED_BLOCK(2, 4, 6, i);
    ++i;
  }
  for (; i < next_count; ++i) g.decode(next_group, next_first + i, next + i * kBlockElems);
}

// Stores and clears C tiles kPair · 2, kPair · 2 + 1 and writes their group's y.
template <int kPair>
__attribute__((target("amx-tile,amx-bf16"))) void folded_finish(const FoldedGemv& g,
                                                                int64_t group) {
  alignas(64) float c[2][16 * 16];
  if constexpr (kPair == 0) {
    _tile_stored(0, c[0], 64);
    _tile_stored(1, c[1], 64);
    _tile_zero(0);
    _tile_zero(1);
  } else {
    _tile_stored(2, c[0], 64);
    _tile_stored(3, c[1], 64);
    _tile_zero(2);
    _tile_zero(3);
  }
  g.write_group(group, c);
}

__attribute__((target("amx-tile,amx-bf16"))) void gemv_folded_groups(
    const uint8_t* packed, const uint8_t* scales, int64_t in, int64_t out, const uint16_t* x,
    int64_t num_tokens, float* y, int64_t y_stride, int64_t group_begin, int64_t group_end) {
  constexpr int64_t kBlockElems = FoldedGemv::kBlockElems;
  thread_local AlignedBuffer decoded_storage;
  const FoldedGemv g{packed,
                     scales,
                     x,
                     in,
                     out,
                     num_tokens,
                     y,
                     y_stride,
                     in / 32,
                     _mm512_load_si512(kE2m1Bf16Raised.data()),
                     reinterpret_cast<uint16_t*>(ensure(
                         decoded_storage, static_cast<size_t>(2 * kGemvChunkBlocks * kTileBytes)))};
  const int64_t chunks_per_group = (g.num_blocks + kGemvChunkBlocks - 1) / kGemvChunkBlocks;
  const int64_t num_chunks = (group_end - group_begin) * chunks_per_group;
  // Chunk k: its group, first block and block count.
  const auto group_of = [&](int64_t k) { return group_begin + k / chunks_per_group; };
  const auto first_of = [&](int64_t k) { return (k % chunks_per_group) * kGemvChunkBlocks; };
  const auto count_of = [&](int64_t k) {
    return k < num_chunks ? std::min(kGemvChunkBlocks, g.num_blocks - first_of(k)) : int64_t{0};
  };
  configure_gemv_tiles(static_cast<int>(num_tokens), 4);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t i = 0; i < count_of(0); ++i) g.decode(group_begin, i, g.decoded + i * kBlockElems);
  int64_t pending = -1;  // a group whose tiles still wait to be stored
  for (int64_t k = 0; k < num_chunks; ++k) {
    const int64_t group = group_of(k);
    const uint16_t* current = g.decoded + (k % 2) * kGemvChunkBlocks * kBlockElems;
    uint16_t* next = g.decoded + ((k + 1) % 2) * kGemvChunkBlocks * kBlockElems;
    const bool even = (group - group_begin) % 2 == 0;
    (even ? folded_chunk<0> : folded_chunk<1>)(g, current, first_of(k), count_of(k), next,
                                               group_of(k + 1), first_of(k + 1), count_of(k + 1));
    if (pending >= 0) {
      ((pending - group_begin) % 2 == 0 ? folded_finish<0> : folded_finish<1>)(g, pending);
      pending = -1;
    }
    if (first_of(k) + count_of(k) == g.num_blocks) pending = group;
  }
  if (pending >= 0)
    ((pending - group_begin) % 2 == 0 ? folded_finish<0> : folded_finish<1>)(g, pending);
  release_amx_tiles();
}

}  // namespace

void mxfp4_amx_gemv_folded_groups(const uint8_t* packed, const uint8_t* scales, int64_t in,
                                  int64_t out, const uint16_t* x, int64_t num_tokens, float* y,
                                  int64_t y_stride, int64_t group_begin, int64_t group_end) {
  gemv_folded_groups(packed, scales, in, out, x, num_tokens, y, y_stride, group_begin, group_end);
}

void mxfp4_amx_gemv_groups(const uint8_t* packed, const uint8_t* scales, int64_t in, int64_t out,
                           const uint16_t* x, int64_t num_tokens, float* y, int64_t y_stride,
                           int64_t group_begin, int64_t group_end) {
  switch (num_tokens) {
#define DZ_MXFP4_AMX_CASE(n) \
  case n:                    \
    return gemv_groups<n>(packed, scales, in, out, x, y, y_stride, group_begin, group_end);
    DZ_MXFP4_AMX_CASE(1)
    DZ_MXFP4_AMX_CASE(2)
    DZ_MXFP4_AMX_CASE(3)
    DZ_MXFP4_AMX_CASE(4)
    DZ_MXFP4_AMX_CASE(5)
    DZ_MXFP4_AMX_CASE(6)
    DZ_MXFP4_AMX_CASE(7)
    DZ_MXFP4_AMX_CASE(8)
    DZ_MXFP4_AMX_CASE(9)
    DZ_MXFP4_AMX_CASE(10)
    DZ_MXFP4_AMX_CASE(11)
    DZ_MXFP4_AMX_CASE(12)
    DZ_MXFP4_AMX_CASE(13)
    DZ_MXFP4_AMX_CASE(14)
    DZ_MXFP4_AMX_CASE(15)
    DZ_MXFP4_AMX_CASE(16)
#undef DZ_MXFP4_AMX_CASE
    default:
      __builtin_trap();
  }
}

__attribute__((target("amx-tile,amx-bf16"))) void mxfp4_amx_gemm_groups(
    const uint8_t* packed, const uint8_t* scales, int64_t in, int64_t out, const uint16_t* x,
    int64_t num_tokens, float* y, int64_t y_stride, int64_t group_begin, int64_t group_end) {
  const int64_t num_blocks = in / 32;
  const int64_t padded_tokens = (num_tokens + 15) / 16 * 16;
  thread_local AlignedBuffer decoded_storage, c_storage;
  auto* decoded = reinterpret_cast<uint16_t*>(
      ensure(decoded_storage, static_cast<size_t>(kGemmChunkBlocks * kTileBytes)));
  auto* c = reinterpret_cast<float*>(
      ensure(c_storage, static_cast<size_t>(padded_tokens * 16) * sizeof(float)));
  const __m512i table = _mm512_load_si512(kE2m1Bf16Raised.data());
  configure_amx_tiles(8);
  for (int64_t group = group_begin; group < group_end; ++group) {
    const uint8_t* group_codes = packed + group * num_blocks * kMxfp4AmxBlockBytes;
    const uint8_t* group_scales = scales + group * num_blocks * kMxfp4AmxGroupRows;
    for (int64_t chunk = 0; chunk < num_blocks; chunk += kGemmChunkBlocks) {
      const int64_t chunk_blocks = std::min(kGemmChunkBlocks, num_blocks - chunk);
      for (int64_t b = 0; b < chunk_blocks; ++b)
        decode_block<true>(
            group_codes + (chunk + b) * kMxfp4AmxBlockBytes, decoded + b * (kTileBytes / 2), table,
            block_exponent_lowering(group_scales + (chunk + b) * kMxfp4AmxGroupRows));
      for (int64_t t = 0; t < padded_tokens; t += 64) {
        const uint16_t* xt = x + t * in + 32 * chunk;
        float* ct = c + t * 16;
        switch (std::min<int64_t>(4, (padded_tokens - t) / 16)) {
          case 1:
            gemm_token_tiles<1>(decoded, chunk_blocks, xt, in, ct, chunk == 0);
            break;
          case 2:
            gemm_token_tiles<2>(decoded, chunk_blocks, xt, in, ct, chunk == 0);
            break;
          case 3:
            gemm_token_tiles<3>(decoded, chunk_blocks, xt, in, ct, chunk == 0);
            break;
          default:
            gemm_token_tiles<4>(decoded, chunk_blocks, xt, in, ct, chunk == 0);
        }
      }
    }
    const int64_t row = group * kMxfp4AmxGroupRows;
    const auto rows = static_cast<unsigned>(std::min(kMxfp4AmxGroupRows, out - row));
    const __mmask16 valid = static_cast<__mmask16>((1u << rows) - 1);
    for (int64_t t = 0; t < num_tokens; ++t)
      _mm512_mask_storeu_ps(y + t * y_stride + row, valid, _mm512_load_ps(c + 16 * t));
  }
  release_amx_tiles();
}

}  // namespace dz::kernels::detail
