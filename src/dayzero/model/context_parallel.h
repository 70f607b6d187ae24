#pragma once
// Context parallelism (docs/parallel.md §9): the ranks of a CP group share one step. Each
// sequence with at least 2·C tokens in the step is cut into 2·C pieces of (nearly) equal length;
// under the zigzag layout rank r runs pieces r and 2C−1−r, so that every rank gets the same causal
// attention work; the contiguous layout (pieces 2r and 2r+1) exists to measure the difference.
// Shorter sequences (decode rows, small chunks) run whole on every rank of the group, with the
// same bits. The cache rows a rank writes for its pieces (MLA latent records, indexer keys) are
// gathered onto every rank, so each rank holds the whole cache and attends its queries to every
// earlier key locally; KDA layers exchange only per-piece summaries (blocks/kda.h).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dayzero/dist/comm.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/forward_batch.h"

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
  // The piece local slice i runs; nullopt for a sequence that runs whole on every rank.
  std::optional<ContextPiece> piece_of_slice(size_t slice) const;

  // Decode with the history sharded (DCP, docs/parallel.md §9.4): for the whole sequences (decode
  // rows), rank r reads only the keys of the blocks it owns, logical block b when b % C == r; the
  // indexer's candidates and attention's partial outputs are then merged over the ranks.
  // Whether local slice i reads only its owned keys (a whole sequence, not a piece).
  bool shards_keys(size_t slice) const { return !piece_of_slice(slice).has_value(); }
  bool owns_key(int64_t position, int64_t block_size) const {
    return position / block_size % ranks() == rank();
  }
  // The same number of bytes from every rank, in rank order.
  std::vector<std::byte> gather_equal(std::span<const std::byte> mine, int layer) const;

  // Gathers the cache rows every other rank wrote for its pieces this step into this rank's pool
  // (one all-gather). The rows this rank wrote are already there.
  void share_mla_records(const kernels::MlaCacheLayout& layout, std::byte* pool, int layer) const;
  void share_index_keys(const kernels::IndexCacheLayout& layout, std::byte* pool, int layer) const;

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
  // Full-step token indices of the split tokens rank r runs, in its local order.
  std::vector<int64_t> split_tokens_of(int rank) const;
  // Gathers record_bytes per split token: pack(slot, dst) fills this rank's, unpack(slot, src)
  // stores each other rank's.
  template <typename Pack, typename Unpack>
  void share_rows(int64_t record_bytes, Pack pack, Unpack unpack, int layer) const;

  const ForwardBatch& full_;
  dist::Comm& comm_;
  ContextLayout layout_;
  std::vector<SequenceSlice> split_;                       // the full step's split sequences
  std::vector<std::optional<ContextPiece>> slice_pieces_;  // per local slice
  std::vector<int64_t> local_of_full_;  // local token index of each full-step token, −1: not here
  std::vector<int> token_owner_;        // the rank that runs each full-step token, −1: every rank
  std::vector<int32_t> token_ids_, positions_;
  std::vector<int64_t> slot_mapping_;
  ForwardBatch local_;
};

}  // namespace dz::model
