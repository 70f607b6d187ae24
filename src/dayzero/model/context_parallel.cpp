#include "dayzero/model/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "dayzero/core/check.h"
#include "dayzero/model/mixer_seconds.h"

namespace dz::model {

ContextSplit::ContextSplit(const ForwardBatch& full, dist::Comm& comm, ContextLayout layout)
    : full_(full), comm_(comm), layout_(layout) {
  const int64_t min_split = num_pieces();  // every piece gets at least one token
  local_of_full_.assign(static_cast<size_t>(full.num_tokens()), -1);
  token_owner_.assign(static_cast<size_t>(full.num_tokens()), -1);
  std::vector<SequenceSlice> local_sequences;
  const auto take = [&](const SequenceSlice& seq, int64_t begin, int64_t end,
                        std::optional<ContextPiece> piece) {
    SequenceSlice slice = seq;
    slice.token_begin = static_cast<int64_t>(token_ids_.size());
    slice.num_tokens = end - begin;
    slice.pos_begin = seq.pos_begin + begin;
    for (int64_t t = seq.token_begin + begin; t < seq.token_begin + end; ++t) {
      local_of_full_[static_cast<size_t>(t)] = static_cast<int64_t>(token_ids_.size());
      token_ids_.push_back(full.token_ids[static_cast<size_t>(t)]);
      positions_.push_back(full.positions[static_cast<size_t>(t)]);
      slot_mapping_.push_back(full.slot_mapping[static_cast<size_t>(t)]);
    }
    local_sequences.push_back(slice);
    slice_pieces_.push_back(piece);
  };
  const auto [first, second] = pieces_of(rank());
  for (const SequenceSlice& seq : full.sequences) {
    if (seq.num_tokens < min_split) {
      take(seq, 0, seq.num_tokens, std::nullopt);
      continue;
    }
    const auto s = static_cast<int64_t>(split_.size());
    split_.push_back(seq);
    for (int piece = 0; piece < num_pieces(); ++piece)
      for (int64_t i = piece_begin(s, piece); i < piece_end(s, piece); ++i)
        token_owner_[static_cast<size_t>(seq.token_begin + i)] = owner(piece);
    for (int piece : {first, second})
      take(seq, piece_begin(s, piece), piece_end(s, piece), ContextPiece{s, piece});
  }
  local_ = ForwardBatch{.token_ids = token_ids_,
                        .positions = positions_,
                        .slot_mapping = slot_mapping_,
                        .sequences = std::move(local_sequences),
                        .block_size = full.block_size,
                        .context = this};
}

int ContextSplit::owner(int piece) const {
  const int n = ranks();
  if (layout_ == ContextLayout::kContiguous) return piece / 2;
  return piece < n ? piece : 2 * n - 1 - piece;
}

std::pair<int, int> ContextSplit::pieces_of(int rank) const {
  if (layout_ == ContextLayout::kContiguous) return {2 * rank, 2 * rank + 1};
  return {rank, 2 * ranks() - 1 - rank};
}

int64_t ContextSplit::piece_begin(int64_t s, int piece) const {
  return split_sequence(s).num_tokens * piece / num_pieces();
}

std::optional<ContextPiece> ContextSplit::piece_of_slice(size_t slice) const {
  return slice_pieces_[slice];
}

std::vector<int64_t> ContextSplit::split_tokens_of(int rank) const {
  std::vector<int64_t> tokens;
  const auto [first, second] = pieces_of(rank);
  for (int64_t s = 0; s < num_split(); ++s)
    for (int piece : {first, second})
      for (int64_t i = piece_begin(s, piece); i < piece_end(s, piece); ++i)
        tokens.push_back(split_sequence(s).token_begin + i);
  return tokens;
}

template <typename Pack, typename Unpack>
void ContextSplit::share_rows(int64_t record_bytes, Pack pack, Unpack unpack, int layer) const {
  if (split_.empty()) return;
  std::vector<std::vector<int64_t>> tokens(static_cast<size_t>(ranks()));
  std::vector<int64_t> counts(static_cast<size_t>(ranks()));
  int64_t total = 0;
  for (int r = 0; r < ranks(); ++r) {
    tokens[static_cast<size_t>(r)] = split_tokens_of(r);
    counts[static_cast<size_t>(r)] =
        static_cast<int64_t>(tokens[static_cast<size_t>(r)].size()) * record_bytes;
    total += counts[static_cast<size_t>(r)];
  }
  const std::vector<int64_t>& mine = tokens[static_cast<size_t>(rank())];
  std::vector<std::byte> send(mine.size() * static_cast<size_t>(record_bytes));
  for (size_t i = 0; i < mine.size(); ++i) {
    const int64_t slot = full_.slot_mapping[static_cast<size_t>(mine[i])];
    if (slot >= 0) pack(slot, send.data() + i * static_cast<size_t>(record_bytes));
  }
  std::vector<std::byte> all(static_cast<size_t>(total));
  const auto start = std::chrono::steady_clock::now();
  comm_.all_gather(send, all, counts, dist::WireType::kU8, layer);
  mixer_seconds().exchange += seconds_since(start);
  size_t at = 0;
  for (int r = 0; r < ranks(); ++r) {
    for (int64_t t : tokens[static_cast<size_t>(r)]) {
      const int64_t slot = full_.slot_mapping[static_cast<size_t>(t)];
      if (r != rank() && slot >= 0) unpack(slot, all.data() + at);
      at += static_cast<size_t>(record_bytes);
    }
  }
}

void ContextSplit::share_mla_records(const kernels::MlaCacheLayout& layout, std::byte* pool,
                                     int layer) const {
  const int64_t bytes = layout.record_bytes();
  share_rows(
      bytes,
      [&](int64_t slot, std::byte* dst) {
        std::memcpy(dst, pool + slot * bytes, static_cast<size_t>(bytes));
      },
      [&](int64_t slot, const std::byte* src) {
        std::memcpy(pool + slot * bytes, src, static_cast<size_t>(bytes));
      },
      layer);
}

void ContextSplit::share_index_keys(const kernels::IndexCacheLayout& layout, std::byte* pool,
                                    int layer) const {
  const auto key = static_cast<size_t>(layout.key_dim);
  share_rows(
      layout.key_dim + 4,
      [&](int64_t slot, std::byte* dst) {
        std::memcpy(dst, pool + layout.key_offset_bytes(slot), key);
        std::memcpy(dst + key, pool + layout.scale_offset_bytes(slot), 4);
      },
      [&](int64_t slot, const std::byte* src) {
        std::memcpy(pool + layout.key_offset_bytes(slot), src, key);
        std::memcpy(pool + layout.scale_offset_bytes(slot), src + key, 4);
      },
      layer);
}

std::vector<std::byte> ContextSplit::gather_equal(std::span<const std::byte> mine,
                                                  int layer) const {
  std::vector<std::byte> all(mine.size() * static_cast<size_t>(ranks()));
  const std::vector<int64_t> counts(static_cast<size_t>(ranks()),
                                    static_cast<int64_t>(mine.size()));
  const auto start = std::chrono::steady_clock::now();
  comm_.all_gather(mine, all, counts, dist::WireType::kU8, layer);
  mixer_seconds().exchange += seconds_since(start);
  return all;
}

std::vector<float> ContextSplit::gather_pieces(std::span<const float> mine,
                                               int64_t floats_per_piece, int layer) const {
  const int64_t per_rank = num_split() * 2 * floats_per_piece;
  DZ_CHECK(static_cast<int64_t>(mine.size()) == per_rank, "gather_pieces: {} values, want {}",
           mine.size(), per_rank);
  std::vector<float> by_rank(static_cast<size_t>(per_rank * ranks()));
  const std::vector<int64_t> counts(static_cast<size_t>(ranks()), per_rank);
  const auto start = std::chrono::steady_clock::now();
  comm_.all_gather(std::as_bytes(mine), std::as_writable_bytes(std::span(by_rank)), counts,
                   dist::WireType::kF32, layer);
  mixer_seconds().exchange += seconds_since(start);
  // [rank, sequence, 2, floats] → [sequence, piece, floats]
  std::vector<float> out(by_rank.size());
  for (int r = 0; r < ranks(); ++r) {
    const auto [first, second] = pieces_of(r);
    for (int64_t s = 0; s < num_split(); ++s) {
      int which = 0;
      for (int piece : {first, second}) {
        const float* src =
            by_rank.data() + ((r * num_split() + s) * 2 + which++) * floats_per_piece;
        std::copy_n(src, floats_per_piece,
                    out.data() + (s * num_pieces() + piece) * floats_per_piece);
      }
    }
  }
  return out;
}

std::vector<float> ContextSplit::gather_rows(std::span<const int64_t> rows, const float* local,
                                             int64_t width, int layer) const {
  std::vector<float> out(rows.size() * static_cast<size_t>(width));
  // Which rank ran each asked row: -1 when every rank did (a whole sequence).
  std::vector<int> row_owner(rows.size());
  std::vector<int64_t> counts(static_cast<size_t>(ranks()), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    row_owner[i] = token_owner_[static_cast<size_t>(rows[i])];
    if (row_owner[i] >= 0) counts[static_cast<size_t>(row_owner[i])] += width;
  }
  std::vector<float> send;
  for (size_t i = 0; i < rows.size(); ++i) {
    const int64_t at = local_of_full_[static_cast<size_t>(rows[i])];
    if (row_owner[i] < 0)
      std::copy_n(local + at * width, width, out.data() + i * static_cast<size_t>(width));
    else if (row_owner[i] == rank())
      send.insert(send.end(), local + at * width, local + (at + 1) * width);
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return out;
  std::vector<float> all(static_cast<size_t>(total));
  comm_.all_gather(std::as_bytes(std::span(send)), std::as_writable_bytes(std::span(all)), counts,
                   dist::WireType::kF32, layer);
  std::vector<int64_t> next(static_cast<size_t>(ranks()), 0);  // offsets of each rank's rows
  for (int r = 1; r < ranks(); ++r)
    next[static_cast<size_t>(r)] =
        next[static_cast<size_t>(r - 1)] + counts[static_cast<size_t>(r - 1)];
  for (size_t i = 0; i < rows.size(); ++i) {
    if (row_owner[i] < 0) continue;
    int64_t& from = next[static_cast<size_t>(row_owner[i])];
    std::copy_n(all.data() + from, width, out.data() + i * static_cast<size_t>(width));
    from += width;
  }
  return out;
}

}  // namespace dz::model
