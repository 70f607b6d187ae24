// Context parallelism across ranks (docs/parallel.md §9), run by mpirun at 2 and 4 ranks
// (model/CMakeLists.txt), both layouts:
// - the history of the split sequences (the earlier rows each rank stores and the rows of every
//   rank's pieces) reaches every rank byte for byte, each rank's cache ends with every row of the
//   blocks it stores, and each rank receives exactly the rows it did not give;
// - rows asked for by full-step index come back from the rank that ran them;
// - a copy between two ranks' blocks of a sharded cache moves the rows once, to the right place;
// - a KDA block over pieces on different ranks gives the outputs, recurrent states and conv rows
//   of the whole sequences in one process. Bounds as kda_test.cpp derives them for splits of one
//   sequence: 1e-5 relative RMS on the FP32 states (only the grouping of FP32 sums differs: the
//   pieces' summaries are composed instead of run through), 1e-3 on the outputs (a BF16 rounding
//   tipped by it), conv rows equal (copied BF16 codes). A wrong state or halo handed between
//   ranks gives O(1).
// Every rank draws from the seed rank 0 prints.

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "dayzero/dist/mpi_comm.h"
#include "dayzero/dist/mpi_test_main.h"
#include "dayzero/model/blocks/kda_random_block.h"
#include "dayzero/model/context_parallel.h"
#include "dayzero/model/kv_cache.h"

namespace dz::model {
namespace {

using namespace kda_testing;  // NOLINT: the random KDA block of kda_test.cpp

dist::MpiComm* g_world = nullptr;
constexpr int kLayer = 5;
constexpr int64_t kBlockSize = 16;

uint32_t shared_seed() {
  return dist::shared_test_seed(*g_world);
}

// A step of several sequences, each with its own blocks: [num_tokens, pos_begin, state slot].
struct Step {
  std::vector<int32_t> token_ids, positions, block_ids;
  std::vector<int64_t> slot_mapping;
  ForwardBatch batch;

  explicit Step(const std::vector<std::array<int64_t, 3>>& seqs) {
    int32_t next_block = 0;
    std::vector<std::pair<size_t, size_t>> tables;  // offset, count into block_ids
    for (const auto& [n, pos, slot] : seqs) {
      const int64_t blocks = (pos + n + kBlockSize - 1) / kBlockSize;
      tables.emplace_back(block_ids.size(), static_cast<size_t>(blocks));
      for (int64_t b = 0; b < blocks; ++b) block_ids.push_back(next_block++);
    }
    size_t i = 0;
    for (const auto& [n, pos, slot] : seqs) {
      const std::span<const int32_t> table(block_ids.data() + tables[i].first, tables[i].second);
      batch.sequences.push_back(SequenceSlice{.token_begin = static_cast<int64_t>(token_ids.size()),
                                              .num_tokens = n,
                                              .pos_begin = pos,
                                              .block_table = table,
                                              .state_slot = static_cast<int32_t>(slot)});
      for (int64_t t = 0; t < n; ++t) {
        token_ids.push_back(1);
        positions.push_back(static_cast<int32_t>(pos + t));
        slot_mapping.push_back(slot_of(table, kBlockSize, pos + t));
      }
      ++i;
    }
    batch.token_ids = token_ids;
    batch.positions = positions;
    batch.slot_mapping = slot_mapping;
    batch.block_size = kBlockSize;
  }
  int64_t num_blocks() const { return static_cast<int64_t>(block_ids.size()); }
};

// A new 61-token sequence, a decode row, 45 tokens continuing a 13-token prefix, and a 9-token
// sequence (pieces of one or two tokens at 4 ranks: the conv halo then spans several pieces).
const std::vector<std::array<int64_t, 3>> kSequences = {
    {61, 0, 1}, {1, 13, 2}, {45, 13, 3}, {9, 0, 4}};

class ContextParallel : public ::testing::TestWithParam<ContextLayout> {};

TEST_P(ContextParallel, HistoryHoldsEveryRowAndTheCacheItsShare) {
  const Step step(kSequences);
  const ContextSplit split(step.batch, *g_world, GetParam());
  ASSERT_EQ(split.num_split(), 3);
  const BlockShard shard = split.shard();
  ASSERT_EQ(shard.count, g_world->size());
  const kernels::MlaCacheLayout mla{.latent_dim = 128, .rope_dim = 32};
  const kernels::IndexCacheLayout index{.key_dim = 128, .block_size = kBlockSize};
  const int64_t mla_bytes = mla.record_bytes(), index_bytes = index.key_dim + 4;
  const uint32_t seed = shared_seed();
  // The byte a row holds at offset i: a function of the seed, its slot in the full cache and i.
  const auto byte_of = [seed](int64_t slot, int64_t i) {
    return static_cast<std::byte>((seed + static_cast<uint32_t>(slot * 131 + i * 7)) & 0xff);
  };
  // This rank's cache: the rows of the earlier positions in the blocks it stores (the continued
  // sequences' 13-token prefixes) and of the step's tokens it computed there.
  const int64_t stored_slots = shard.stored_blocks(step.num_blocks()) * kBlockSize;
  std::vector<std::byte> mla_pool(static_cast<size_t>(stored_slots * mla_bytes), std::byte{0});
  std::vector<std::byte> index_pool(
      static_cast<size_t>(shard.stored_blocks(step.num_blocks()) * index.block_bytes()),
      std::byte{0});
  const auto write = [&](int64_t slot) {
    const int64_t stored = shard.stored_slot(slot, kBlockSize);
    if (stored < 0) return;
    for (int64_t i = 0; i < mla_bytes; ++i)
      mla_pool[static_cast<size_t>(stored * mla_bytes + i)] = byte_of(slot, i);
    for (int64_t i = 0; i < index.key_dim; ++i)
      index_pool[static_cast<size_t>(index.key_offset_bytes(stored) + i)] = byte_of(slot, i);
    for (int64_t i = 0; i < 4; ++i)
      index_pool[static_cast<size_t>(index.scale_offset_bytes(stored) + i)] =
          byte_of(slot, index.key_dim + i);
  };
  for (const SequenceSlice& seq : step.batch.sequences)
    for (int64_t p = 0; p < seq.pos_begin; ++p) write(slot_of(seq.block_table, kBlockSize, p));
  const ForwardBatch& local = split.local();
  std::vector<std::byte> mla_fresh(static_cast<size_t>(local.num_tokens() * mla_bytes));
  std::vector<std::byte> index_fresh(static_cast<size_t>(local.num_tokens() * index_bytes));
  for (int64_t l = 0; l < local.num_tokens(); ++l) {
    const int64_t slot = local.slot_mapping[static_cast<size_t>(l)];
    write(slot);
    for (int64_t i = 0; i < mla_bytes; ++i)
      mla_fresh[static_cast<size_t>(l * mla_bytes + i)] = byte_of(slot, i);
    for (int64_t i = 0; i < index_bytes; ++i)
      index_fresh[static_cast<size_t>(l * index_bytes + i)] = byte_of(slot, i);
  }

  g_world->stats().reset();
  const ContextSplit::History mla_history =
      split.mla_history(mla, mla_pool.data(), mla_fresh, kLayer);
  const int64_t received = g_world->stats().total().bytes_received;
  // Every position of every split sequence in the history, byte for byte.
  int64_t history_rows = 0;
  for (int64_t s = 0; s < split.num_split(); ++s) {
    const SequenceSlice& seq = split.split_sequence(s);
    const std::vector<int32_t>& table = mla_history.tables[static_cast<size_t>(s)];
    for (int64_t p = 0; p < seq.num_cached_after(); ++p, ++history_rows) {
      const int64_t at = slot_of(table, kBlockSize, p);
      const int64_t slot = slot_of(seq.block_table, kBlockSize, p);
      for (int64_t i = 0; i < mla_bytes; ++i)
        ASSERT_EQ(mla_history.pool[at * mla_bytes + i], byte_of(slot, i))
            << "sequence " << s << " position " << p << " byte " << i;
    }
  }
  const ContextSplit::History index_history =
      split.index_history(index, index_pool.data(), index_fresh, kLayer);
  for (int64_t s = 0; s < split.num_split(); ++s) {
    const SequenceSlice& seq = split.split_sequence(s);
    const std::vector<int32_t>& table = index_history.tables[static_cast<size_t>(s)];
    for (int64_t p = 0; p < seq.num_cached_after(); ++p) {
      const int64_t at = slot_of(table, kBlockSize, p);
      const int64_t slot = slot_of(seq.block_table, kBlockSize, p);
      for (int64_t i = 0; i < index.key_dim; ++i)
        ASSERT_EQ(index_history.pool[index.key_offset_bytes(at) + i], byte_of(slot, i))
            << "sequence " << s << " position " << p << " key byte " << i;
      for (int64_t i = 0; i < 4; ++i)
        ASSERT_EQ(index_history.pool[index.scale_offset_bytes(at) + i],
                  byte_of(slot, index.key_dim + i))
            << "sequence " << s << " position " << p << " scale byte " << i;
    }
  }
  // The cache: every row of the blocks this rank stores, and nothing of the others'.
  for (const SequenceSlice& seq : step.batch.sequences)
    for (int64_t p = 0; p < seq.num_cached_after(); ++p) {
      const int64_t slot = slot_of(seq.block_table, kBlockSize, p);
      const int64_t stored = shard.stored_slot(slot, kBlockSize);
      if (stored < 0) continue;
      for (int64_t i = 0; i < mla_bytes; ++i)
        ASSERT_EQ(mla_pool[static_cast<size_t>(stored * mla_bytes + i)], byte_of(slot, i))
            << "cached slot " << slot << " byte " << i;
      for (int64_t i = 0; i < index.key_dim; ++i)
        ASSERT_EQ(index_pool[static_cast<size_t>(index.key_offset_bytes(stored) + i)],
                  byte_of(slot, i))
            << "cached slot " << slot << " key byte " << i;
    }
  // Received: every history row but the ones this rank gave (its pieces' tokens and the earlier
  // positions in its blocks), one record each.
  int64_t given = local.num_tokens() - 1;  // less the decode row, which every rank runs
  for (int64_t s = 0; s < split.num_split(); ++s) {
    const SequenceSlice& seq = split.split_sequence(s);
    for (int64_t p = 0; p < seq.pos_begin; ++p)
      given += shard.stores(seq.block_table[static_cast<size_t>(p / kBlockSize)]) ? 1 : 0;
  }
  EXPECT_EQ(history_rows, 61 + 58 + 9);
  EXPECT_EQ(received, (history_rows - given) * mla_bytes);
}

TEST_P(ContextParallel, AskedRowsComeFromTheirRanks) {
  const Step step(kSequences);
  const ContextSplit split(step.batch, *g_world, GetParam());
  const ForwardBatch& local = split.local();
  constexpr int64_t kWidth = 3;
  // Each local row holds its position and state slot: what identifies a full-step token here.
  std::vector<float> rows(static_cast<size_t>(local.num_tokens() * kWidth));
  for (int64_t l = 0; l < local.num_tokens(); ++l) {
    rows[static_cast<size_t>(l * kWidth)] =
        static_cast<float>(local.positions[static_cast<size_t>(l)]);
    rows[static_cast<size_t>(l * kWidth + 1)] =
        static_cast<float>(local.slot_mapping[static_cast<size_t>(l)]);
    rows[static_cast<size_t>(l * kWidth + 2)] = static_cast<float>(g_world->rank());
  }
  const std::vector<int64_t> asked = {60, 61, 0, 107, 115, 62, 62, 30};
  const std::vector<float> got = split.gather_rows(asked, rows.data(), kWidth, kLayer);
  for (size_t i = 0; i < asked.size(); ++i) {
    const auto t = static_cast<size_t>(asked[i]);
    EXPECT_EQ(got[i * kWidth], static_cast<float>(step.positions[t])) << "row " << asked[i];
    EXPECT_EQ(got[i * kWidth + 1], static_cast<float>(step.slot_mapping[t])) << "row " << asked[i];
  }
  EXPECT_EQ(got[1 * kWidth + 2], static_cast<float>(g_world->rank()));  // the decode row: local
}

TEST_P(ContextParallel, KdaPiecesOnManyRanksEqualWholeSequences) {
  const uint32_t seed = shared_seed();
  const Dense w =
      make_dense({.bounded = false, .low_rank = true, .a_log_lo = -4.0f, .a_log_hi = -1.0f}, seed);
  const KdaBlock block = make_block(w);
  const Step step(kSequences);
  std::mt19937 rng(seed + 1);
  const std::vector<float> prefix = random_values(rng, 13 * kHidden, 1.0f, true);
  const std::vector<float> x = random_values(rng, step.batch.num_tokens() * kHidden, 1.0f, true);
  const ExecContext ctx{.num_threads = 1};
  const std::vector<LayerCacheSpec> layers = {
      {.kda = {.num_heads = kHeads, .head_dim = kHeadDim, .conv_width = kWidth}}};
  // The two continued sequences' prefixes, then the step: whole, and split over the ranks.
  std::vector<float> outputs[2];
  std::vector<KvCache> caches;
  const ContextSplit split(step.batch, *g_world, GetParam());
  for (int run = 0; run < 2; ++run) {
    Result<KvCache> created = KvCache::create(layers, 1, kBlockSize, 5);
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    caches.push_back(std::move(created).value());
    const KdaLayerState state = caches.back().kda_layer(0);
    for (int32_t slot : {2, 3}) {
      const Step first({{13, 0, slot}});
      Arena arena(block.scratch_bytes(ctx, 13));
      std::vector<float> out(static_cast<size_t>(13 * kHidden));
      block.forward(ctx, first.batch, prefix.data(), state, out.data(), arena, nullptr, kLayer);
    }
    const ForwardBatch& batch = run == 0 ? step.batch : split.local();
    std::vector<float> in;  // the batch's rows of x
    for (int64_t l = 0; l < batch.num_tokens(); ++l)
      for (int64_t t = 0; t < step.batch.num_tokens(); ++t)
        if (step.slot_mapping[static_cast<size_t>(t)] == batch.slot_mapping[static_cast<size_t>(l)])
          in.insert(in.end(), x.begin() + t * kHidden, x.begin() + (t + 1) * kHidden);
    Arena arena(block.scratch_bytes(ctx, batch.num_tokens()));
    outputs[run].resize(static_cast<size_t>(batch.num_tokens() * kHidden));
    block.forward(ctx, batch, in.data(), state, outputs[run].data(), arena, nullptr, kLayer);
  }
  // This rank's rows of the whole run, in its local order.
  const ForwardBatch& local = split.local();
  std::vector<float> want;
  for (int64_t l = 0; l < local.num_tokens(); ++l)
    for (int64_t t = 0; t < step.batch.num_tokens(); ++t)
      if (step.slot_mapping[static_cast<size_t>(t)] == local.slot_mapping[static_cast<size_t>(l)])
        want.insert(want.end(), outputs[0].begin() + t * kHidden,
                    outputs[0].begin() + (t + 1) * kHidden);
  const auto rel_rms = [](const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      num += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
      den += double{a[i]} * a[i];
    }
    return std::sqrt(num / den);
  };
  EXPECT_LT(rel_rms(want, outputs[1]), 1e-3) << "rank " << g_world->rank();
  for (int32_t slot : {1, 2, 3, 4}) {
    const KdaLayerState whole = caches[0].kda_layer(0), parts = caches[1].kda_layer(0);
    const std::vector<float> a(whole.state(slot), whole.state(slot) + whole.layout.state_floats());
    const std::vector<float> b(parts.state(slot), parts.state(slot) + parts.layout.state_floats());
    EXPECT_LT(rel_rms(a, b), 1e-5) << "slot " << slot;
    EXPECT_TRUE(std::equal(whole.conv_rows(slot), whole.conv_rows(slot) + whole.layout.conv_elems(),
                           parts.conv_rows(slot)))
        << "slot " << slot << " conv rows";
  }
}

// Copy-on-write in a sharded cache: block 3's first rows into a block of another rank (4 at 2
// ranks, 5 at 4: a broadcast) and into one of the same rank (3 + C: a local copy). Every row byte
// is a function of the seed, its block, row and offset, so a wrong source, row or run shows.
TEST(ContextParallelCache, CopiesBetweenRanksMoveTheRowsOnce) {
  const uint32_t seed = shared_seed();
  const int C = g_world->size(), r = g_world->rank();
  const std::vector<LayerCacheSpec> layers = {
      {.mla = {.latent_dim = 128, .rope_dim = 16, .dtype = kernels::KvCacheDtype::kFp8},
       .index_key_dim = 32},
      {.mla = {.latent_dim = 64, .rope_dim = 16, .dtype = kernels::KvCacheDtype::kBf16}}};
  const int64_t num_blocks = 4 * C;
  Result<KvCache> created =
      KvCache::create(layers, num_blocks, kBlockSize, 0, {.count = C, .index = r});
  ASSERT_TRUE(created.ok()) << created.status().to_string();
  KvCache& cache = *created;
  const int64_t per_row = cache.bytes_per_token();
  // Block b's rows as block_rows() gives them: per pool run, the run's bytes.
  const auto fill = [&](int32_t block) {
    std::vector<std::byte> rows = cache.block_rows(block, kBlockSize);
    for (size_t i = 0; i < rows.size(); ++i)
      rows[i] = static_cast<std::byte>((seed + static_cast<uint32_t>(block) * 977 + i * 13) & 0xff);
    cache.set_block_rows(block, kBlockSize, rows);
    return rows;
  };
  std::vector<std::vector<std::byte>> want(static_cast<size_t>(num_blocks));
  for (int32_t b = 0; b < num_blocks; ++b)
    if (cache.shard().stores(b)) want[static_cast<size_t>(b)] = fill(b);
  // The rows of block 3 as its rank holds them, for every rank to compare with.
  std::vector<std::byte> source(static_cast<size_t>(kBlockSize * per_row));
  if (cache.shard().stores(3)) source = cache.block_rows(3, kBlockSize);
  g_world->broadcast(source, 3 % C, -1);
  constexpr int64_t kRows = 5;
  const int32_t other = 4 + (C == 4 ? 1 : 0), same = 3 + C;
  g_world->stats().reset();
  copy_block_rows_between_ranks(cache, *g_world, 3, other, kRows);
  EXPECT_EQ(g_world->stats().total().bytes_received, r == 3 % C ? 0 : kRows * per_row);
  copy_block_rows_between_ranks(cache, *g_world, 3, same, kRows);
  // Expected in each destination: the first kRows rows of each pool run of block 3 (per layer the
  // records, for layer 0 then the keys and the scales, each run kBlockSize rows long), the rest as
  // filled.
  for (int32_t to : {other, same}) {
    if (!cache.shard().stores(to)) continue;
    std::vector<std::byte> expected = want[static_cast<size_t>(to)];
    size_t at = 0;
    for (int64_t bytes : {cache.mla_layer(0).layout.record_bytes(), int64_t{32}, int64_t{4},
                          cache.mla_layer(1).layout.record_bytes()}) {
      std::copy_n(source.begin() + static_cast<std::ptrdiff_t>(at), kRows * bytes,
                  expected.begin() + static_cast<std::ptrdiff_t>(at));
      at += static_cast<size_t>(kBlockSize * bytes);
    }
    EXPECT_EQ(cache.block_rows(to, kBlockSize), expected) << "block " << to;
  }
  for (int32_t b = 0; b < num_blocks; ++b) {  // every other block untouched
    if (cache.shard().stores(b) && b != other && b != same) {
      EXPECT_EQ(cache.block_rows(b, kBlockSize), want[static_cast<size_t>(b)]) << "block " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallel,
                         ::testing::Values(ContextLayout::kZigzag, ContextLayout::kContiguous));

}  // namespace
}  // namespace dz::model

int main(int argc, char** argv) {
  return dz::dist::mpi_test_main(argc, argv, dz::model::g_world);
}
