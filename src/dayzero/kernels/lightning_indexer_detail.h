#pragma once
// Pieces shared by the lightning-indexer variants. Everything with external linkage here is
// defined in lightning_indexer.cpp (compiled without AVX-512 flags), so the *_avx512.cpp file never
// provides an out-of-line copy that a non-AVX-512 caller could be linked against.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

#include "dayzero/kernels/lightning_indexer.h"

namespace dz::kernels::indexer_detail {

struct ScoredPos {
  float score;
  int32_t pos;
};

// NaN ranks as −∞ so that every comparison below is a strict weak order.
static inline float rank_of(float score) {
  return std::isnan(score) ? -std::numeric_limits<float>::infinity() : score;
}
// The tie rule of docs/models.md §3.3: higher score first, then lower position.
static inline bool ranks_before(ScoredPos a, ScoredPos b) {
  const float ra = rank_of(a.score);
  const float rb = rank_of(b.score);
  return ra > rb || (ra == rb && a.pos < b.pos);
}
// ranks_before as a function object, for std::sort and std::nth_element: passed as a function
// pointer it was called out of line, ~3 % of a decode step.
inline constexpr auto kRanksBefore = [](ScoredPos a, ScoredPos b) { return ranks_before(a, b); };

// Queries decoded together by the AVX-512 variant; one key chunk is decoded once per tile.
inline constexpr int64_t kTileQueries = 8;
// Keys decoded at once (a multiple of 16; divides every valid block_size).
inline constexpr int64_t kChunkKeys = 16;

// Entries of one query's selection buffer in the AVX-512 variant: the kept top_k, as many
// candidates again between compactions, and one chunk's worth of headroom.
inline constexpr int64_t kept_buffer_entries(int64_t top_k) {
  return 2 * top_k + kChunkKeys;
}

// BF16 elements of d per AMX tile step.
inline constexpr int64_t kAmxTileDepth = 32;

// Workers that split one tile's keys (decode); their best entries are merged in a region after the
// worker slices.
inline constexpr int64_t kMaxSplitWorkers = 64;

// Byte offsets inside one AVX-512 worker's slice of the workspace (all 64-byte aligned).
struct Avx512WorkerLayout {
  int64_t padded_heads = 0;   // num_heads rounded up to 16; padding heads have q = 0 and w = 0
  size_t keys_offset = 0;     // [kChunkKeys, key_dim] FP32 decoded keys (AMX: BF16)
  size_t c_tiles_offset = 0;  // AMX: [4, 16, 16] FP32 result tiles
  size_t q_offset = 0;     // [kTileQueries, key_dim, padded_heads] FP32, transposed queries (AMX:
                           // BF16 VNNI tiles in the first half of each query's slot)
  size_t w_offset = 0;     // [kTileQueries, padded_heads] FP32
  size_t kept_offset = 0;  // [kTileQueries, kept_buffer_entries(top_k)] ScoredPos
  size_t worker_bytes = 0;
};

Avx512WorkerLayout avx512_worker_layout(int64_t num_heads, int64_t key_dim, int64_t top_k);
size_t ref_worker_bytes(int64_t num_heads, int64_t key_dim, int64_t max_visible);

// Number of visible keys of the longest query (max position + 1).
int64_t max_visible_keys(const IndexerQueries& queries);

// Writes one output row from its chosen entries (any order; sorted in place by rank): the
// positions in rank order then −1, and (if score_row is not null) their scores then −inf.
void write_selection_row(ScoredPos* chosen, int64_t num_chosen, int64_t top_k, int32_t* sel_row,
                         float* score_row);
// The same for entries already in rank order.
void write_ranked_selection_row(const ScoredPos* ranked, int64_t num_chosen, int64_t top_k,
                                int32_t* sel_row, float* score_row);

}  // namespace dz::kernels::indexer_detail
