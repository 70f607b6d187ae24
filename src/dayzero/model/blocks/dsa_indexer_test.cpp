#include "dayzero/model/blocks/dsa_indexer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>

#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"

namespace dz::model {
namespace dsa_indexer_test {

// deepseek_v32-tiny's indexer (docs/models.md §8): 8 heads × 128, rope 64 with YaRN 40 / 4096 / 32
// / 1, index_topk 16, hidden 256, q_lora_rank 128.
constexpr int64_t kHidden = 256, kRankQ = 128, kHeads = 8, kHeadDim = 128, kRope = 64, kTopK = 16;
constexpr int64_t kBlockSize = 16;

DsaIndexerConfig tiny_config(kernels::RopeLayout layout = kernels::RopeLayout::kRotateHalf) {
  kernels::YarnParams yarn{.factor = 40,
                           .original_max_position_embeddings = 4096,
                           .beta_fast = 32,
                           .beta_slow = 1,
                           .mscale = 1,
                           .mscale_all_dim = 1};
  return DsaIndexerConfig{.hidden_size = kHidden,
                          .q_lora_rank = kRankQ,
                          .index_n_heads = kHeads,
                          .index_head_dim = kHeadDim,
                          .index_topk = kTopK,
                          .rope = kernels::yarn_rope_frequencies(kRope, 10000.0, yarn),
                          .rope_layout = layout};
}

std::vector<float> normal_bf16(std::mt19937& rng, int64_t num_elems, float stddev,
                               float mean = 0.0f) {
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> v(static_cast<size_t>(num_elems));
  for (float& x : v) x = formats::round_to_bf16(normal(rng));
  return v;
}

// Weights drawn as make_tiny does (N(0, 1/in), norm weights 1 + N(0, 0.1)), stored BF16; the
// reference reads them back through dequantize(), so both sides use identical values.
struct Weights {
  std::vector<float> wq_b, wk, weights_proj, k_norm_weight, k_norm_bias;

  explicit Weights(std::mt19937& rng)
      : wq_b(normal_bf16(rng, kHeads * kHeadDim * kRankQ, 1.0f / std::sqrt(float{kRankQ}))),
        wk(normal_bf16(rng, kHeadDim * kHidden, 1.0f / std::sqrt(float{kHidden}))),
        weights_proj(normal_bf16(rng, kHeads * kHidden, 1.0f / std::sqrt(float{kHidden}))),
        k_norm_weight(normal_bf16(rng, kHeadDim, 0.1f, 1.0f)),
        k_norm_bias(normal_bf16(rng, kHeadDim, 0.1f)) {}

  DsaIndexer make(const DsaIndexerConfig& config) const {
    return DsaIndexer(
        config,
        DsaIndexerWeights{
            .wq_b = kernels::LinearWeight::from_f32_as_bf16(wq_b.data(), kHeads * kHeadDim, kRankQ),
            .wk = kernels::LinearWeight::from_f32_as_bf16(wk.data(), kHeadDim, kHidden),
            .k_norm_weight = k_norm_weight,
            .k_norm_bias = k_norm_bias,
            .weights_proj =
                kernels::LinearWeight::from_f32_as_bf16(weights_proj.data(), kHeads, kHidden)});
  }
};

// ---------------------------------------------------------------- plain reference of §3.2

struct RefOptions {
  bool interleaved = false;
  bool hadamard_q = true;
  bool hadamard_k = true;
};

// y [rows, out] = x [rows, in] · Wᵀ in FP64.
std::vector<double> linear(const std::vector<float>& x, const std::vector<float>& w, int64_t in) {
  const int64_t rows = static_cast<int64_t>(x.size()) / in,
                out = static_cast<int64_t>(w.size()) / in;
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0;
      for (int64_t i = 0; i < in; ++i)
        sum += double{x[static_cast<size_t>(r * in + i)]} * w[static_cast<size_t>(o * in + i)];
      y[static_cast<size_t>(r * out + o)] = sum;
    }
  return y;
}

float bf16(double v) {
  return formats::round_to_bf16(static_cast<float>(v));
}

// RoPE on v[0, 64) at position p: FP32 angle and cos/sin (docs/models.md §1.2), rounded to BF16.
void rope(float* v, int32_t pos, const kernels::RopeFrequencies& f, bool interleaved) {
  for (int64_t i = 0; i < kRope / 2; ++i) {
    const float angle = static_cast<float>(pos) * f.inv_freq[static_cast<size_t>(i)];
    const float c = std::cos(angle) * f.magnitude, s = std::sin(angle) * f.magnitude;
    const int64_t a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + kRope / 2;
    const float xa = v[a], xb = v[b];
    v[a] = formats::round_to_bf16(xa * c - xb * s);
    v[b] = formats::round_to_bf16(xa * s + xb * c);
  }
}

// Had_128 from the matrix definition H[i][j] = (−1)^popcount(i & j) / sqrt(128), rounded to BF16.
void hadamard(float* v) {
  double out[kHeadDim];
  for (int i = 0; i < kHeadDim; ++i) {
    double sum = 0;
    for (int j = 0; j < kHeadDim; ++j)
      sum += (std::popcount(static_cast<unsigned>(i & j)) % 2 ? -1.0 : 1.0) * v[j];
    out[i] = sum / std::sqrt(double{kHeadDim});
  }
  for (int i = 0; i < kHeadDim; ++i) v[i] = bf16(out[i]);
}

void quantize(const float* v, uint8_t* codes, float* scale) {
  uint16_t bits[kHeadDim];
  for (int i = 0; i < kHeadDim; ++i) bits[i] = formats::encode_bf16(v[i]);
  formats::act_quant(bits, formats::ActScaleFormat::kUe8m0, std::span<uint8_t>(codes, kHeadDim),
                     std::span<float>(scale, 1));
}

struct Reference {
  std::vector<std::vector<double>> scores;      // [T][t + 1]
  std::vector<std::vector<int32_t>> selection;  // [T][k_t], rank order
  std::vector<uint8_t> k_codes;                 // [T, 128]
  std::vector<float> k_scales;                  // [T]
};

// One sequence from position 0: the full causal score matrix, then sort (score desc, pos asc).
Reference reference(const Weights& w, const std::vector<float>& x, const std::vector<float>& c_q,
                    const DsaIndexerConfig& config, RefOptions options) {
  const int64_t T = static_cast<int64_t>(x.size()) / kHidden;
  const std::vector<double> q_lin = linear(c_q, w.wq_b, kRankQ);  // [T, n_I·d_I]
  const std::vector<double> k_lin = linear(x, w.wk, kHidden);     // [T, d_I]
  const std::vector<double> w_lin = linear(x, w.weights_proj, kHidden);
  std::vector<uint8_t> q_codes(static_cast<size_t>(T * kHeads * kHeadDim));
  std::vector<float> q_scales(static_cast<size_t>(T * kHeads));
  Reference ref;
  ref.k_codes.resize(static_cast<size_t>(T * kHeadDim));
  ref.k_scales.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    const auto pos = static_cast<int32_t>(t);
    for (int64_t h = 0; h < kHeads; ++h) {
      float v[kHeadDim];
      for (int64_t d = 0; d < kHeadDim; ++d)
        v[d] = bf16(q_lin[static_cast<size_t>((t * kHeads + h) * kHeadDim + d)]);
      rope(v, pos, config.rope, options.interleaved);  // rope part first
      if (options.hadamard_q) hadamard(v);
      quantize(v, &q_codes[static_cast<size_t>((t * kHeads + h) * kHeadDim)],
               &q_scales[static_cast<size_t>(t * kHeads + h)]);
    }
    float k[kHeadDim];
    double mean = 0, var = 0;
    for (int64_t d = 0; d < kHeadDim; ++d)
      mean += bf16(k_lin[static_cast<size_t>(t * kHeadDim + d)]);
    mean /= kHeadDim;
    for (int64_t d = 0; d < kHeadDim; ++d)
      var += std::pow(bf16(k_lin[static_cast<size_t>(t * kHeadDim + d)]) - mean, 2);
    var /= kHeadDim;
    for (int64_t d = 0; d < kHeadDim; ++d)
      k[d] = bf16((bf16(k_lin[static_cast<size_t>(t * kHeadDim + d)]) - mean) /
                      std::sqrt(var + 1e-6) * w.k_norm_weight[static_cast<size_t>(d)] +
                  w.k_norm_bias[static_cast<size_t>(d)]);
    rope(k, pos, config.rope, options.interleaved);
    if (options.hadamard_k) hadamard(k);
    quantize(k, &ref.k_codes[static_cast<size_t>(t * kHeadDim)],
             &ref.k_scales[static_cast<size_t>(t)]);
  }
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> row(static_cast<size_t>(t + 1));
    for (int64_t s = 0; s <= t; ++s) {
      double sum = 0;
      for (int64_t h = 0; h < kHeads; ++h) {
        double dot = 0;
        for (int64_t d = 0; d < kHeadDim; ++d)
          dot += double{formats::decode_e4m3(
                     q_codes[static_cast<size_t>((t * kHeads + h) * kHeadDim + d)])} *
                 formats::decode_e4m3(ref.k_codes[static_cast<size_t>(s * kHeadDim + d)]);
        const double weight = static_cast<float>(w_lin[static_cast<size_t>(t * kHeads + h)]) *
                              (1.0 / std::sqrt(double{kHeads})) *
                              q_scales[static_cast<size_t>(t * kHeads + h)] /
                              std::sqrt(double{kHeadDim});
        sum += weight * std::max(dot, 0.0);
      }
      row[static_cast<size_t>(s)] = ref.k_scales[static_cast<size_t>(s)] * sum;
    }
    std::vector<int32_t> order(static_cast<size_t>(t + 1));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return row[static_cast<size_t>(a)] > row[static_cast<size_t>(b)];
    });
    order.resize(static_cast<size_t>(std::min<int64_t>(kTopK, t + 1)));
    ref.scores.push_back(std::move(row));
    ref.selection.push_back(std::move(order));
  }
  return ref;
}

// ---------------------------------------------------------------- engine harness

class Capture : public TapSink {
 public:
  void on_tap(int, std::string_view name, const float* data, const Shape& shape) override {
    taps[std::string(name)].assign(data, data + shape.num_elems());
  }
  std::map<std::string, std::vector<float>> taps;
};

// One sequence's index cache: a shuffled block table over a pool pre-filled with garbage.
struct SequenceCache {
  kernels::IndexCacheLayout layout{.key_dim = kHeadDim, .block_size = kBlockSize};
  std::vector<std::byte> pool;
  std::vector<int32_t> block_table;

  SequenceCache(std::mt19937& rng, int64_t num_tokens) {
    const int64_t num_blocks = (num_tokens + kBlockSize - 1) / kBlockSize,
                  num_physical = num_blocks + 2;
    pool.resize(static_cast<size_t>(num_physical * layout.block_bytes()));
    for (auto& b : pool) b = static_cast<std::byte>(rng() & 0x7E);
    std::vector<int32_t> ids(static_cast<size_t>(num_physical));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table.assign(ids.begin(), ids.begin() + num_blocks);
  }
  int64_t slot(int64_t pos) const { return slot_of(block_table, kBlockSize, pos); }
};

struct EngineRows {
  std::vector<int32_t> selection;  // [T, K]
  std::vector<float> scores;       // [T, K], the "index_scores" tap
};

// Feeds tokens [0, T) of one sequence in chunks of `chunk` tokens (chunk 1: decode steps).
EngineRows run_engine(const DsaIndexer& indexer, SequenceCache& cache, const std::vector<float>& x,
                      const std::vector<float>& c_q, int64_t chunk, int threads = 2) {
  const int64_t T = static_cast<int64_t>(x.size()) / kHidden;
  EngineRows rows;
  Arena scratch(64 << 20);
  for (int64_t begin = 0; begin < T; begin += chunk) {
    const int64_t n = std::min(chunk, T - begin);
    std::vector<int32_t> token_ids(static_cast<size_t>(n)), positions(static_cast<size_t>(n));
    std::vector<int64_t> slots(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      positions[static_cast<size_t>(i)] = static_cast<int32_t>(begin + i);
      slots[static_cast<size_t>(i)] = cache.slot(begin + i);
    }
    ForwardBatch batch{.token_ids = token_ids,
                       .positions = positions,
                       .slot_mapping = slots,
                       .sequences = {SequenceSlice{.token_begin = 0,
                                                   .num_tokens = n,
                                                   .pos_begin = begin,
                                                   .block_table = cache.block_table}},
                       .block_size = kBlockSize};
    std::vector<int32_t> selection(static_cast<size_t>(n * kTopK), 777);
    Capture capture;
    scratch.reset();
    indexer.select(ExecContext{threads}, batch, x.data() + begin * kHidden,
                   c_q.data() + begin * kRankQ, IndexLayerCache{cache.layout, cache.pool.data()},
                   selection, scratch, &capture, 3);
    const auto& tapped = capture.taps.at("index_selection");
    for (size_t i = 0; i < selection.size(); ++i) EXPECT_EQ(tapped[i], float(selection[i]));
    rows.selection.insert(rows.selection.end(), selection.begin(), selection.end());
    const auto& scores = capture.taps.at("index_scores");
    rows.scores.insert(rows.scores.end(), scores.begin(), scores.end());
  }
  return rows;
}

struct Mismatch {
  double score_rel_rms = 0;  // ‖engine − ref‖ / ‖ref‖ over the selected entries
  double worst_swap = 0;     // largest unexplained swap, as a fraction of the row's max |score|
  int64_t num_differing_rows = 0;
};

// Compares engine rows with the reference: rows with t + 1 ≤ K must be exactly {0..t}; scores at
// the engine's selected positions; and set differences, which are only acceptable as swaps between
// positions whose reference scores are within the tolerance of each other.
Mismatch compare(const Reference& ref, const EngineRows& rows) {
  Mismatch m;
  double err2 = 0, ref2 = 0;
  for (size_t t = 0; t < ref.selection.size(); ++t) {
    const int64_t k_t = std::min<int64_t>(kTopK, static_cast<int64_t>(t) + 1);
    const int32_t* sel = &rows.selection[t * kTopK];
    const float* sc = &rows.scores[t * kTopK];
    double row_max = 0;
    for (double s : ref.scores[t]) row_max = std::max(row_max, std::abs(s));
    for (int64_t i = 0; i < kTopK; ++i) {
      if (i >= k_t) {
        EXPECT_EQ(sel[i], -1) << "row " << t;
        continue;
      }
      EXPECT_TRUE(sel[i] >= 0 && sel[i] <= static_cast<int32_t>(t)) << "row " << t;
      if (sel[i] < 0 || sel[i] > static_cast<int32_t>(t)) return m;
      const double r = ref.scores[t][static_cast<size_t>(sel[i])];
      err2 += (sc[i] - r) * (sc[i] - r);
      ref2 += r * r;
    }
    std::set<int32_t> got(sel, sel + k_t), want(ref.selection[t].begin(), ref.selection[t].end());
    if (static_cast<int64_t>(t) + 1 <= kTopK) {
      std::set<int32_t> all;
      for (int32_t s = 0; s <= static_cast<int32_t>(t); ++s) all.insert(s);
      EXPECT_EQ(got, all) << "row " << t << " must be dense";
    }
    if (got == want) continue;
    ++m.num_differing_rows;
    double lowest_in = INFINITY, highest_out = -INFINITY;
    for (int32_t p : got)
      if (!want.count(p)) lowest_in = std::min(lowest_in, ref.scores[t][static_cast<size_t>(p)]);
    for (int32_t p : want)
      if (!got.count(p)) highest_out = std::max(highest_out, ref.scores[t][static_cast<size_t>(p)]);
    m.worst_swap = std::max(m.worst_swap, (highest_out - lowest_in) / row_max);
  }
  m.score_rel_rms = std::sqrt(err2 / ref2);
  return m;
}

// FP8 paths against a reference applying the same quantization: relative RMS < 1e-2 (docs/models.md
// §8.1). Both sides round at the same points, so differences come only from summation order and
// the rare BF16 or E4M3 rounding flip those cause; a swap in the selected set is accepted only
// between positions whose reference scores are within 1e-2 of the row's largest |score|.
constexpr double kScoreTolerance = 1e-2;
constexpr double kSwapTolerance = 1e-2;

void expect_close(const Reference& ref, const EngineRows& rows) {
  const Mismatch m = compare(ref, rows);
  EXPECT_LT(m.score_rel_rms, kScoreTolerance);
  EXPECT_LE(m.worst_swap, kSwapTolerance) << m.num_differing_rows << " rows differ";
}

struct Inputs {
  std::vector<float> x, c_q;
};

Inputs random_inputs(std::mt19937& rng, int64_t num_tokens) {
  return Inputs{normal_bf16(rng, num_tokens * kHidden, 1.0f),
                normal_bf16(rng, num_tokens * kRankQ, 1.0f)};
}

class DsaIndexerTest : public ::testing::Test {
 protected:
  DsaIndexerTest() : seed_(std::random_device{}()), rng_(seed_), weights_(rng_) {}
  void SetUp() override { RecordProperty("seed", std::to_string(seed_)); }

  unsigned seed_;
  std::mt19937 rng_;
  Weights weights_;
};

TEST_F(DsaIndexerTest, MatchesThePlainReferenceAndCachesEveryKey) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  constexpr int64_t T = 45;
  const Inputs in = random_inputs(rng_, T);
  const DsaIndexer indexer = weights_.make(tiny_config());
  SequenceCache cache(rng_, T);
  const EngineRows rows = run_engine(indexer, cache, in.x, in.c_q, T);
  const Reference ref = reference(weights_, in.x, in.c_q, tiny_config(), {});
  expect_close(ref, rows);
  // Each token's key sits block-planar at its slot: codes at key_offset, scale at scale_offset.
  double err2 = 0, ref2 = 0;
  for (int64_t t = 0; t < T; ++t) {
    float scale;
    std::memcpy(&scale, cache.pool.data() + cache.layout.scale_offset_bytes(cache.slot(t)), 4);
    const auto* codes = reinterpret_cast<const uint8_t*>(
        cache.pool.data() + cache.layout.key_offset_bytes(cache.slot(t)));
    for (int64_t d = 0; d < kHeadDim; ++d) {
      const double want =
          double{formats::decode_e4m3(ref.k_codes[static_cast<size_t>(t * kHeadDim + d)])} *
          ref.k_scales[static_cast<size_t>(t)];
      const double got = double{formats::decode_e4m3(codes[d])} * scale;
      err2 += (got - want) * (got - want);
      ref2 += want * want;
    }
  }
  EXPECT_LT(std::sqrt(err2 / ref2), kScoreTolerance);
}

TEST_F(DsaIndexerTest, ChunkedPrefillAndDecodeMatchTheReference) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  constexpr int64_t T = 40;
  const Inputs in = random_inputs(rng_, T);
  const DsaIndexer indexer = weights_.make(tiny_config());
  const Reference ref = reference(weights_, in.x, in.c_q, tiny_config(), {});
  SequenceCache one_shot_cache(rng_, T);
  const EngineRows one_shot = run_engine(indexer, one_shot_cache, in.x, in.c_q, T);
  for (int64_t chunk : {7, 16, 1}) {
    SCOPED_TRACE(::testing::Message() << "chunk " << chunk);
    SequenceCache cache(rng_, T);
    const EngineRows rows = run_engine(indexer, cache, in.x, in.c_q, chunk, chunk == 1 ? 3 : 2);
    expect_close(ref, rows);
    // Chunked, decode and one-shot rows agree with each other as well (same bound).
    Reference as_ref = ref;
    for (int64_t t = 0; t < T; ++t) {
      as_ref.selection[static_cast<size_t>(t)].assign(
          one_shot.selection.begin() + t * kTopK,
          one_shot.selection.begin() + t * kTopK + std::min<int64_t>(kTopK, t + 1));
    }
    EXPECT_LE(compare(as_ref, rows).worst_swap, kSwapTolerance);
  }
}

// docs/models.md §3.5: the indexer uses rotate-half RoPE, MLA interleaved. On these inputs the two
// layouts give clearly different scores, so an indexer using the MLA layout fails the reference.
TEST_F(DsaIndexerTest, FailsWithTheMlaInterleavedRopeLayout) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  constexpr int64_t T = 40;
  const Inputs in = random_inputs(rng_, T);
  const Reference rotate_half = reference(weights_, in.x, in.c_q, tiny_config(), {});
  const Reference interleaved =
      reference(weights_, in.x, in.c_q, tiny_config(), {.interleaved = true});
  SequenceCache cache_a(rng_, T), cache_b(rng_, T);
  const EngineRows engine_default =
      run_engine(weights_.make(tiny_config()), cache_a, in.x, in.c_q, T);
  const EngineRows engine_mla_layout = run_engine(
      weights_.make(tiny_config(kernels::RopeLayout::kInterleaved)), cache_b, in.x, in.c_q, T);
  expect_close(rotate_half, engine_default);
  const Mismatch wrong = compare(rotate_half, engine_mla_layout);
  EXPECT_GT(wrong.score_rel_rms, 10 * kScoreTolerance);
  EXPECT_GT(wrong.num_differing_rows, 0);
  // indexer_rope_interleave (a GLM-5 option) still works when asked for.
  expect_close(interleaved, engine_mla_layout);
}

// docs/models.md §1.4: Had(q)·Had(k) = q·k only with both rotated; rotating one side changes the
// scores.
TEST_F(DsaIndexerTest, HadamardOnOnlyQOrOnlyKDoesNotMatch) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  constexpr int64_t T = 40;
  const Inputs in = random_inputs(rng_, T);
  SequenceCache cache(rng_, T);
  const EngineRows rows = run_engine(weights_.make(tiny_config()), cache, in.x, in.c_q, T);
  expect_close(reference(weights_, in.x, in.c_q, tiny_config(), {}), rows);
  for (RefOptions one_sided : {RefOptions{.hadamard_q = false}, RefOptions{.hadamard_k = false}}) {
    const Mismatch m = compare(reference(weights_, in.x, in.c_q, tiny_config(), one_sided), rows);
    EXPECT_GT(m.score_rel_rms, 10 * kScoreTolerance);
  }
}

// Two sequences in one batch, each with its own block table, give the rows each gets alone.
TEST_F(DsaIndexerTest, SequencesOfOneBatchAreIndependent) {
  SCOPED_TRACE(::testing::Message() << "seed " << seed_);
  const Inputs a = random_inputs(rng_, 30), b = random_inputs(rng_, 21);
  const DsaIndexer indexer = weights_.make(tiny_config());
  // One pool for both: sequence b's blocks come after a's.
  SequenceCache cache(rng_, 30 + 21 + kBlockSize);
  const std::vector<int32_t> table_a(cache.block_table.begin(), cache.block_table.begin() + 2);
  const std::vector<int32_t> table_b(cache.block_table.begin() + 2, cache.block_table.begin() + 4);
  std::vector<float> x(a.x), c_q(a.c_q);
  x.insert(x.end(), b.x.begin(), b.x.end());
  c_q.insert(c_q.end(), b.c_q.begin(), b.c_q.end());
  std::vector<int32_t> token_ids(51), positions(51);
  std::vector<int64_t> slots(51);
  for (int64_t i = 0; i < 51; ++i) {
    const int64_t pos = i < 30 ? i : i - 30;
    positions[static_cast<size_t>(i)] = static_cast<int32_t>(pos);
    slots[static_cast<size_t>(i)] = slot_of(i < 30 ? table_a : table_b, kBlockSize, pos);
  }
  ForwardBatch batch{
      .token_ids = token_ids,
      .positions = positions,
      .slot_mapping = slots,
      .sequences = {SequenceSlice{0, 30, 0, table_a}, SequenceSlice{30, 21, 0, table_b}},
      .block_size = kBlockSize};
  std::vector<int32_t> selection(51 * kTopK);
  Arena scratch(64 << 20);
  Capture capture;
  indexer.select(ExecContext{2}, batch, x.data(), c_q.data(),
                 IndexLayerCache{cache.layout, cache.pool.data()}, selection, scratch, &capture, 0);
  const auto& scores = capture.taps.at("index_scores");
  EngineRows rows_a{{selection.begin(), selection.begin() + 30 * kTopK},
                    {scores.begin(), scores.begin() + 30 * kTopK}};
  EngineRows rows_b{{selection.begin() + 30 * kTopK, selection.end()},
                    {scores.begin() + 30 * kTopK, scores.end()}};
  expect_close(reference(weights_, a.x, a.c_q, tiny_config(), {}), rows_a);
  expect_close(reference(weights_, b.x, b.c_q, tiny_config(), {}), rows_b);
}

}  // namespace dsa_indexer_test
}  // namespace dz::model
