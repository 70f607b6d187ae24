// MlaBlock against a plain FP64 MLA written from docs/models.md §2.1–2.2 that rounds to BF16 at the
// same points (issue-3 numerics policy) and applies the same FP8 round trip to c_kv; prefill,
// chunked prefill, decode, batching, fp8/bf16 caches, sparse selections, and the Kimi variants.
#include "dayzero/model/blocks/mla.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"

namespace dz::model {
namespace mla_test {

using formats::round_to_bf16;
using kernels::KvCacheDtype;

double rel_rms(const std::vector<float>& out, const std::vector<float>& ref) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += (double{out[i]} - ref[i]) * (double{out[i]} - ref[i]);
    norm += double{ref[i]} * ref[i];
  }
  return std::sqrt(err / norm);
}

// Raw BF16-valued weights, [out, in] like the checkpoint.
struct RawWeights {
  std::vector<float> q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b, o, g;
};

struct MlaSetup {
  MlaConfig config;
  RawWeights raw;
  KvCacheDtype dtype = KvCacheDtype::kBf16;
};

std::vector<float> random_bf16(std::mt19937& rng, int64_t num_elems, float stddev, float mean = 0) {
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> v(static_cast<size_t>(num_elems));
  for (auto& e : v) e = round_to_bf16(normal(rng));
  return v;
}

MlaSetup make_setup(std::mt19937& rng, MlaConfig config, KvCacheDtype dtype) {
  MlaSetup s{.config = std::move(config), .raw = {}, .dtype = dtype};
  const MlaConfig& c = s.config;
  const int64_t H = c.num_heads, d = c.hidden_size,
                q_width = c.qk_nope_head_dim + c.qk_rope_head_dim;
  auto scale = [](int64_t in) { return 1.0f / std::sqrt(static_cast<float>(in)); };
  const int64_t q_in = c.q_lora_rank > 0 ? c.q_lora_rank : d;
  if (c.q_lora_rank > 0) {
    s.raw.q_a = random_bf16(rng, c.q_lora_rank * d, scale(d));
    s.raw.q_a_norm = random_bf16(rng, c.q_lora_rank, 0.1f, 1.0f);
  }
  s.raw.q_b = random_bf16(rng, H * q_width * q_in, scale(q_in));
  s.raw.kv_a = random_bf16(rng, (c.kv_lora_rank + c.qk_rope_head_dim) * d, scale(d));
  s.raw.kv_a_norm = random_bf16(rng, c.kv_lora_rank, 0.1f, 1.0f);
  s.raw.kv_b = random_bf16(rng, H * (c.qk_nope_head_dim + c.v_head_dim) * c.kv_lora_rank,
                           scale(c.kv_lora_rank));
  s.raw.o = random_bf16(rng, d * H * c.v_head_dim, scale(H * c.v_head_dim));
  if (c.output_gate) s.raw.g = random_bf16(rng, H * c.v_head_dim * d, scale(d));
  return s;
}

MlaBlock make_block(const MlaSetup& s) {
  const MlaConfig& c = s.config;
  const int64_t H = c.num_heads, d = c.hidden_size,
                q_width = c.qk_nope_head_dim + c.qk_rope_head_dim;
  using kernels::LinearWeight;
  MlaWeights w;
  if (c.q_lora_rank > 0) {
    w.q_a_proj = LinearWeight::from_f32_as_bf16(s.raw.q_a.data(), c.q_lora_rank, d);
    w.q_a_layernorm = s.raw.q_a_norm;
  }
  w.q_b_proj = LinearWeight::from_f32_as_bf16(s.raw.q_b.data(), H * q_width,
                                              c.q_lora_rank > 0 ? c.q_lora_rank : d);
  w.kv_a_proj_with_mqa =
      LinearWeight::from_f32_as_bf16(s.raw.kv_a.data(), c.kv_lora_rank + c.qk_rope_head_dim, d);
  w.kv_a_layernorm = s.raw.kv_a_norm;
  w.kv_b_proj = LinearWeight::from_f32_as_bf16(
      s.raw.kv_b.data(), H * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank);
  w.o_proj = LinearWeight::from_f32_as_bf16(s.raw.o.data(), d, H * c.v_head_dim);
  if (c.output_gate) w.g_proj = LinearWeight::from_f32_as_bf16(s.raw.g.data(), H * c.v_head_dim, d);
  return MlaBlock(c, std::move(w));
}

// ---- The reference: one sequence, positions 0 … T−1, FP64 between the BF16 rounding points. ----

// y [rows, out] = round_bf16(x [rows, in] · Wᵀ)
std::vector<float> ref_linear(const std::vector<float>& x, const std::vector<float>& w,
                              int64_t num_rows, int64_t in, int64_t out) {
  std::vector<float> y(static_cast<size_t>(num_rows * out));
  for (int64_t r = 0; r < num_rows; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0;
      for (int64_t i = 0; i < in; ++i) acc += double{x[r * in + i]} * w[o * in + i];
      y[r * out + o] = round_to_bf16(static_cast<float>(acc));
    }
  return y;
}

void ref_rms_norm(float* x, const std::vector<float>& w, int64_t dim, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < dim; ++i) sum += double{x[i]} * x[i];
  const double inv = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
  for (int64_t i = 0; i < dim; ++i) x[i] = round_to_bf16(static_cast<float>(w[i] * (x[i] * inv)));
}

// Interleaved RoPE, docs/models.md §1.2: FP32 angle p·f_i and FP32 cos/sin as the reference, the
// rotation itself in FP64, rounded to BF16.
void ref_rope(float* x, const kernels::RopeFrequencies& f, int32_t pos) {
  for (size_t i = 0; i < f.inv_freq.size(); ++i) {
    const float angle = static_cast<float>(pos) * f.inv_freq[i];
    const double c = double{std::cos(angle) * f.magnitude},
                 s = double{std::sin(angle) * f.magnitude};
    const double a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = round_to_bf16(static_cast<float>(a * c - b * s));
    x[2 * i + 1] = round_to_bf16(static_cast<float>(a * s + b * c));
  }
}

// The act_quant round trip of the FP8 cache (docs/models.md §2.4).
void ref_fp8_round_trip(float* c_kv, int64_t dim) {
  std::vector<uint16_t> bf16(static_cast<size_t>(dim));
  for (int64_t i = 0; i < dim; ++i) bf16[static_cast<size_t>(i)] = formats::encode_bf16(c_kv[i]);
  std::vector<uint8_t> codes(static_cast<size_t>(dim));
  std::vector<float> scales(static_cast<size_t>(dim / 128));
  formats::act_quant(bf16, formats::ActScaleFormat::kUe8m0, codes, scales);
  for (int64_t i = 0; i < dim; ++i)
    c_kv[i] =
        formats::decode_e4m3(codes[static_cast<size_t>(i)]) * scales[static_cast<size_t>(i / 128)];
}

// x [T, d] → out [T, d]. allowed(t, s): whether query t attends to key s (s ≤ t).
template <typename Allowed>
std::vector<float> reference_mla(const MlaSetup& s, const std::vector<float>& x, int64_t T,
                                 Allowed allowed) {
  const MlaConfig& c = s.config;
  const int64_t H = c.num_heads, d = c.hidden_size, d_n = c.qk_nope_head_dim;
  const int64_t d_r = c.qk_rope_head_dim, d_v = c.v_head_dim, r_kv = c.kv_lora_rank;
  const int64_t q_width = d_n + d_r;
  std::vector<float> q;
  if (c.q_lora_rank > 0) {
    std::vector<float> c_q = ref_linear(x, s.raw.q_a, T, d, c.q_lora_rank);
    for (int64_t t = 0; t < T; ++t)
      ref_rms_norm(c_q.data() + t * c.q_lora_rank, s.raw.q_a_norm, c.q_lora_rank, c.q_norm_eps);
    q = ref_linear(c_q, s.raw.q_b, T, c.q_lora_rank, H * q_width);
  } else {
    q = ref_linear(x, s.raw.q_b, T, d, H * q_width);
  }
  std::vector<float> kv = ref_linear(x, s.raw.kv_a, T, d, r_kv + d_r);
  for (int64_t t = 0; t < T; ++t) {
    float* row = kv.data() + t * (r_kv + d_r);
    ref_rms_norm(row, s.raw.kv_a_norm, r_kv, c.kv_norm_eps);
    if (s.dtype == KvCacheDtype::kFp8) ref_fp8_round_trip(row, r_kv);
    if (c.rope) {
      ref_rope(row + r_kv, *c.rope, static_cast<int32_t>(t));
      for (int64_t h = 0; h < H; ++h)
        ref_rope(q.data() + (t * H + h) * q_width + d_n, *c.rope, static_cast<int32_t>(t));
    }
  }
  // k_nope [T, H, d_n], v [T, H, d_v] = W_UK_h c_kv, W_UV_h c_kv in FP64 (§2.2).
  std::vector<double> k_nope(static_cast<size_t>(T * H * d_n)), v(static_cast<size_t>(T * H * d_v));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t j = 0; j < d_n + d_v; ++j) {
        double acc = 0;
        for (int64_t i = 0; i < r_kv; ++i)
          acc += double{s.raw.kv_b[(h * (d_n + d_v) + j) * r_kv + i]} * kv[t * (r_kv + d_r) + i];
        if (j < d_n)
          k_nope[(t * H + h) * d_n + j] = acc;
        else
          v[(t * H + h) * d_v + j - d_n] = acc;
      }
  std::vector<float> gate;
  if (c.output_gate) gate = ref_linear(x, s.raw.g, T, d, H * d_v);
  std::vector<float> o(static_cast<size_t>(T * H * d_v));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const float* qh = q.data() + (t * H + h) * q_width;
      std::vector<double> p(static_cast<size_t>(t + 1), -INFINITY);
      double max_score = -INFINITY;
      for (int64_t k = 0; k <= t; ++k) {
        if (!allowed(t, k)) continue;  // −∞ outside the selection (docs/models.md §3.4)
        double dot = 0;
        for (int64_t i = 0; i < d_n; ++i) dot += qh[i] * k_nope[(k * H + h) * d_n + i];
        for (int64_t i = 0; i < d_r; ++i)
          dot += double{qh[d_n + i]} * kv[k * (r_kv + d_r) + r_kv + i];
        p[static_cast<size_t>(k)] = dot * double{c.softmax_scale};
        max_score = std::max(max_score, p[static_cast<size_t>(k)]);
      }
      double sum = 0;
      for (double& e : p) sum += (e = std::exp(e - max_score));
      for (int64_t j = 0; j < d_v; ++j) {
        double acc = 0;
        for (int64_t k = 0; k <= t; ++k)
          acc += p[static_cast<size_t>(k)] * v[(k * H + h) * d_v + j];
        acc /= sum;
        const int64_t idx = (t * H + h) * d_v + j;
        if (c.output_gate) acc *= 1.0 / (1.0 + std::exp(-double{gate[static_cast<size_t>(idx)]}));
        o[static_cast<size_t>(idx)] = round_to_bf16(static_cast<float>(acc));
      }
    }
  return ref_linear(o, s.raw.o, T, H * d_v, d);
}

std::vector<float> reference_dense(const MlaSetup& s, const std::vector<float>& x, int64_t T) {
  return reference_mla(s, x, T, [](int64_t, int64_t) { return true; });
}

// ---- Running the block. ----

struct TapRecorder : TapSink {
  std::map<std::string, Shape> shapes;
  void on_tap(int, std::string_view name, const float*, const Shape& shape) override {
    shapes[std::string(name)] = shape;
  }
};

// One sequence's cache and block table, kept across calls (chunked prefill, decode).
struct SequenceCache {
  int64_t block_size = 16;
  kernels::MlaCacheLayout layout;
  std::vector<std::byte> pool;
  std::vector<int32_t> block_table;

  SequenceCache(std::mt19937& rng, const MlaSetup& s, int64_t max_tokens) {
    layout = {.latent_dim = s.config.kv_lora_rank,
              .rope_dim = s.config.qk_rope_head_dim,
              .dtype = s.dtype};
    const int64_t num_blocks = (max_tokens + block_size - 1) / block_size,
                  pool_blocks = num_blocks * 2;
    pool.resize(static_cast<size_t>(pool_blocks * block_size * layout.record_bytes()));
    std::vector<int32_t> ids(static_cast<size_t>(pool_blocks));
    for (int32_t b = 0; b < pool_blocks; ++b) ids[static_cast<size_t>(b)] = b;
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table.assign(ids.begin(), ids.begin() + num_blocks);
  }
};

// Runs tokens [pos_begin, pos_begin + n) of x_full [*, d] through the block; returns out [n, d].
std::vector<float> run_chunk(const MlaBlock& block, SequenceCache& sc,
                             const std::vector<float>& x_full, int64_t pos_begin, int64_t n,
                             const std::vector<int32_t>& selection_full, int64_t width,
                             int num_threads = 2, TapSink* taps = nullptr) {
  const MlaConfig& c = block.config();
  const int64_t d = c.hidden_size;
  std::vector<int32_t> token_ids(static_cast<size_t>(n), 0), positions(static_cast<size_t>(n));
  std::vector<int64_t> slots(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    positions[static_cast<size_t>(i)] = static_cast<int32_t>(pos_begin + i);
    slots[static_cast<size_t>(i)] = slot_of(sc.block_table, sc.block_size, pos_begin + i);
  }
  ForwardBatch batch{.token_ids = token_ids,
                     .positions = positions,
                     .slot_mapping = slots,
                     .sequences = {SequenceSlice{.token_begin = 0,
                                                 .num_tokens = n,
                                                 .pos_begin = pos_begin,
                                                 .block_table = sc.block_table}},
                     .block_size = sc.block_size};
  const ExecContext ctx{.num_threads = num_threads};
  std::vector<float> x(x_full.begin() + pos_begin * d, x_full.begin() + (pos_begin + n) * d);
  std::vector<float> c_q;
  if (c.q_lora_rank > 0) {
    c_q.resize(static_cast<size_t>(n * c.q_lora_rank));
    block.q_latent(ctx, x.data(), n, c_q.data());
  }
  TokenSelection selection;
  if (width > 0) {
    selection.positions =
        std::span<const int32_t>(selection_full)
            .subspan(static_cast<size_t>(pos_begin * width), static_cast<size_t>(n * width));
    selection.width = width;
  }
  Arena scratch(block.scratch_bytes(ctx, n, width));
  std::vector<float> out(static_cast<size_t>(n * d));
  MlaLayerCache cache{.layout = sc.layout, .pool = sc.pool.data()};
  block.forward(ctx, batch, x.data(), c_q.empty() ? nullptr : c_q.data(), cache, selection,
                out.data(), scratch, taps, 3);
  return out;
}

MlaConfig deepseek_tiny_config() {
  kernels::YarnParams yarn{.factor = 40,
                           .original_max_position_embeddings = 4096,
                           .beta_fast = 32,
                           .beta_slow = 1,
                           .mscale = 1.0,
                           .mscale_all_dim = 1.0};
  const double m = kernels::yarn_mscale(40, 1.0);
  return MlaConfig{.hidden_size = 128,
                   .num_heads = 4,
                   .q_lora_rank = 64,
                   .kv_lora_rank = 256,
                   .qk_nope_head_dim = 64,
                   .qk_rope_head_dim = 64,
                   .v_head_dim = 64,
                   .softmax_scale = static_cast<float>(m * m / std::sqrt(128.0)),
                   .rope = kernels::yarn_rope_frequencies(64, 10000.0, yarn)};
}

// Kimi-K3 style: q LoRA, NoPE, output gate.
MlaConfig k3_tiny_config() {
  return MlaConfig{.hidden_size = 128,
                   .num_heads = 4,
                   .q_lora_rank = 64,
                   .kv_lora_rank = 64,
                   .qk_nope_head_dim = 32,
                   .qk_rope_head_dim = 16,
                   .v_head_dim = 32,
                   .softmax_scale = static_cast<float>(1.0 / std::sqrt(48.0)),
                   .rope = std::nullopt,
                   .output_gate = true};
}

// Kimi-Linear style: no q LoRA (q_proj), NoPE.
MlaConfig kimi_linear_tiny_config() {
  return MlaConfig{.hidden_size = 128,
                   .num_heads = 4,
                   .q_lora_rank = 0,
                   .kv_lora_rank = 64,
                   .qk_nope_head_dim = 32,
                   .qk_rope_head_dim = 16,
                   .v_head_dim = 32,
                   .softmax_scale = static_cast<float>(1.0 / std::sqrt(48.0)),
                   .rope = std::nullopt};
}

// BF16 activations against an FP64 reference rounded at the same points: rounding flips of one
// BF16 ulp where the FP32 and FP64 pre-rounding values straddle a tie; docs/models.md §8.1 allows
// 1e-2 for bf16 paths (and for FP8 against a reference applying the same quantization).
constexpr double kBf16Tolerance = 1e-2;

class MlaBlockCache : public ::testing::TestWithParam<KvCacheDtype> {};

TEST_P(MlaBlockCache, PrefillChunkedAndDecodeMatchTheReference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const MlaSetup s = make_setup(rng, deepseek_tiny_config(), GetParam());
  const MlaBlock block = make_block(s);
  const int64_t T = 37, d = s.config.hidden_size;
  const std::vector<float> x = random_bf16(rng, T * d, 1.0f);
  const std::vector<float> ref = reference_dense(s, x, T);

  SequenceCache full_cache(rng, s, T);
  TapRecorder taps;
  const std::vector<float> full = run_chunk(block, full_cache, x, 0, T, {}, 0, 2, &taps);
  EXPECT_LT(rel_rms(full, ref), kBf16Tolerance) << "prefill";
  ASSERT_TRUE(taps.shapes.count("attn_out"));
  EXPECT_EQ(taps.shapes["attn_out"], (Shape{T, d}));

  // Two chunks, the second (17 queries over 37 keys) in the absorbed form: fewer FLOPs than
  // up-projecting all 37 keys.
  SequenceCache chunk_cache(rng, s, T);
  std::vector<float> chunked = run_chunk(block, chunk_cache, x, 0, 20, {}, 0);
  const std::vector<float> rest = run_chunk(block, chunk_cache, x, 20, T - 20, {}, 0);
  chunked.insert(chunked.end(), rest.begin(), rest.end());
  EXPECT_LT(rel_rms(chunked, ref), kBf16Tolerance) << "chunked";
  EXPECT_LT(rel_rms(chunked, full), kBf16Tolerance) << "chunked vs full";

  SequenceCache decode_cache(rng, s, T);  // prompt of 3 (prefill form), then one at a time
  std::vector<float> decoded = run_chunk(block, decode_cache, x, 0, 3, {}, 0);
  for (int64_t t = 3; t < T; ++t) {
    const std::vector<float> step =
        run_chunk(block, decode_cache, x, t, 1, {}, 0, static_cast<int>(1 + t % 3));
    decoded.insert(decoded.end(), step.begin(), step.end());
  }
  EXPECT_LT(rel_rms(decoded, ref), kBf16Tolerance) << "decode";
  EXPECT_LT(rel_rms(decoded, full), kBf16Tolerance) << "decode vs full";
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MlaBlockCache,
                         ::testing::Values(KvCacheDtype::kFp8, KvCacheDtype::kBf16),
                         [](const auto& dtype_info) {
                           return dtype_info.param == KvCacheDtype::kFp8 ? std::string("Fp8")
                                                                         : std::string("Bf16");
                         });

// Per token t: all of 0…t while t + 1 ≤ width, else t itself, 0 and width − 3 random others (one
// −1 pad at least), shuffled.
std::vector<int32_t> hand_made_selection(std::mt19937& rng, int64_t T, int64_t width) {
  std::vector<int32_t> sel(static_cast<size_t>(T * width), -1);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> chosen;
    if (t + 1 <= width) {
      for (int32_t k = 0; k <= t; ++k) chosen.push_back(k);
    } else {
      chosen = {static_cast<int32_t>(t), 0};
      std::vector<int32_t> others;
      for (int32_t k = 1; k < t; ++k) others.push_back(k);
      std::shuffle(others.begin(), others.end(), rng);
      chosen.insert(chosen.end(), others.begin(), others.begin() + (width - 3));
    }
    std::shuffle(chosen.begin(), chosen.end(), rng);
    std::copy(chosen.begin(), chosen.end(), sel.begin() + t * width);
  }
  return sel;
}

TEST(MlaBlock, SparseSelectionMatchesTheMaskedReference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const MlaSetup s = make_setup(rng, deepseek_tiny_config(), KvCacheDtype::kFp8);
  const MlaBlock block = make_block(s);
  const int64_t T = 37, d = s.config.hidden_size;
  const std::vector<float> x = random_bf16(rng, T * d, 1.0f);
  const std::vector<float> dense_ref = reference_dense(s, x, T);
  // The 37-token prefill runs in the prefill form (all keys in one 64-key block), the decode rows
  // in the absorbed form.
  for (int64_t width : {8, 12}) {
    SCOPED_TRACE(::testing::Message() << "width " << width);
    const std::vector<int32_t> sel = hand_made_selection(rng, T, width);
    const std::vector<float> ref = reference_mla(s, x, T, [&](int64_t t, int64_t k) {
      const auto row = sel.begin() + t * width;
      return std::find(row, row + width, static_cast<int32_t>(k)) != row + width;
    });
    EXPECT_GT(rel_rms(ref, dense_ref), 10 * kBf16Tolerance) << "the selection must matter";
    SequenceCache sc(rng, s, T);
    const std::vector<float> out = run_chunk(block, sc, x, 0, T, sel, width);
    EXPECT_LT(rel_rms(out, ref), kBf16Tolerance);
    // And decode over the same cache reproduces the last rows.
    SequenceCache dc(rng, s, T);
    std::vector<float> decoded = run_chunk(block, dc, x, 0, 30, sel, width);
    for (int64_t t = 30; t < T; ++t) {
      const auto step = run_chunk(block, dc, x, t, 1, sel, width);
      decoded.insert(decoded.end(), step.begin(), step.end());
    }
    EXPECT_LT(rel_rms(decoded, ref), kBf16Tolerance) << "decode";
  }
}

TEST(MlaBlock, SelectionOfTheWholePrefixEqualsDense) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const MlaSetup s = make_setup(rng, deepseek_tiny_config(), KvCacheDtype::kFp8);
  const MlaBlock block = make_block(s);
  const int64_t T = 37, width = 40, d = s.config.hidden_size;
  const std::vector<float> x = random_bf16(rng, T * d, 1.0f);
  const std::vector<int32_t> sel = hand_made_selection(rng, T, width);  // every t + 1 ≤ 40
  SequenceCache dense_cache(rng, s, T), sparse_cache(rng, s, T);
  const auto dense = run_chunk(block, dense_cache, x, 0, T, {}, 0);
  const auto sparse = run_chunk(block, sparse_cache, x, 0, T, sel, width);
  // Same keys, same form, same key order after sorting: FP32-identical up to reassociation.
  EXPECT_LT(rel_rms(sparse, dense), 1e-5);
}

TEST(MlaBlock, BatchOfSequencesUsesBothFormsAndMatchesSeparateRuns) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const MlaSetup s = make_setup(rng, deepseek_tiny_config(), KvCacheDtype::kBf16);
  const MlaBlock block = make_block(s);
  const int64_t d = s.config.hidden_size;
  // Sequence A: 20 new tokens from scratch (prefill form). Sequence B: 17 cached, then 2 new
  // (absorbed form). One batch; then each alone against the reference.
  const std::vector<float> xa = random_bf16(rng, 20 * d, 1.0f), xb = random_bf16(rng, 19 * d, 1.0f);
  SequenceCache ca(rng, s, 20), cb(rng, s, 19);
  run_chunk(block, cb, xb, 0, 17, {}, 0);
  // Shared pool: B's blocks follow A's.
  std::vector<std::byte> pool(ca.pool.size() + cb.pool.size());
  std::copy(cb.pool.begin(), cb.pool.end(),
            pool.begin() + static_cast<std::ptrdiff_t>(ca.pool.size()));
  const auto offset_blocks =
      static_cast<int32_t>(ca.pool.size() / static_cast<size_t>(ca.layout.record_bytes() * 16));
  std::vector<int32_t> table_b = cb.block_table;
  for (auto& b : table_b) b += offset_blocks;
  std::vector<int32_t> token_ids(22, 0), positions;
  std::vector<int64_t> slots;
  for (int32_t p = 0; p < 20; ++p)
    positions.push_back(p), slots.push_back(slot_of(ca.block_table, 16, p));
  for (int32_t p = 17; p < 19; ++p)
    positions.push_back(p), slots.push_back(slot_of(table_b, 16, p));
  ForwardBatch batch{
      .token_ids = token_ids,
      .positions = positions,
      .slot_mapping = slots,
      .sequences =
          {SequenceSlice{
               .token_begin = 0, .num_tokens = 20, .pos_begin = 0, .block_table = ca.block_table},
           SequenceSlice{
               .token_begin = 20, .num_tokens = 2, .pos_begin = 17, .block_table = table_b}},
      .block_size = 16};
  std::vector<float> x(xa);
  x.insert(x.end(), xb.begin() + 17 * d, xb.end());
  const ExecContext ctx{.num_threads = 2};
  std::vector<float> c_q(static_cast<size_t>(22 * s.config.q_lora_rank)),
      out(static_cast<size_t>(22 * d));
  block.q_latent(ctx, x.data(), 22, c_q.data());
  Arena scratch(block.scratch_bytes(ctx, 22, 0));
  block.forward(ctx, batch, x.data(), c_q.data(), {.layout = ca.layout, .pool = pool.data()}, {},
                out.data(), scratch, nullptr, 0);
  const auto ref_a = reference_dense(s, xa, 20), ref_b = reference_dense(s, xb, 19);
  EXPECT_LT(rel_rms(std::vector<float>(out.begin(), out.begin() + 20 * d), ref_a), kBf16Tolerance);
  EXPECT_LT(rel_rms(std::vector<float>(out.begin() + 20 * d, out.end()),
                    std::vector<float>(ref_b.begin() + 17 * d, ref_b.end())),
            kBf16Tolerance);
}

TEST(MlaBlock, KimiVariantsMatchTheReference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (const MlaConfig& config : {k3_tiny_config(), kimi_linear_tiny_config()}) {
    SCOPED_TRACE(config.output_gate ? "K3: NoPE, output gate" : "Kimi-Linear: NoPE, q_proj");
    const MlaSetup s = make_setup(rng, config, KvCacheDtype::kBf16);
    const MlaBlock block = make_block(s);
    const int64_t T = 21, d = s.config.hidden_size;
    const std::vector<float> x = random_bf16(rng, T * d, 1.0f);
    const auto ref = reference_dense(s, x, T);
    SequenceCache sc(rng, s, T);
    EXPECT_LT(rel_rms(run_chunk(block, sc, x, 0, T, {}, 0), ref), kBf16Tolerance) << "prefill";
    SequenceCache dc(rng, s, T);
    std::vector<float> decoded = run_chunk(block, dc, x, 0, 10, {}, 0);
    for (int64_t t = 10; t < T; ++t) {
      const auto step = run_chunk(block, dc, x, t, 1, {}, 0);
      decoded.insert(decoded.end(), step.begin(), step.end());
    }
    EXPECT_LT(rel_rms(decoded, ref), kBf16Tolerance) << "decode";
  }
}

// The form choice by FLOP count on DeepSeek-V2-Lite's MLA dims (16 heads, r_kv 512, d 128/64/128).
TEST(MlaFormFlops, CountsTheFormulasAndPicksTheCheaperForm) {
  const MlaConfig c{.hidden_size = 2048,
                    .num_heads = 16,
                    .kv_lora_rank = 512,
                    .qk_nope_head_dim = 128,
                    .qk_rope_head_dim = 64,
                    .v_head_dim = 128,
                    .rope = std::nullopt};
  const double projection = 2.0 * 16 * 512 * 256;  // W_UK and W_UV, per query or per key
  const double pair_absorbed = 2.0 * 16 * (2 * 512 + 64), pair_prefill = 2.0 * 16 * 320;
  const auto chunk = [](int32_t first, int32_t count) {
    std::vector<int32_t> positions(static_cast<size_t>(count));
    std::iota(positions.begin(), positions.end(), first);
    return positions;
  };
  {  // one decode row at position 100: 101 keys
    const std::vector<int32_t> pos = chunk(100, 1);
    const MlaFormFlops f =
        mla_form_flops(c, {.positions = pos, .selection = {}, .selection_width = 0});
    EXPECT_DOUBLE_EQ(f.absorbed, projection + 101 * pair_absorbed);
    EXPECT_DOUBLE_EQ(f.prefill, 101 * projection + 101 * pair_prefill);
    EXPECT_LT(f.absorbed, f.prefill);
  }
  {  // a prefix hit: 64 new tokens after 1984 cached ones
    const std::vector<int32_t> pos = chunk(1984, 64);
    const MlaFormFlops f =
        mla_form_flops(c, {.positions = pos, .selection = {}, .selection_width = 0});
    const double pairs = 64.0 * 1985 + 64.0 * 63 / 2;
    EXPECT_DOUBLE_EQ(f.absorbed, 64 * projection + pairs * pair_absorbed);
    EXPECT_DOUBLE_EQ(f.prefill, 2048 * projection + pairs * pair_prefill);
    EXPECT_LT(f.absorbed, f.prefill);
  }
  {  // a fresh prefill of 512 tokens: the same projections, cheaper pairs
    const std::vector<int32_t> pos = chunk(0, 512);
    const MlaFormFlops f =
        mla_form_flops(c, {.positions = pos, .selection = {}, .selection_width = 0});
    EXPECT_LT(f.prefill, f.absorbed);
  }
  {  // after 2048 cached keys: 100 new tokens absorbed, 1000 in the prefill form (even at ~160)
    const std::vector<int32_t> short_chunk = chunk(2048, 100), long_chunk = chunk(2048, 1000);
    const MlaFormFlops a =
        mla_form_flops(c, {.positions = short_chunk, .selection = {}, .selection_width = 0});
    const MlaFormFlops b =
        mla_form_flops(c, {.positions = long_chunk, .selection = {}, .selection_width = 0});
    EXPECT_LT(a.absorbed, a.prefill);
    EXPECT_LT(b.prefill, b.absorbed);
  }
  {  // sparse: two queries selecting keys of 64-key blocks 0, 2 and 3 of a 200-key range
    const std::vector<int32_t> pos = {198, 199};
    const std::vector<int32_t> sel = {0, 5, 130, -1, 1, 199, 131, 63};
    const MlaFormFlops f =
        mla_form_flops(c, {.positions = pos, .selection = sel, .selection_width = 4});
    // Blocks [0, 64), [128, 192) and the partial [192, 200) are up-projected; −1 is skipped.
    EXPECT_DOUBLE_EQ(f.prefill, (64 + 64 + 8) * projection + 7 * pair_prefill);
    EXPECT_DOUBLE_EQ(f.absorbed, 2 * projection + 7 * pair_absorbed);
  }
}

TEST(MlaBlock, MisshapedKvBProjIsRefused) {
  std::mt19937 rng(1);
  MlaSetup s = make_setup(rng, kimi_linear_tiny_config(), KvCacheDtype::kBf16);
  s.raw.kv_b.resize(s.raw.kv_b.size() / 2);
  MlaWeights w;
  w.kv_b_proj = kernels::LinearWeight::from_f32_as_bf16(s.raw.kv_b.data(), 4 * 32, 64);
  EXPECT_DEATH(MlaBlock(s.config, std::move(w)), "kv_b_proj is \\[128, 64\\], want \\[256, 64\\]");
}

}  // namespace mla_test
}  // namespace dz::model
