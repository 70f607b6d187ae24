// MLA attention kernels (mla_attention.h): the tiled absorbed and prefill forms against the FP64
// references, dense and sparse, fp8 and bf16 caches, one and several threads; the two forms against
// each other; the inner-loop variants against FP64 loops.
#include "dayzero/kernels/mla_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/mla_attention_vec.h"

namespace dz::kernels {
namespace mla_attention_test {

double rel_rms(const std::vector<float>& out, const std::vector<float>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (double{out[i]} - ref[i]) * (double{out[i]} - ref[i]);
    norm += double{ref[i]} * ref[i];
  }
  return std::sqrt(err / norm);
}

struct Dims {
  int64_t num_heads, latent_dim, rope_dim, nope_dim, v_dim;
  KvCacheDtype dtype;
};

// A sequence of num_positions cached tokens in a pool whose block table is shuffled, plus random
// queries and up-projection weights.
struct Problem {
  Dims dims;
  int64_t block_size = 16;
  int64_t num_positions = 0;
  std::vector<std::byte> pool;
  std::vector<int32_t> block_table;
  std::vector<float> w_uk, w_uv;                 // [H, d_n, r_kv], [H, d_v, r_kv], BF16 values
  std::vector<uint16_t> w_uk_codes, w_uv_codes;  // the same as BF16 codes (the kernels' input)
  std::vector<float> q;                          // [num_queries, H, d_n + d_r]
  std::vector<int32_t> query_positions;
  std::vector<int32_t> selection;
  int64_t selection_width = 0;

  MlaCacheLayout layout() const {
    return {.latent_dim = dims.latent_dim, .rope_dim = dims.rope_dim, .dtype = dims.dtype};
  }
  MlaCacheView cache() const {
    return {.layout = layout(),
            .pool = pool.data(),
            .block_size = block_size,
            .block_table = block_table};
  }
  MlaQueryKeys keys() const {
    return {
        .positions = query_positions, .selection = selection, .selection_width = selection_width};
  }
  int64_t q_width() const { return dims.nope_dim + dims.rope_dim; }
};

Problem make_problem(std::mt19937& rng, const Dims& dims, int64_t num_positions,
                     std::vector<int32_t> query_positions) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Problem p;
  p.dims = dims;
  p.num_positions = num_positions;
  const int64_t num_blocks = (num_positions + p.block_size - 1) / p.block_size;
  const int64_t pool_blocks = num_blocks + 3;
  std::vector<int32_t> ids(static_cast<size_t>(pool_blocks));
  for (int32_t b = 0; b < pool_blocks; ++b) ids[static_cast<size_t>(b)] = b;
  std::shuffle(ids.begin(), ids.end(), rng);
  p.block_table.assign(ids.begin(), ids.begin() + num_blocks);
  const MlaCacheLayout layout = p.layout();
  p.pool.resize(static_cast<size_t>(pool_blocks * p.block_size * layout.record_bytes()));
  std::vector<float> latent(static_cast<size_t>(dims.latent_dim)),
      rope(static_cast<size_t>(dims.rope_dim));
  for (int64_t pos = 0; pos < num_positions; ++pos) {
    for (auto& v : latent) v = formats::round_to_bf16(normal(rng));
    for (auto& v : rope) v = formats::round_to_bf16(normal(rng));
    const int64_t slot =
        p.block_table[static_cast<size_t>(pos / p.block_size)] * p.block_size + pos % p.block_size;
    write_mla_record(layout, p.pool.data(), slot, latent.data(), rope.data());
  }
  const float w_scale = 1.0f / std::sqrt(static_cast<float>(dims.latent_dim));
  p.w_uk.resize(static_cast<size_t>(dims.num_heads * dims.nope_dim * dims.latent_dim));
  p.w_uv.resize(static_cast<size_t>(dims.num_heads * dims.v_dim * dims.latent_dim));
  for (auto& v : p.w_uk) v = formats::round_to_bf16(normal(rng) * w_scale);
  for (auto& v : p.w_uv) v = formats::round_to_bf16(normal(rng) * w_scale);
  for (const float v : p.w_uk) p.w_uk_codes.push_back(formats::encode_bf16(v));
  for (const float v : p.w_uv) p.w_uv_codes.push_back(formats::encode_bf16(v));
  p.query_positions = std::move(query_positions);
  p.q.resize(p.query_positions.size() * static_cast<size_t>(dims.num_heads * p.q_width()));
  for (auto& v : p.q) v = formats::round_to_bf16(normal(rng) * 0.5f);
  return p;
}

// A random selection of up to `width` positions ≤ each query's position, −1 padded, shuffled.
void add_random_selection(std::mt19937& rng, Problem& p, int64_t width) {
  p.selection_width = width;
  p.selection.assign(p.query_positions.size() * static_cast<size_t>(width), -1);
  for (size_t i = 0; i < p.query_positions.size(); ++i) {
    std::vector<int32_t> all(static_cast<size_t>(p.query_positions[i] + 1));
    for (int32_t s = 0; s <= p.query_positions[i]; ++s) all[static_cast<size_t>(s)] = s;
    std::shuffle(all.begin(), all.end(), rng);
    const size_t take = std::min(all.size(), static_cast<size_t>(width));
    std::copy_n(all.begin(), take, p.selection.begin() + static_cast<std::ptrdiff_t>(i * width));
    std::shuffle(p.selection.begin() + static_cast<std::ptrdiff_t>(i * width),
                 p.selection.begin() + static_cast<std::ptrdiff_t>((i + 1) * width), rng);
  }
}

// q_abs [Q, H, r_kv] = W_UK_hᵀ q_nope_h in FP64, stored FP32.
std::vector<float> absorb_queries(const Problem& p) {
  const Dims& d = p.dims;
  const size_t num_queries = p.query_positions.size();
  std::vector<float> q_abs(num_queries * static_cast<size_t>(d.num_heads * d.latent_dim));
  for (size_t i = 0; i < num_queries; ++i)
    for (int64_t h = 0; h < d.num_heads; ++h)
      for (int64_t c = 0; c < d.latent_dim; ++c) {
        double acc = 0;
        for (int64_t n = 0; n < d.nope_dim; ++n)
          acc += double{p.q[(i * d.num_heads + h) * p.q_width() + n]} *
                 p.w_uk[(h * d.nope_dim + n) * d.latent_dim + c];
        q_abs[(i * d.num_heads + h) * d.latent_dim + c] = static_cast<float>(acc);
      }
  return q_abs;
}

MlaAbsorbedArgs absorbed_args(const Problem& p, const std::vector<float>& q_abs,
                              std::vector<float>& o_lat) {
  o_lat.assign(p.query_positions.size() * static_cast<size_t>(p.dims.num_heads * p.dims.latent_dim),
               std::numeric_limits<float>::quiet_NaN());
  return {.num_heads = p.dims.num_heads,
          .softmax_scale = 0.125f,
          .q_abs = q_abs.data(),
          .q_pe = p.q.data() + p.dims.nope_dim,
          .q_pe_token_stride = p.dims.num_heads * p.q_width(),
          .q_pe_head_stride = p.q_width(),
          .o_lat = o_lat.data()};
}

MlaPrefillArgs prefill_args(const Problem& p, std::vector<float>& out) {
  out.assign(p.query_positions.size() * static_cast<size_t>(p.dims.num_heads * p.dims.v_dim),
             std::numeric_limits<float>::quiet_NaN());
  return {.num_heads = p.dims.num_heads,
          .nope_dim = p.dims.nope_dim,
          .v_dim = p.dims.v_dim,
          .softmax_scale = 0.125f,
          .q_nope = p.q.data(),
          .q_pe = p.q.data() + p.dims.nope_dim,
          .q_token_stride = p.dims.num_heads * p.q_width(),
          .q_head_stride = p.q_width(),
          .w_uk = p.w_uk_codes.data(),
          .w_uv = p.w_uv_codes.data(),
          .out = out.data()};
}

std::vector<std::byte> absorbed_workspace(const ExecContext& ctx, const Problem& p) {
  return std::vector<std::byte>(
      mla_absorbed_workspace_bytes(ctx, p.layout(), static_cast<int64_t>(p.query_positions.size()),
                                   p.dims.num_heads) +
      64);
}
std::vector<std::byte> prefill_workspace(const ExecContext& ctx, const Problem& p) {
  return std::vector<std::byte>(mla_prefill_workspace_bytes(ctx, p.layout(), p.keys(),
                                                            p.dims.num_heads, p.dims.nope_dim,
                                                            p.dims.v_dim) +
                                64);
}
// The kernels want 64-aligned scratch.
std::span<std::byte> aligned(std::vector<std::byte>& buffer) {
  auto address = reinterpret_cast<uintptr_t>(buffer.data());
  const size_t skip = (64 - address % 64) % 64;
  return std::span<std::byte>(buffer).subspan(skip);
}

const Dims kDeepSeekTiny{4, 256, 64, 64, 64, KvCacheDtype::kFp8};
const Dims kOddBf16{3, 96, 16, 24, 40, KvCacheDtype::kBf16};
const Dims kDeepSeekHeads16{16, 512, 64, 128, 128, KvCacheDtype::kFp8};  // the V2-Lite shape
// hybrid_model_test's two MLA blocks: rows narrower than one 32-column chunk of latent.
const Dims kHybridDsa{2, 32, 16, 16, 16, KvCacheDtype::kBf16};
const Dims kHybridNope{2, 32, 8, 16, 16, KvCacheDtype::kBf16};

class MlaAttention : public ::testing::TestWithParam<Dims> {};

// Tolerance: both sides are FP32 math on identical inputs (the cache is read back the same way);
// the kernels reassociate FP32 sums, the references accumulate in FP64: rel RMS < 1e-5
// (docs/models.md §8.1, fp32 kernels).
constexpr double kFp32Tolerance = 1e-5;
// The absorbed form on BF16 products (mla_attention_vec.h) multiplies the exact BF16 records with
// q and P split into two BF16 terms (remainder ≤ 2^-16 relative): FP32 accuracy, the same bound
// (≈ 3e-6 measured).

TEST_P(MlaAttention, TiledFormsMatchReferencesDenseAndSparse) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // Many queries at block edges (15, 16, 17), the first and the last position; then a single
  // decode query whose 301 (or 280 selected) keys are split over threads (flash-decoding).
  struct Case {
    std::vector<int32_t> positions;
    int64_t selection_width;
  };
  const std::vector<int32_t> many{0, 15, 16, 17, 63, 64, 200, 300};
  for (const Case& test_case : {Case{many, 0}, Case{many, 40}, Case{{300}, 0}, Case{{300}, 280}}) {
    Problem p = make_problem(rng, GetParam(), 301, test_case.positions);
    if (test_case.selection_width > 0) add_random_selection(rng, p, test_case.selection_width);
    SCOPED_TRACE(::testing::Message() << test_case.positions.size() << " queries, selection width "
                                      << test_case.selection_width);
    const std::vector<float> q_abs = absorb_queries(p);
    std::vector<float> ref_lat, ref_out;
    mla_attention_absorbed_ref(p.cache(), p.keys(), absorbed_args(p, q_abs, ref_lat));
    mla_attention_prefill_ref(p.cache(), p.keys(), prefill_args(p, ref_out));
    for (int num_threads : {1, 4}) {
      const ExecContext ctx{.num_threads = num_threads};
      std::vector<float> o_lat, out;
      auto ws_a = absorbed_workspace(ctx, p);
      mla_attention_absorbed(ctx, p.cache(), p.keys(), absorbed_args(p, q_abs, o_lat),
                             aligned(ws_a));
      EXPECT_LT(rel_rms(o_lat, ref_lat), kFp32Tolerance) << num_threads << " threads";
      // The log-sum-exp the context-parallel merge weighs partial outputs by: FP32 against FP64,
      // an absolute error of a few ulps of the largest score (|S| < 30 here).
      std::vector<float> lse(p.query_positions.size() * static_cast<size_t>(p.dims.num_heads));
      std::vector<float> ref_lse(lse.size()), unused;
      MlaAbsorbedArgs with_lse = absorbed_args(p, q_abs, unused);
      with_lse.lse = ref_lse.data();
      mla_attention_absorbed_ref(p.cache(), p.keys(), with_lse);
      with_lse.lse = lse.data();
      auto ws_l = absorbed_workspace(ctx, p);
      mla_attention_absorbed(ctx, p.cache(), p.keys(), with_lse, aligned(ws_l));
      for (size_t j = 0; j < lse.size(); ++j)
        EXPECT_NEAR(lse[j], ref_lse[j], 1e-4) << num_threads << " threads, lse " << j;
      auto ws_p = prefill_workspace(ctx, p);
      mla_attention_prefill(ctx, p.cache(), p.keys(), prefill_args(p, out), aligned(ws_p));
      EXPECT_LT(rel_rms(out, ref_out), kFp32Tolerance) << num_threads << " threads";
    }
    // The two forms agree: o_h = W_UV_h o_lat_h (FP64) against the prefill output.
    const Dims& d = p.dims;
    std::vector<float> projected(ref_out.size());
    for (size_t i = 0; i < p.query_positions.size(); ++i)
      for (int64_t h = 0; h < d.num_heads; ++h)
        for (int64_t n = 0; n < d.v_dim; ++n) {
          double acc = 0;
          for (int64_t c = 0; c < d.latent_dim; ++c)
            acc += double{p.w_uv[(h * d.v_dim + n) * d.latent_dim + c]} *
                   ref_lat[(i * d.num_heads + h) * d.latent_dim + c];
          projected[(i * d.num_heads + h) * d.v_dim + n] = static_cast<float>(acc);
        }
    EXPECT_LT(rel_rms(projected, ref_out), kFp32Tolerance) << "absorbed vs prefill";
  }
}

TEST_P(MlaAttention, SelectionOfTheWholePrefixEqualsDense) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Problem p = make_problem(rng, GetParam(), 40, {3, 20, 39});
  const ExecContext ctx{.num_threads = 2};
  const std::vector<float> q_abs = absorb_queries(p);
  std::vector<float> dense_lat, dense_out, sparse_lat, sparse_out;
  auto ws = absorbed_workspace(ctx, p);
  mla_attention_absorbed(ctx, p.cache(), p.keys(), absorbed_args(p, q_abs, dense_lat), aligned(ws));
  auto ws_p = prefill_workspace(ctx, p);
  mla_attention_prefill(ctx, p.cache(), p.keys(), prefill_args(p, dense_out), aligned(ws_p));
  add_random_selection(rng, p, 48);  // wider than every prefix: all of it, −1 padded, shuffled
  ws = absorbed_workspace(ctx, p);
  mla_attention_absorbed(ctx, p.cache(), p.keys(), absorbed_args(p, q_abs, sparse_lat),
                         aligned(ws));
  ws_p = prefill_workspace(ctx, p);
  mla_attention_prefill(ctx, p.cache(), p.keys(), prefill_args(p, sparse_out), aligned(ws_p));
  // Same keys in a different order: FP32 reassociation only.
  EXPECT_LT(rel_rms(sparse_lat, dense_lat), kFp32Tolerance);
  EXPECT_LT(rel_rms(sparse_out, dense_out), kFp32Tolerance);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaAttention,
                         ::testing::Values(kDeepSeekTiny, kOddBf16, kDeepSeekHeads16, kHybridDsa,
                                           kHybridNope),
                         [](const auto& shape_info) {
                           const Dims& d = shape_info.param;
                           return std::string(d.dtype == KvCacheDtype::kBf16 ? "Bf16" : "Fp8") +
                                  "Heads" + std::to_string(d.num_heads) + "Latent" +
                                  std::to_string(d.latent_dim) + "Rope" +
                                  std::to_string(d.rope_dim);
                         });

// FP8 tile scales that put decoded values near the ends of the BF16 range (written into the pool:
// the cache writer's quantizer never makes them, but the kernel must not depend on that). The
// BF16 split adds a scale to the BF16 exponents only where every result stays normal and decodes
// other tiles value by value: ×2^-118 (tile scales ≈ 2^-125) takes that path, ×2^90 the shift.
// q_abs is scaled the other way so that the scores stay as they were. At 2^-118 the small codes of
// a tile decode below BF16's normal range (2^-126), where the vector splits' BF16 decode rounds
// them and AMX reads BF16 denormals as zero: up to 2^-9 of a tile's largest value, ≈ 1.5e-3
// relative here, held to 5e-3 there; the portable split reads them exactly.
TEST(MlaAttentionAbsorbed, Fp8ScalesAtTheEndsOfTheRange) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int exponent : {-118, 90}) {
    SCOPED_TRACE(::testing::Message() << "tile scales x 2^" << exponent);
    Problem p = make_problem(rng, kDeepSeekTiny, 100, {99});
    const MlaCacheLayout layout = p.layout();
    for (int64_t slot = 0; slot < static_cast<int64_t>(p.pool.size()) / layout.record_bytes();
         ++slot)
      for (int64_t t = 0; t < layout.latent_dim / 128; ++t) {
        std::byte* scale_bytes =
            p.pool.data() + slot * layout.record_bytes() + layout.latent_dim + t * 4;
        float scale;
        std::memcpy(&scale, scale_bytes, 4);
        scale = std::ldexp(scale, exponent);
        std::memcpy(scale_bytes, &scale, 4);
      }
    std::vector<float> q_abs = absorb_queries(p);
    for (auto& v : q_abs) v = std::ldexp(v, -exponent);
    std::vector<float> ref_lat, o_lat;
    mla_attention_absorbed_ref(p.cache(), p.keys(), absorbed_args(p, q_abs, ref_lat));
    const ExecContext ctx{.num_threads = 1};
    auto ws = absorbed_workspace(ctx, p);
    mla_attention_absorbed(ctx, p.cache(), p.keys(), absorbed_args(p, q_abs, o_lat), aligned(ws));
    const bool denormal_loss = exponent < 0 && detail::mla_absorbed_reads_records_as_bf16();
    EXPECT_LT(rel_rms(o_lat, ref_lat), denormal_loss ? 5e-3 : kFp32Tolerance);
  }
}

TEST(MlaAttentionAbsorbed, ReadsOnlySelectedRecords) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  Problem p = make_problem(rng, kDeepSeekTiny, 200, {150, 199});
  add_random_selection(rng, p, 24);
  const std::vector<float> q_abs = absorb_queries(p);
  std::vector<float> ref_lat;
  mla_attention_absorbed_ref(p.cache(), p.keys(), absorbed_args(p, q_abs, ref_lat));
  // Fill every record no query selected with 0xFF bytes (NaN codes, NaN scales, NaN k_pe).
  std::vector<bool> selected(200, false);
  for (int32_t s : p.selection)
    if (s >= 0) selected[static_cast<size_t>(s)] = true;
  const int64_t record_bytes = p.layout().record_bytes();
  for (int64_t pos = 0; pos < 200; ++pos) {
    if (selected[static_cast<size_t>(pos)]) continue;
    const int64_t slot =
        p.block_table[static_cast<size_t>(pos / p.block_size)] * p.block_size + pos % p.block_size;
    std::memset(p.pool.data() + slot * record_bytes, 0xFF, static_cast<size_t>(record_bytes));
  }
  const ExecContext ctx{.num_threads = 3};
  std::vector<float> o_lat;
  auto ws = absorbed_workspace(ctx, p);
  mla_attention_absorbed(ctx, p.cache(), p.keys(), absorbed_args(p, q_abs, o_lat), aligned(ws));
  EXPECT_LT(rel_rms(o_lat, ref_lat), kFp32Tolerance);
}

// The generic inner loops, and the AVX-512 ones where this CPU runs them.
std::vector<detail::MlaVecOps> vec_op_variants() {
  std::vector<detail::MlaVecOps> variants{detail::mla_vec_ops_generic()};
  if (cpu_features().avx512) variants.push_back(detail::mla_vec_ops_avx512());
  return variants;
}

TEST(MlaAttentionVecOps, VariantsMatchFp64Loops) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<detail::MlaVecOps> variants = vec_op_variants();
  for (const auto& ops : variants) {
    for (int64_t dim : {1, 15, 16, 17, 64, 127, 128, 129, 576}) {
      for (int64_t num_rows : {1, 3, 4, 5, 9}) {
        SCOPED_TRACE(::testing::Message() << ops.name << " dim " << dim << " rows " << num_rows);
        const int64_t stride = dim + 3;
        std::vector<float> x(static_cast<size_t>(dim)),
            rows(static_cast<size_t>(num_rows * stride));
        std::vector<float> p(static_cast<size_t>(num_rows)), acc(static_cast<size_t>(dim));
        for (auto* v : {&x, &rows, &p, &acc})
          for (auto& e : *v) e = normal(rng);
        std::vector<float> out(static_cast<size_t>(num_rows));
        ops.dot_rows(x.data(), rows.data(), stride, num_rows, dim, out.data());
        std::vector<float> acc_out = acc;
        ops.accumulate_rows(p.data(), rows.data(), stride, num_rows, dim, acc_out.data());
        for (int64_t k = 0; k < num_rows; ++k) {
          double expected = 0, magnitude = 0;
          for (int64_t c = 0; c < dim; ++c) {
            expected += double{x[c]} * rows[k * stride + c];
            magnitude += std::fabs(double{x[c]} * rows[k * stride + c]);
          }
          // FP32 sums of dim products: |error| ≤ dim·2^-24·Σ|terms| (loose bound).
          ASSERT_NEAR(out[k], expected, static_cast<double>(dim) * 0x1p-24 * magnitude + 1e-30);
        }
        for (int64_t c = 0; c < dim; ++c) {
          double expected = acc[c], magnitude = std::fabs(acc[c]);
          for (int64_t k = 0; k < num_rows; ++k) {
            expected += double{p[k]} * rows[k * stride + c];
            magnitude += std::fabs(double{p[k]} * rows[k * stride + c]);
          }
          ASSERT_NEAR(acc_out[c], expected,
                      static_cast<double>(num_rows + 1) * 0x1p-24 * magnitude);
        }
      }
    }
  }
}

// The prefill form's softmax weights against FP64: masked keys weigh exactly 0, the maximum is
// exact, each weight e^(s − m) is within its FP32 argument's rounding (|s − m|·2^-24) plus the
// exp's own few ulps, and acc, l move to the new maximum.
TEST(MlaAttentionVecOps, PrefillWeightsMatchFp64) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::bernoulli_distribution coin(0.7);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (const auto& ops : vec_op_variants())
    for (int64_t n : {1, 5, 16, 17, 64})
      for (int64_t dim : {1, 17, 128})
        for (int start :
             {0, 1, 2, 3}) {  // first tile, a lower and a higher running max, none allowed
          SCOPED_TRACE(::testing::Message()
                       << ops.name << " n " << n << " dim " << dim << " start " << start);
          std::vector<float> scores(static_cast<size_t>(n)), rope(scores.size());
          std::vector<float> allowed(scores.size()), acc(static_cast<size_t>(dim));
          for (auto* v : {&scores, &rope, &acc})
            for (auto& e : *v) e = normal(rng);
          for (auto& a : allowed) a = start == 3 ? 0.0f : (coin(rng) ? 1.0f : 0.0f);
          if (start != 3) allowed[static_cast<size_t>(n / 2)] = 1.0f;
          const float scale = 0.37f;
          const float m0 = start == 0 ? kNegInf : (start == 1 ? -40.0f : 40.0f);
          const float l0 = start == 0 ? 0.0f : 2.5f;
          float m = m0, l = l0;
          std::vector<float> weights = scores, acc_out = acc;
          const bool any = ops.prefill_weights(weights.data(), rope.data(), allowed.data(), n,
                                               scale, m, l, acc_out.data(), dim);
          ASSERT_EQ(any, start != 3);
          if (!any) {
            for (float w : weights) ASSERT_EQ(w, 0.0f);
            ASSERT_EQ(m, m0);
            ASSERT_EQ(l, l0);
            ASSERT_EQ(acc_out, acc);
            continue;
          }
          std::vector<float> s(scores.size());
          float tile_max = kNegInf;
          for (int64_t k = 0; k < n; ++k) {
            s[k] = allowed[k] != 0 ? (scores[k] + rope[k]) * scale : kNegInf;
            tile_max = std::max(tile_max, s[k]);
          }
          const float m_new = std::max(m0, tile_max);
          ASSERT_EQ(m, m_new);
          double sum = 0, weight_error = 0;
          for (int64_t k = 0; k < n; ++k) {
            if (allowed[k] == 0) {
              ASSERT_EQ(weights[k], 0.0f) << "key " << k;
              continue;
            }
            const double gap = double{s[k]} - m_new, expected = std::exp(gap);
            const double bound = (std::fabs(gap) + 4) * 0x1p-24 * expected + 1e-37;
            sum += expected;
            weight_error += bound;
            ASSERT_NEAR(weights[k], expected, bound) << "key " << k;
          }
          const double correction = start == 0 ? 0.0 : std::exp(double{m0} - m_new);
          // e^(m − m_new) from the FP32 difference, as each weight; then one rounding per product.
          const double correction_error =
              start == 0 ? 0.0 : (std::fabs(double{m0} - m_new) + 5) * 0x1p-24;
          for (int64_t c = 0; c < dim; ++c)
            ASSERT_NEAR(acc_out[c], acc[c] * correction,
                        correction_error * std::fabs(acc[c] * correction));
          const double l_expected = l0 * correction + sum;
          // The weights' own errors, then n + 2 FP32 roundings of the sum and the rescaled l.
          ASSERT_NEAR(l, l_expected,
                      weight_error + correction_error * l0 * correction +
                          static_cast<double>(n + 2) * 0x1p-24 * l_expected);
        }
}

// The four-query forms give each query exactly what the one-query forms give it (the prefill
// attention groups queries by four; a query's result must not depend on its group).
TEST(MlaAttentionVecOps, FourQueryFormsEqualTheOneQueryFormsBitForBit) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<detail::MlaVecOps> variants = vec_op_variants();
  for (const auto& ops : variants)
    for (int64_t dim : {1, 15, 16, 17, 64, 127, 128, 129, 192}) {
      for (int64_t num_rows : {1, 3, 4, 5, 9, 64}) {
        SCOPED_TRACE(::testing::Message() << ops.name << " dim " << dim << " rows " << num_rows);
        const int64_t stride = dim + 3;
        std::vector<float> rows(static_cast<size_t>(num_rows * stride));
        std::vector<float> x(static_cast<size_t>(4 * dim)), p(static_cast<size_t>(4 * num_rows));
        std::vector<float> acc(static_cast<size_t>(4 * dim));
        for (auto* v : {&x, &rows, &p, &acc})
          for (auto& e : *v) e = normal(rng);
        std::vector<float> out4(static_cast<size_t>(4 * num_rows)), acc4 = acc;
        const float* xs[4];
        const float* ps[4];
        float* outs[4];
        float* accs[4];
        for (int q = 0; q < 4; ++q) {
          xs[q] = x.data() + q * dim;
          ps[q] = p.data() + q * num_rows;
          outs[q] = out4.data() + q * num_rows;
          accs[q] = acc4.data() + q * dim;
        }
        ops.dot_rows_x4(xs, rows.data(), stride, num_rows, dim, outs);
        ops.accumulate_rows_x4(ps, rows.data(), stride, num_rows, dim, accs);
        for (int q = 0; q < 4; ++q) {
          std::vector<float> out1(static_cast<size_t>(num_rows));
          std::vector<float> acc1(acc.begin() + q * dim, acc.begin() + (q + 1) * dim);
          ops.dot_rows(xs[q], rows.data(), stride, num_rows, dim, out1.data());
          ops.accumulate_rows(ps[q], rows.data(), stride, num_rows, dim, acc1.data());
          for (int64_t k = 0; k < num_rows; ++k)
            ASSERT_EQ(std::bit_cast<uint32_t>(outs[q][k]), std::bit_cast<uint32_t>(out1[k]))
                << "query " << q << " row " << k;
          for (int64_t c = 0; c < dim; ++c)
            ASSERT_EQ(std::bit_cast<uint32_t>(accs[q][c]), std::bit_cast<uint32_t>(acc1[c]))
                << "query " << q << " column " << c;
        }
      }
    }
}

TEST(MlaAttention, SelectingALaterPositionIsRefused) {
  std::mt19937 rng(7);
  Problem p = make_problem(rng, kOddBf16, 20, {5});
  p.selection = {1, 9, -1};
  p.selection_width = 3;
  std::vector<float> out;
  EXPECT_DEATH(mla_attention_prefill_ref(p.cache(), p.keys(), prefill_args(p, out)),
               "query at 5 selects the later position 9");
}

}  // namespace mla_attention_test
}  // namespace dz::kernels
