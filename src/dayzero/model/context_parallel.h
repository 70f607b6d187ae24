#pragma once
// Context parallelism (docs/parallel.md §9): the ranks of a CP group share one step. Each
// sequence with at least 2·C tokens in the step is cut into 2·C pieces of (nearly) equal length;
// under the zigzag layout rank r runs pieces r and 2C−1−r, so that every rank gets the same causal
// attention work; the contiguous layout (pieces 2r and 2r+1) exists to measure the difference.
// Shorter sequences (decode rows, small chunks) run whole on every rank of the group, with the
// same bits. Each rank's cache stores only its share of the blocks (BlockShard). A layer's pieces
// attend over the whole history of their sequence, put together for the step from every rank's
// share (history()); the whole sequences read only this rank's keys and merge partial results
// over the ranks (DCP). KDA layers exchange only per-piece summaries (blocks/kda.h).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/dist/comm.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/kv_cache.h"

namespace dz::model {

enum class ContextLayout : unsigned char { kZigzag, kContiguous };

// One piece of a split sequence that this rank runs.
struct ContextPiece {
  int64_t sequence = 0;  // index among the step's split sequences
  int piece = 0;         // 0 … 2C−1 in sequence order
};

class ContextSplit {
 public:
  // `full` is the step every rank of `comm` (the CP group) was given; it must outlive this.
  ContextSplit(const ForwardBatch& full, dist::Comm& comm, ContextLayout layout);
  ContextSplit(const ContextSplit&) = delete;
  ContextSplit& operator=(const ContextSplit&) = delete;

  // This rank's tokens: whole short sequences, then its pieces of each split sequence, as
  // separate slices (a piece's slice shares its sequence's block table and state slot). Its
  // `context` points back here.
  const ForwardBatch& local() const { return local_; }
  int ranks() const { return comm_.size(); }
  int rank() const { return comm_.rank(); }
  int num_pieces() const { return 2 * ranks(); }
  // The rank that runs piece j.
  int owner(int piece) const;
  // The two pieces rank r runs, in sequence order.
  std::pair<int, int> pieces_of(int rank) const;

  int64_t num_split() const { return static_cast<int64_t>(split_.size()); }
  // Split sequence s as given in the full step.
  const SequenceSlice& split_sequence(int64_t s) const { return split_[static_cast<size_t>(s)]; }
  // [begin, end) of piece j of split sequence s, in tokens from the sequence's first of the step.
  int64_t piece_begin(int64_t s, int piece) const;
  int64_t piece_end(int64_t s, int piece) const { return piece_begin(s, piece + 1); }
  // The full-step index of local token t.
  int64_t full_token(int64_t t) const { return full_of_local_[static_cast<size_t>(t)]; }
  // The piece local slice i runs; nullopt for a sequence that runs whole on every rank.
  std::optional<ContextPiece> piece_of_slice(size_t slice) const;

  // The blocks this rank's cache stores: b with b % C == rank (docs/parallel.md §9.4).
  const BlockShard& shard() const { return shard_; }
  // Decode with the history sharded (DCP): the whole sequences (decode rows, short chunks) read
  // only the keys this rank stores; the indexer's candidates and attention's partial outputs are
  // then merged over the ranks. Whether local slice i reads only its stored keys.
  bool shards_keys(size_t slice) const { return !piece_of_slice(slice).has_value(); }
  // Whether this rank stores the key at `position` of a sequence with `block_table`.
  bool owns_key(std::span<const int32_t> block_table, int64_t position) const {
    return shard_.stores(block_table[static_cast<size_t>(position / full_.block_size)]);
  }
  // The same number of bytes from every rank, in rank order.
  std::vector<std::byte> gather_equal(std::span<const std::byte> mine, int layer) const;

  // The whole history of the split sequences for one layer: positions [0, num_cached_after) of
  // split sequence s at `tables[s]` of `pool`, a pool in the layer cache's format. Valid until
  // the next history of this split.
  struct History {
    std::byte* pool = nullptr;
    std::vector<std::vector<int32_t>> tables;
  };
  // Puts a layer's history together with one all-gather: each rank gives the rows of its pieces
  // (`fresh`: one row per local token, in the cache's row format) and the earlier rows its cache
  // stores. The other ranks' rows of this step that fall in blocks this rank stores go into
  // `pool` (this rank's cache), so the cache ends as if the step had run in one process.
  History mla_history(const kernels::MlaCacheLayout& layout, std::byte* pool,
                      std::span<const std::byte> fresh, int layer) const;
  // fresh: per local token the key codes, then the FP32 scale's 4 bytes.
  History index_history(const kernels::IndexCacheLayout& layout, std::byte* pool,
                        std::span<const std::byte> fresh, int layer) const;

  // Every rank's per-piece data: `mine` holds floats_per_piece values for each split sequence and
  // each of this rank's two pieces (sequence-major, pieces in order); the result holds them for
  // every piece, [num_split, 2C, floats_per_piece].
  std::vector<float> gather_pieces(std::span<const float> mine, int64_t floats_per_piece,
                                   int layer) const;
  // Where this rank's piece sits in gather_pieces()'s `mine`, in pieces.
  int64_t mine_index(const ContextPiece& piece) const {
    return piece.sequence * 2 + (piece.piece == pieces_of(rank()).first ? 0 : 1);
  }

  // rows [rows.size(), width] of values per full-step token index: the rows of split tokens come
  // from the rank that ran them, the others from `local` (this rank's rows [local tokens, width]).
  std::vector<float> gather_rows(std::span<const int64_t> rows, const float* local, int64_t width,
                                 int layer) const;

 private:
  // history() of a row format: get(pool, slot, dst) and put(pool, slot, src) copy one row of
  // row_bytes between a pool of block_bytes per block and a buffer.
  template <typename Get, typename Put>
  History history(int64_t row_bytes, int64_t block_bytes, std::byte* pool,
                  std::span<const std::byte> fresh, Get get, Put put, int layer) const;

  const ForwardBatch& full_;
  dist::Comm& comm_;
  ContextLayout layout_;
  BlockShard shard_;
  mutable AlignedBuffer history_;                          // the pool of the last history()
  std::vector<SequenceSlice> split_;                       // the full step's split sequences
  std::vector<std::optional<ContextPiece>> slice_pieces_;  // per local slice
  std::vector<int64_t> local_of_full_;  // local token index of each full-step token, −1: not here
  std::vector<int64_t> full_of_local_;  // and back
  std::vector<int> token_owner_;        // the rank that runs each full-step token, −1: every rank
  std::vector<int32_t> token_ids_, positions_;
  std::vector<int64_t> slot_mapping_;
  ForwardBatch local_;
};

// Copy-on-write in a cache sharded over the CP group `comm` (docs/parallel.md §9.4): the first
// num_rows rows of block `from_block` into `to_block`. When one rank stores both it copies; else
// the rank storing from_block broadcasts the rows and the one storing to_block keeps them. Every
// rank of the group calls it, in the same order.
void copy_block_rows_between_ranks(KvCache& cache, dist::Comm& comm, int32_t from_block,
                                   int32_t to_block, int64_t num_rows);

}  // namespace dz::model
