#include "dayzero/kernels/lightning_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"

namespace dz::kernels {
namespace lightning_indexer_test {

// A sequence of random keys in a paged index cache with a shuffled block table, and the source
// arrays the cache was filled from (so layout bugs show against a reference that never reads the
// cache).
struct KeyFixture {
  IndexCacheLayout layout;
  std::vector<std::byte> pool;
  std::vector<int32_t> block_table;
  std::vector<uint8_t> codes;  // [num_keys, key_dim]
  std::vector<float> scales;   // [num_keys]

  IndexKeyCache cache() const { return IndexKeyCache{layout, pool.data(), block_table}; }
};

// Values: act_quant (ue8m0) of random normal BF16 vectors, or (exact_values) codes of
// {0, ±0.5, ±1, ±2} with power-of-two scales so that every FP32 sum in both variants is exact.
void quantize_row(std::mt19937& rng, int64_t dim, bool exact_values, uint8_t* codes, float* scale) {
  if (exact_values) {
    const float values[] = {0.0f, 0.5f, -0.5f, 1.0f, -1.0f, 2.0f, -2.0f};
    std::uniform_int_distribution<int> pick(0, 6);
    for (int64_t d = 0; d < dim; ++d) codes[d] = formats::encode_e4m3(values[pick(rng)]);
    *scale = std::ldexp(1.0f, std::uniform_int_distribution<int>(-3, 3)(rng));
    return;
  }
  std::normal_distribution<float> normal(0.0f, std::exp(std::normal_distribution<float>()(rng)));
  std::vector<uint16_t> bf16(static_cast<size_t>(dim));
  for (auto& v : bf16) v = formats::encode_bf16(normal(rng));
  formats::act_quant(bf16, formats::ActScaleFormat::kUe8m0,
                     std::span<uint8_t>(codes, static_cast<size_t>(dim)),
                     std::span<float>(scale, 1));
}

KeyFixture make_keys(std::mt19937& rng, int64_t num_keys, int64_t block_size, bool exact_values,
                     int64_t num_duplicates = 0) {
  KeyFixture f;
  f.layout = IndexCacheLayout{.key_dim = 128, .block_size = block_size};
  const int64_t num_blocks = (num_keys + block_size - 1) / block_size;
  const int64_t num_physical = num_blocks + 3;  // spare blocks hold garbage
  f.pool.resize(static_cast<size_t>(num_physical * f.layout.block_bytes()));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : f.pool) b = static_cast<std::byte>(byte(rng));
  std::vector<int32_t> physical(static_cast<size_t>(num_physical));
  std::iota(physical.begin(), physical.end(), 0);
  std::shuffle(physical.begin(), physical.end(), rng);
  f.block_table.assign(physical.begin(), physical.begin() + num_blocks);
  f.codes.resize(static_cast<size_t>(num_keys * 128));
  f.scales.resize(static_cast<size_t>(num_keys));
  for (int64_t s = 0; s < num_keys; ++s)
    quantize_row(rng, 128, exact_values, &f.codes[static_cast<size_t>(s * 128)],
                 &f.scales[static_cast<size_t>(s)]);
  // Exact duplicates of earlier keys: equal scores in every variant, so ties meet the rule.
  std::uniform_int_distribution<int64_t> any_key(0, std::max<int64_t>(num_keys - 1, 0));
  for (int64_t i = 0; i < num_duplicates && num_keys > 1; ++i) {
    const int64_t from = any_key(rng), to = any_key(rng);
    std::memcpy(&f.codes[static_cast<size_t>(to * 128)], &f.codes[static_cast<size_t>(from * 128)],
                128);
    f.scales[static_cast<size_t>(to)] = f.scales[static_cast<size_t>(from)];
  }
  for (int64_t s = 0; s < num_keys; ++s) {
    const int64_t slot =
        int64_t{f.block_table[static_cast<size_t>(s / block_size)]} * block_size + s % block_size;
    std::memcpy(f.pool.data() + f.layout.key_offset_bytes(slot),
                &f.codes[static_cast<size_t>(s * 128)], 128);
    std::memcpy(f.pool.data() + f.layout.scale_offset_bytes(slot),
                &f.scales[static_cast<size_t>(s)], 4);
  }
  return f;
}

struct QueryFixture {
  int64_t num_heads = 0;
  std::vector<uint8_t> codes;  // [num_queries, num_heads, 128]
  std::vector<float> weights;  // [num_queries, num_heads]
  std::vector<int32_t> positions;

  IndexerQueries queries() const {
    return IndexerQueries{codes.data(), weights.data(), positions, num_heads};
  }
};

QueryFixture make_queries(std::mt19937& rng, int64_t num_heads, std::vector<int32_t> positions,
                          bool exact_values) {
  QueryFixture f;
  f.num_heads = num_heads;
  f.positions = std::move(positions);
  const auto num_rows = f.positions.size() * static_cast<size_t>(num_heads);
  f.codes.resize(num_rows * 128);
  f.weights.resize(num_rows);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> eighths(-64, 64);
  for (size_t r = 0; r < num_rows; ++r) {
    float q_scale;
    quantize_row(rng, 128, exact_values, &f.codes[r * 128], &q_scale);
    // Weights of both signs; exact mode uses multiples of 1/8 (sums stay exact in FP32).
    f.weights[r] =
        exact_values ? static_cast<float>(eighths(rng)) / 8.0f : normal(rng) * q_scale * 0.0110485f;
  }
  return f;
}

struct Output {
  std::vector<int32_t> selection;
  std::vector<float> scores;
};

Output run(const ExecContext& ctx, const KeyFixture& keys, const QueryFixture& queries,
           int64_t top_k, IndexerVariant variant) {
  Output out;
  const size_t num_values = queries.positions.size() * static_cast<size_t>(top_k);
  out.selection.assign(num_values, 12345);
  out.scores.assign(num_values, 12345.0f);
  AlignedBuffer workspace(
      lightning_indexer_workspace_bytes(ctx, keys.cache(), queries.queries(), top_k));
  lightning_indexer(ctx, keys.cache(), queries.queries(), top_k, out.selection, out.scores,
                    workspace.bytes(), variant);
  return out;
}

// FP64 score and its magnitude M = sk · Σ_h |w_h| · Σ_d |q_hd k_d| from the source arrays. Each
// FP32 variant sums key_dim + num_heads + 1 terms, so it is within (key_dim + num_heads + 2) ·
// 2^-24 · M of the exact value; two variants differ by at most twice that.
struct Exact {
  double score;
  double bound;
};

Exact exact_score(const KeyFixture& keys, const QueryFixture& queries, size_t t, int64_t s) {
  const int64_t num_heads = queries.num_heads;
  double sum = 0, magnitude = 0;
  for (int64_t h = 0; h < num_heads; ++h) {
    double dot = 0, dot_abs = 0;
    for (int64_t d = 0; d < 128; ++d) {
      const double p = double{formats::decode_e4m3(queries.codes[(t * num_heads + h) * 128 + d])} *
                       formats::decode_e4m3(keys.codes[static_cast<size_t>(s * 128 + d)]);
      dot += p;
      dot_abs += std::abs(p);
    }
    const double w = queries.weights[t * num_heads + h];
    sum += w * std::max(dot, 0.0);
    magnitude += std::abs(w) * dot_abs;
  }
  const double sk = keys.scales[static_cast<size_t>(s)];
  return Exact{sk * sum, 2.0 * static_cast<double>(128 + num_heads + 2) * 0x1p-24 * sk * magnitude};
}

// The selection in rank order by the tie rule from FP64 scores (exact when the data are
// exact_values).
std::vector<int32_t> expected_selection(const KeyFixture& keys, const QueryFixture& queries,
                                        size_t t, int64_t top_k) {
  const int64_t num_visible = int64_t{queries.positions[t]} + 1;
  std::vector<std::pair<double, int32_t>> row;
  for (int64_t s = 0; s < num_visible; ++s)
    row.emplace_back(exact_score(keys, queries, t, s).score, static_cast<int32_t>(s));
  std::sort(row.begin(), row.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::vector<int32_t> chosen;
  for (int64_t i = 0; i < std::min(top_k, num_visible); ++i) chosen.push_back(row[i].second);
  chosen.resize(static_cast<size_t>(top_k), -1);
  return chosen;
}

// Checks one variant's output against FP64: scores within the bound, padding, rank order of its own
// scores, and a selected set that differs from the exact one only by swaps the bound explains.
void expect_within_bound(const KeyFixture& keys, const QueryFixture& queries, int64_t top_k,
                         const Output& out) {
  for (size_t t = 0; t < queries.positions.size(); ++t) {
    SCOPED_TRACE(::testing::Message() << "query " << t << " at " << queries.positions[t]);
    const int64_t num_chosen = std::min<int64_t>(top_k, queries.positions[t] + 1);
    const int32_t* sel = &out.selection[t * static_cast<size_t>(top_k)];
    const float* sc = &out.scores[t * static_cast<size_t>(top_k)];
    for (int64_t i = num_chosen; i < top_k; ++i) {
      ASSERT_EQ(sel[i], -1);
      ASSERT_EQ(sc[i], -INFINITY);
    }
    for (int64_t i = 0; i < num_chosen; ++i) {
      ASSERT_TRUE(sel[i] >= 0 && sel[i] <= queries.positions[t]) << sel[i];
      if (i > 0) {
        ASSERT_TRUE(sc[i - 1] > sc[i] || (sc[i - 1] == sc[i] && sel[i - 1] < sel[i])) << i;
      }
      const Exact e = exact_score(keys, queries, t, sel[i]);
      ASSERT_LE(std::abs(sc[i] - e.score), e.bound) << "position " << sel[i];
    }
    const auto want = expected_selection(keys, queries, t, top_k);
    std::set<int32_t> got_set(sel, sel + num_chosen),
        want_set(want.begin(), want.begin() + num_chosen);
    double lowest_in = INFINITY, highest_out = -INFINITY;
    for (int32_t p : got_set)
      if (!want_set.count(p)) {
        const Exact e = exact_score(keys, queries, t, p);
        lowest_in = std::min(lowest_in, e.score + e.bound);
      }
    for (int32_t p : want_set)
      if (!got_set.count(p)) {
        const Exact e = exact_score(keys, queries, t, p);
        highest_out = std::max(highest_out, e.score - e.bound);
      }
    ASSERT_GE(lowest_in, highest_out) << "a swap larger than the rounding bound";
  }
}

std::vector<IndexerVariant> variants() {
  std::vector<IndexerVariant> v = {IndexerVariant::kRef};
  if (lightning_indexer_avx512_available(
          IndexKeyCache{IndexCacheLayout{.key_dim = 128, .block_size = 16}, nullptr, {}}))
    v.push_back(IndexerVariant::kAvx512);
  if (lightning_indexer_avx512_bf16_available(
          IndexKeyCache{IndexCacheLayout{.key_dim = 128, .block_size = 16}, nullptr, {}}))
    v.push_back(IndexerVariant::kAvx512Bf16);
  if (lightning_indexer_amx_available(
          IndexKeyCache{IndexCacheLayout{.key_dim = 128, .block_size = 16}, nullptr, {}}))
    v.push_back(IndexerVariant::kAmx);
  return v;
}

std::vector<int32_t> range_positions(int32_t begin, int32_t count) {
  std::vector<int32_t> positions(static_cast<size_t>(count));
  std::iota(positions.begin(), positions.end(), begin);
  return positions;
}

struct Case {
  int64_t num_heads, block_size, top_k, num_keys;
  std::vector<int32_t> positions;
  int threads;
};

std::vector<Case> cases() {
  return {
      {8, 16, 16, 100, range_positions(0, 100), 2},      // tiny config: prefill from 0
      {64, 64, 50, 300, range_positions(280, 20), 2},    // chunk after cached keys
      {1, 16, 7, 90, range_positions(60, 30), 1},        // one head: half the scores are 0
      {20, 32, 33, 129, range_positions(100, 29), 3},    // heads not a multiple of 16
      {80, 16, 5, 70, range_positions(60, 10), 2},       // more than 64 heads
      {64, 16, 40, 1000, {999}, 3},                      // decode: keys split over workers
      {8, 64, 64, 64 * 9 + 5, {64 * 9 + 4, 200, 3}, 2},  // rows out of order, dense rows
      {16, 16, 1, 40, range_positions(0, 40), 2},        // top-1
      {32, 32, 6, 3000, {2999, 1234, 7}, 2},             // many compactions of the kept buffer
  };
}

TEST(LightningIndexer, EveryVariantIsWithinTheRoundingBoundOfFp64) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.num_heads << " block " << c.block_size
                                      << " top_k " << c.top_k << " keys " << c.num_keys);
    const KeyFixture keys = make_keys(rng, c.num_keys, c.block_size, false, c.num_keys / 5);
    const QueryFixture queries = make_queries(rng, c.num_heads, c.positions, false);
    for (IndexerVariant variant : variants()) {
      SCOPED_TRACE(::testing::Message() << "variant " << static_cast<int>(variant));
      expect_within_bound(keys, queries, c.top_k,
                          run(ExecContext{c.threads}, keys, queries, c.top_k, variant));
    }
  }
}

// With values whose every FP32 sum is exact, the summation order cannot matter: every variant must
// return exactly the FP64 selection, including the many exact ties (broken by lower position).
TEST(LightningIndexer, ExactDataGiveTheExactSelectionAndTieOrder) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const Case& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "heads " << c.num_heads << " top_k " << c.top_k);
    if (c.num_heads > 64) continue;  // keeps Σ_h within 24 bits
    const KeyFixture keys = make_keys(rng, c.num_keys, c.block_size, true, c.num_keys / 3);
    const QueryFixture queries = make_queries(rng, c.num_heads, c.positions, true);
    for (IndexerVariant variant : variants()) {
      SCOPED_TRACE(::testing::Message() << "variant " << static_cast<int>(variant));
      const Output out = run(ExecContext{c.threads}, keys, queries, c.top_k, variant);
      for (size_t t = 0; t < queries.positions.size(); ++t) {
        const auto want = expected_selection(keys, queries, t, c.top_k);
        const std::vector<int32_t> got(
            out.selection.begin() + static_cast<ptrdiff_t>(t * c.top_k),
            out.selection.begin() + static_cast<ptrdiff_t>((t + 1) * c.top_k));
        ASSERT_EQ(got, want) << "query " << t;
        for (int64_t i = 0; i < c.top_k && got[i] >= 0; ++i)
          ASSERT_EQ(out.scores[t * c.top_k + i], exact_score(keys, queries, t, got[i]).score);
      }
    }
  }
}

TEST(LightningIndexer, DenseWhileEveryVisibleKeyFits) {
  std::mt19937 rng(7);
  const KeyFixture keys = make_keys(rng, 80, 16, false);
  const QueryFixture queries = make_queries(rng, 8, range_positions(0, 80), false);
  for (IndexerVariant variant : variants()) {
    const Output out = run(ExecContext{2}, keys, queries, 80, variant);
    for (int32_t t = 0; t < 80; ++t) {
      std::vector<int32_t> row(out.selection.begin() + t * 80, out.selection.begin() + t * 80 + 80);
      std::sort(row.begin(), row.begin() + t + 1);
      for (int32_t i = 0; i < 80; ++i) ASSERT_EQ(row[static_cast<size_t>(i)], i <= t ? i : -1);
    }
  }
}

TEST(LightningIndexerDeathTest, RefusesAShortWorkspaceAndBlockTable) {
  std::mt19937 rng(1);
  const KeyFixture keys = make_keys(rng, 40, 16, false);
  const QueryFixture queries = make_queries(rng, 8, {39}, false);
  std::vector<int32_t> selection(4);
  std::vector<std::byte> workspace(16);
  EXPECT_DEATH(lightning_indexer(ExecContext{1}, keys.cache(), queries.queries(), 4, selection, {},
                                 workspace),
               "workspace of 16 bytes is too small");
  const QueryFixture beyond = make_queries(rng, 8, {48}, false);
  EXPECT_DEATH(lightning_indexer(ExecContext{1}, keys.cache(), beyond.queries(), 4, selection, {},
                                 workspace),
               "block table has 3 blocks, 49 visible keys need 4");
}

}  // namespace lightning_indexer_test
}  // namespace dz::kernels
