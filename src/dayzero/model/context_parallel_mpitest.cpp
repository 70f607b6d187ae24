// Context parallelism across ranks (docs/parallel.md §9), run by mpirun at 2 and 4 ranks
// (model/CMakeLists.txt), both layouts:
// - the cache rows each rank writes for its pieces reach every rank, byte for byte, and each rank
//   receives exactly the other ranks' rows;
// - rows asked for by full-step index come back from the rank that ran them;
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

TEST_P(ContextParallel, CacheRowsReachEveryRank) {
  const Step step(kSequences);
  const ContextSplit split(step.batch, *g_world, GetParam());
  ASSERT_EQ(split.num_split(), 3);
  const kernels::MlaCacheLayout mla{.latent_dim = 128, .rope_dim = 32};
  const kernels::IndexCacheLayout index{.key_dim = 128, .block_size = kBlockSize};
  const uint32_t seed = shared_seed();
  // The byte a token's row holds at offset i: a function of the seed, the token and i.
  const auto byte_of = [seed](int64_t t, int64_t i) {
    return static_cast<std::byte>((seed + static_cast<uint32_t>(t * 131 + i * 7)) & 0xff);
  };
  const int64_t slots = step.num_blocks() * kBlockSize;
  std::vector<std::byte> mla_pool(static_cast<size_t>(slots * mla.record_bytes()), std::byte{0});
  std::vector<std::byte> index_pool(static_cast<size_t>(step.num_blocks() * index.block_bytes()),
                                    std::byte{0});
  // Each rank writes its own tokens' rows (every rank: the whole sequences').
  const ForwardBatch& local = split.local();
  std::vector<int64_t> full_of_local;
  for (int64_t t = 0; t < step.batch.num_tokens(); ++t)
    for (int64_t l = 0; l < local.num_tokens(); ++l)
      if (local.slot_mapping[static_cast<size_t>(l)] == step.slot_mapping[static_cast<size_t>(t)])
        full_of_local.push_back(t);
  ASSERT_EQ(static_cast<int64_t>(full_of_local.size()), local.num_tokens());
  for (int64_t t : full_of_local) {
    const int64_t slot = step.slot_mapping[static_cast<size_t>(t)];
    for (int64_t i = 0; i < mla.record_bytes(); ++i)
      mla_pool[static_cast<size_t>(slot * mla.record_bytes() + i)] = byte_of(t, i);
    for (int64_t i = 0; i < index.key_dim; ++i)
      index_pool[static_cast<size_t>(index.key_offset_bytes(slot) + i)] = byte_of(t, i);
    for (int64_t i = 0; i < 4; ++i)
      index_pool[static_cast<size_t>(index.scale_offset_bytes(slot) + i)] = byte_of(t, 1000 + i);
  }
  g_world->stats().reset();
  split.share_mla_records(mla, mla_pool.data(), kLayer);
  const int64_t received = g_world->stats().total().bytes_received;
  split.share_index_keys(index, index_pool.data(), kLayer);
  for (int64_t t = 0; t < step.batch.num_tokens(); ++t) {
    const int64_t slot = step.slot_mapping[static_cast<size_t>(t)];
    for (int64_t i = 0; i < mla.record_bytes(); ++i)
      ASSERT_EQ(mla_pool[static_cast<size_t>(slot * mla.record_bytes() + i)], byte_of(t, i))
          << "token " << t << " byte " << i;
    for (int64_t i = 0; i < index.key_dim; ++i)
      ASSERT_EQ(index_pool[static_cast<size_t>(index.key_offset_bytes(slot) + i)], byte_of(t, i))
          << "token " << t << " key byte " << i;
    for (int64_t i = 0; i < 4; ++i)
      ASSERT_EQ(index_pool[static_cast<size_t>(index.scale_offset_bytes(slot) + i)],
                byte_of(t, 1000 + i))
          << "token " << t << " scale byte " << i;
  }
  // Received: the split tokens the other ranks ran, one record each.
  const int64_t split_tokens = 61 + 45 + 9;
  const int64_t mine = local.num_tokens() - 1;  // less the decode row
  EXPECT_EQ(received, (split_tokens - mine) * mla.record_bytes());
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

INSTANTIATE_TEST_SUITE_P(Layouts, ContextParallel,
                         ::testing::Values(ContextLayout::kZigzag, ContextLayout::kContiguous));

}  // namespace
}  // namespace dz::model

int main(int argc, char** argv) {
  return dz::dist::mpi_test_main(argc, argv, dz::model::g_world);
}
