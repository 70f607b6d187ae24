#include "dayzero/model/context_parallel.h"

#include <algorithm>
#include <cstring>

#include "dayzero/core/check.h"
#include "dayzero/model/mixer_seconds.h"

namespace dz::model {

ContextSplit::ContextSplit(const ForwardBatch& full, dist::Comm& comm, ContextLayout layout)
    : full_(full),
      comm_(comm),
      layout_(layout),
      shard_{.count = comm.size(), .index = comm.rank()} {
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
      full_of_local_.push_back(t);
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

template <typename Get, typename Put>
ContextSplit::History ContextSplit::history(int64_t row_bytes, int64_t block_bytes, std::byte* pool,
                                            std::span<const std::byte> fresh, Get get, Put put,
                                            int layer) const {
  History h;
  if (split_.empty()) return h;
  const int64_t B = full_.block_size;
  DZ_CHECK(static_cast<int64_t>(fresh.size()) == local_.num_tokens() * row_bytes,
           "history: {} bytes of fresh rows for {} tokens of {}", fresh.size(), local_.num_tokens(),
           row_bytes);
  int64_t num_blocks = 0;
  for (const SequenceSlice& seq : split_) {
    std::vector<int32_t>& table = h.tables.emplace_back();
    for (int64_t b = 0; b * B < seq.num_cached_after(); ++b)
      table.push_back(static_cast<int32_t>(num_blocks++));
  }
  if (history_.size_bytes() < static_cast<size_t>(num_blocks * block_bytes))
    history_ = AlignedBuffer(static_cast<size_t>(num_blocks * block_bytes));
  h.pool = history_.data();

  // The rows each rank gives, in its order: per split sequence the earlier positions in the
  // blocks it stores, then its pieces' tokens. (sequence, position, full-step token or −1.)
  struct Row {
    int64_t sequence, position, token;
  };
  const auto rows_of = [&](int r) {
    std::vector<Row> rows;
    for (int64_t s = 0; s < num_split(); ++s) {
      const SequenceSlice& seq = split_[static_cast<size_t>(s)];
      for (int64_t p = 0; p < seq.pos_begin; ++p)
        if (seq.block_table[static_cast<size_t>(p / B)] % ranks() == r) rows.push_back({s, p, -1});
      const auto [first, second] = pieces_of(r);
      for (int piece : {first, second})
        for (int64_t i = piece_begin(s, piece); i < piece_end(s, piece); ++i)
          rows.push_back({s, seq.pos_begin + i, seq.token_begin + i});
    }
    return rows;
  };
  std::vector<std::vector<Row>> rows(static_cast<size_t>(ranks()));
  std::vector<int64_t> counts(static_cast<size_t>(ranks()));
  int64_t total = 0;
  for (int r = 0; r < ranks(); ++r) {
    rows[static_cast<size_t>(r)] = rows_of(r);
    counts[static_cast<size_t>(r)] =
        static_cast<int64_t>(rows[static_cast<size_t>(r)].size()) * row_bytes;
    total += counts[static_cast<size_t>(r)];
  }
  const std::vector<Row>& mine = rows[static_cast<size_t>(rank())];
  std::vector<std::byte> send(mine.size() * static_cast<size_t>(row_bytes));
  for (size_t i = 0; i < mine.size(); ++i) {
    std::byte* dst = send.data() + i * static_cast<size_t>(row_bytes);
    const Row& row = mine[i];
    if (row.token >= 0) {
      const int64_t local = local_of_full_[static_cast<size_t>(row.token)];
      std::memcpy(dst, fresh.data() + local * row_bytes, static_cast<size_t>(row_bytes));
    } else {
      const SequenceSlice& seq = split_[static_cast<size_t>(row.sequence)];
      get(pool, shard_.stored_slot(slot_of(seq.block_table, B, row.position), B), dst);
    }
  }
  std::vector<std::byte> all(static_cast<size_t>(total));
  const auto start = std::chrono::steady_clock::now();
  comm_.all_gather(send, all, counts, dist::WireType::kU8, layer);
  mixer_seconds().exchange += seconds_since(start);
  const std::byte* src = all.data();
  for (int r = 0; r < ranks(); ++r) {
    for (const Row& row : rows[static_cast<size_t>(r)]) {
      const std::vector<int32_t>& table = h.tables[static_cast<size_t>(row.sequence)];
      put(h.pool, slot_of(table, B, row.position), src);
      // Another rank's row of this step in a block this rank stores: keep it in the cache.
      if (row.token >= 0 && r != rank()) {
        const int64_t slot = full_.slot_mapping[static_cast<size_t>(row.token)];
        const int64_t stored = slot < 0 ? -1 : shard_.stored_slot(slot, B);
        if (stored >= 0) put(pool, stored, src);
      }
      src += row_bytes;
    }
  }
  return h;
}

ContextSplit::History ContextSplit::mla_history(const kernels::MlaCacheLayout& layout,
                                                std::byte* pool, std::span<const std::byte> fresh,
                                                int layer) const {
  const int64_t bytes = layout.record_bytes();
  return history(
      bytes, full_.block_size * bytes, pool, fresh,
      [&](const std::byte* from, int64_t slot, std::byte* dst) {
        std::memcpy(dst, from + slot * bytes, static_cast<size_t>(bytes));
      },
      [&](std::byte* to, int64_t slot, const std::byte* src) {
        std::memcpy(to + slot * bytes, src, static_cast<size_t>(bytes));
      },
      layer);
}

ContextSplit::History ContextSplit::index_history(const kernels::IndexCacheLayout& layout,
                                                  std::byte* pool, std::span<const std::byte> fresh,
                                                  int layer) const {
  const auto key = static_cast<size_t>(layout.key_dim);
  return history(
      layout.key_dim + 4, layout.block_bytes(), pool, fresh,
      [&](const std::byte* from, int64_t slot, std::byte* dst) {
        std::memcpy(dst, from + layout.key_offset_bytes(slot), key);
        std::memcpy(dst + key, from + layout.scale_offset_bytes(slot), 4);
      },
      [&](std::byte* to, int64_t slot, const std::byte* src) {
        std::memcpy(to + layout.key_offset_bytes(slot), src, key);
        std::memcpy(to + layout.scale_offset_bytes(slot), src + key, 4);
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

void copy_block_rows_between_ranks(KvCache& cache, dist::Comm& comm, int32_t from_block,
                                   int32_t to_block, int64_t num_rows) {
  const BlockShard& shard = cache.shard();
  DZ_CHECK(shard.count == comm.size() && shard.index == comm.rank(),
           "cache shard {} of {} on CP rank {} of {}", shard.index, shard.count, comm.rank(),
           comm.size());
  if (from_block % shard.count == to_block % shard.count) {  // one rank stores both
    cache.copy_block_rows(from_block, to_block, num_rows);
    return;
  }
  std::vector<std::byte> rows =
      shard.stores(from_block)
          ? cache.block_rows(from_block, num_rows)
          : std::vector<std::byte>(static_cast<size_t>(cache.bytes_per_token() * num_rows));
  comm.broadcast(rows, from_block % shard.count, -1);
  if (shard.stores(to_block)) cache.set_block_rows(to_block, num_rows, rows);
}

}  // namespace dz::model
