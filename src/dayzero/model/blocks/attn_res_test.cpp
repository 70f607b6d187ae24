// AttnRes mix (attn_res.h, docs/models.md §5) on fresh random rows: the FP32 direct and two-phase
// forms against the FP64 oracle and each other, the properties §5 lists (zero query → uniform
// average, one row → the row, row order irrelevant), and rows of extreme magnitudes. Tolerance:
// relative RMS per token < 1e-6 — FP32 dot products and sums of 256 terms are accurate to ~1e-7
// relative, and the queries keep |s| ≲ 5, so a score error δs ≈ |s|·1e-7 moves the weights by about
// as much.
#include "dayzero/model/blocks/attn_res.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace dz::model {
namespace attn_res_test {

// FP32 kernels against the FP64 reference, per token (docs/models.md §8.1: 1e-5). Typical errors
// are 1e-7; rows of mixed magnitudes (1e-20 … 1e20) reached 1.4e-6 in one of a few hundred seeds.
constexpr double kTolerance = 1e-5;
constexpr float kEps = 1e-5f;  // K3 rms_norm_eps
const ExecContext kCtx{2};

struct Rows {
  std::vector<std::vector<float>> values;  // [R][T, d]
  std::vector<const float*> pointers() const {
    std::vector<const float*> p;
    for (const auto& v : values) p.push_back(v.data());
    return p;
  }
};

// R rows [T, d] ~ N(0, scale_j²), scale_j drawn from `scales` (cycled).
Rows random_rows(std::mt19937& rng, int64_t num_rows, int64_t num_tokens, int64_t dim,
                 const std::vector<float>& scales = {1.0f}) {
  Rows rows;
  for (int64_t j = 0; j < num_rows; ++j) {
    std::normal_distribution<float> normal(0.0f, scales[static_cast<size_t>(j) % scales.size()]);
    std::vector<float> v(static_cast<size_t>(num_tokens * dim));
    for (float& e : v) e = normal(rng);
    rows.values.push_back(std::move(v));
  }
  return rows;
}

std::vector<float> random_query(std::mt19937& rng, int64_t dim, float stddev) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> proj(static_cast<size_t>(dim)), norm(proj.size());
  for (float& e : proj) e = normal(rng);
  for (float& e : norm) e = 1.0f + 0.2f * normal(rng) / stddev;
  return attn_res_folded_query(proj, norm);
}

// max over tokens of ‖y_t − ref_t‖ / ‖ref_t‖.
double max_token_rel_rms(const std::vector<float>& y, const std::vector<float>& ref, int64_t dim) {
  double worst = 0;
  for (size_t t = 0; t * dim < y.size(); ++t) {
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < dim; ++i) {
      const double r = ref[t * dim + i], e = y[t * dim + i] - r;
      err2 += e * e;
      ref2 += r * r;
    }
    worst = std::max(worst, std::sqrt(err2 / ref2));
  }
  return worst;
}

struct Outputs {
  std::vector<float> direct, two_phase, ref;
};

Outputs mix_all(const Rows& rows, int64_t prefix_row, const std::vector<float>& query,
                int64_t num_tokens, int64_t dim) {
  const std::vector<const float*> p = rows.pointers();
  Outputs o;
  o.direct.resize(static_cast<size_t>(num_tokens * dim));
  o.two_phase.resize(o.direct.size());
  o.ref.resize(o.direct.size());
  attn_res_mix(kCtx, p, query.data(), num_tokens, dim, kEps, o.direct.data());
  attn_res_mix_two_phase(kCtx, p, prefix_row, query.data(), num_tokens, dim, kEps,
                         o.two_phase.data());
  attn_res_mix_ref(kCtx, p, query.data(), num_tokens, dim, kEps, o.ref.data());
  return o;
}

TEST(AttnRes, FoldedQueryIsTheProduct) {
  const std::vector<float> proj{1.5f, -2.0f, 0.25f}, norm{2.0f, 0.5f, -4.0f};
  EXPECT_EQ(attn_res_folded_query(proj, norm), (std::vector<float>{3.0f, -1.0f, -1.0f}));
}

TEST(AttnRes, MatchesTheDoubleReferenceAndTwoPhaseMatchesDirect) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int64_t dim : {256, 203}) {  // 203: a tail after the 16-lane loop
    for (int64_t num_rows : {1, 2, 5, 9}) {
      const int64_t num_tokens = 37;
      const Rows rows = random_rows(rng, num_rows, num_tokens, dim, {1.0f, 3.0f, 0.5f});
      const std::vector<float> query = random_query(rng, dim, 0.1f);
      for (int64_t prefix_row : {num_rows - 1, num_rows / 2}) {
        SCOPED_TRACE(::testing::Message()
                     << "d " << dim << " rows " << num_rows << " prefix " << prefix_row);
        const Outputs o = mix_all(rows, prefix_row, query, num_tokens, dim);
        EXPECT_LT(max_token_rel_rms(o.direct, o.ref, dim), kTolerance);
        EXPECT_LT(max_token_rel_rms(o.two_phase, o.ref, dim), kTolerance);
        EXPECT_LT(max_token_rel_rms(o.two_phase, o.direct, dim), kTolerance);
      }
    }
  }
}

TEST(AttnRes, ZeroProjectionGivesTheUniformAverage) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t dim = 128, num_tokens = 11, num_rows = 6;
  const Rows rows = random_rows(rng, num_rows, num_tokens, dim, {1.0f, 10.0f, 0.1f});
  std::vector<float> norm(static_cast<size_t>(dim));
  std::normal_distribution<float> normal(1.0f, 0.5f);
  for (float& e : norm) e = normal(rng);
  const std::vector<float> query =
      attn_res_folded_query(std::vector<float>(static_cast<size_t>(dim), 0.0f), norm);
  std::vector<float> average(static_cast<size_t>(num_tokens * dim));
  for (size_t i = 0; i < average.size(); ++i) {
    double sum = 0;
    for (const auto& v : rows.values) sum += v[i];
    average[i] = static_cast<float>(sum / num_rows);
  }
  const Outputs o = mix_all(rows, num_rows - 1, query, num_tokens, dim);
  EXPECT_LT(max_token_rel_rms(o.direct, average, dim), kTolerance);
  EXPECT_LT(max_token_rel_rms(o.two_phase, average, dim), kTolerance);
  EXPECT_LT(max_token_rel_rms(o.ref, average, dim), kTolerance);
}

TEST(AttnRes, OneRowReturnsTheRow) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t dim = 96, num_tokens = 5;
  const Rows rows = random_rows(rng, 1, num_tokens, dim, {7.0f});
  const Outputs o = mix_all(rows, 0, random_query(rng, dim, 1.0f), num_tokens, dim);
  EXPECT_EQ(o.direct, rows.values[0]);  // weight exp(0)/1 = 1 exactly
  EXPECT_EQ(o.two_phase, rows.values[0]);
  EXPECT_EQ(o.ref, rows.values[0]);
}

TEST(AttnRes, InvariantToRowOrder) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t dim = 160, num_tokens = 13, num_rows = 8;
  Rows rows = random_rows(rng, num_rows, num_tokens, dim, {1.0f, 2.0f, 0.5f});
  const std::vector<float> query = random_query(rng, dim, 0.1f);
  const Outputs before = mix_all(rows, num_rows - 1, query, num_tokens, dim);
  std::shuffle(rows.values.begin(), rows.values.end(), rng);
  std::reverse(rows.values.begin(), rows.values.end());  // a change even if shuffle kept the order
  const Outputs after = mix_all(rows, 2, query, num_tokens, dim);
  EXPECT_LT(max_token_rel_rms(after.direct, before.direct, dim), kTolerance);
  EXPECT_LT(max_token_rel_rms(after.two_phase, before.direct, dim), kTolerance);
  EXPECT_LT(max_token_rel_rms(after.ref, before.ref, dim), 1e-12);
}

// Rows from 1e-20 (mean(v²) far below ε, underflowing FP32) to 1e20 (v² overflows FP32: the
// score is taken in double) in one mix; the score is scale-invariant but for ε, so every row still
// gets a sensible weight.
TEST(AttnRes, RowsOfHugeAndTinyMagnitude) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t dim = 256, num_tokens = 23, num_rows = 7;
  const Rows rows =
      random_rows(rng, num_rows, num_tokens, dim, {1e-20f, 1e20f, 1e-3f, 1.0f, 1e12f, 1e-8f});
  const std::vector<float> query = random_query(rng, dim, 0.1f);
  for (int64_t prefix_row : {int64_t{0}, int64_t{1}, num_rows - 1}) {
    SCOPED_TRACE(::testing::Message() << "prefix " << prefix_row);
    const Outputs o = mix_all(rows, prefix_row, query, num_tokens, dim);
    for (float v : o.direct) ASSERT_TRUE(std::isfinite(v));
    EXPECT_LT(max_token_rel_rms(o.direct, o.ref, dim), kTolerance);
    EXPECT_LT(max_token_rel_rms(o.two_phase, o.ref, dim), kTolerance);
  }
  // Only tiny rows: the output is of their size, not flushed to zero or blown up by ε.
  const Rows tiny = random_rows(rng, 3, num_tokens, dim, {1e-20f, 3e-20f});
  const Outputs o = mix_all(tiny, 2, query, num_tokens, dim);
  EXPECT_LT(max_token_rel_rms(o.direct, o.ref, dim), kTolerance);
  EXPECT_LT(max_token_rel_rms(o.two_phase, o.ref, dim), kTolerance);
}

// Large pseudo-queries (|s| up to ~1e3): exp(s) would overflow without the max subtraction. The
// FP32 score, a 256-term dot product, carries an absolute error up to ~|s|·sqrt(d)·2^-24 ≈ 1e-3,
// which the softmax turns into a relative weight error of the same size (seen: up to 1.7e-4),
// hence the looser 1e-3 here.
TEST(AttnRes, LargeScoresStayFinite) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t dim = 256, num_tokens = 19, num_rows = 9;
  const Rows rows = random_rows(rng, num_rows, num_tokens, dim, {1.0f, 2.0f});
  const std::vector<float> query = random_query(rng, dim, 50.0f);
  const Outputs o = mix_all(rows, num_rows - 1, query, num_tokens, dim);
  for (float v : o.direct) ASSERT_TRUE(std::isfinite(v));
  for (float v : o.two_phase) ASSERT_TRUE(std::isfinite(v));
  EXPECT_LT(max_token_rel_rms(o.direct, o.ref, dim), 1e-3);
  EXPECT_LT(max_token_rel_rms(o.two_phase, o.ref, dim), 1e-3);
}

TEST(AttnRes, PhasesCompose) {
  // Phase 1 over no rows, then the merge, is the one-row mix of the prefix.
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t dim = 64, num_tokens = 4;
  const Rows rows = random_rows(rng, 1, num_tokens, dim);
  const std::vector<float> query = random_query(rng, dim, 1.0f);
  std::vector<float> max_score(num_tokens), sum_exp(num_tokens), acc(num_tokens * dim, 1.0f);
  attn_res_partial(kCtx, {}, query.data(), num_tokens, dim, kEps, max_score.data(), sum_exp.data(),
                   acc.data());
  for (int64_t t = 0; t < num_tokens; ++t) {
    EXPECT_EQ(max_score[t], -std::numeric_limits<float>::infinity());
    EXPECT_EQ(sum_exp[t], 0.0f);
  }
  std::vector<float> out(num_tokens * dim);
  attn_res_merge(kCtx, rows.values[0].data(), query.data(), num_tokens, dim, kEps, max_score.data(),
                 sum_exp.data(), acc.data(), out.data());
  EXPECT_EQ(out, rows.values[0]);
}

}  // namespace attn_res_test
}  // namespace dz::model
