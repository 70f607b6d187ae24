#pragma once
// A small KDA block with fresh random weights, for the block's tests (kda_test.cpp) and the
// context-parallel tests (model/context_parallel_mpitest.cpp). Test code only.

#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"
#include "dayzero/model/blocks/kda.h"

namespace dz::model::kda_testing {

constexpr int64_t kHidden = 96, kHeads = 2, kHeadDim = 32, kWidth = 4, kRank = 16;
constexpr int64_t kHd = kHeads * kHeadDim;
constexpr float kEps = 1e-5f;

struct Case {
  bool bounded = false;   // K3 gate lb·σ(e^A·f), else −e^A·softplus(f)
  bool low_rank = true;   // g_a/g_b output gate, else g_proj
  float dt_shift = 0.0f;  // added to dt_bias (drives the gate to its extremes)
  float a_log_lo = -4.0f, a_log_hi = 0.5f;
};

// The weights as dense FP32 (BF16-valued for linears), for the reference.
struct Dense {
  Case c;
  std::vector<float> q, k, v, q_conv, k_conv, v_conv, f_a, f_b, b, a_log, dt_bias, g_a, g_b, g,
      o_norm, o;
};

inline std::vector<float> random_values(std::mt19937& rng, int64_t n, float stddev, bool bf16) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = bf16 ? formats::round_to_bf16(normal(rng)) : normal(rng);
  return v;
}

inline std::vector<float> random_linear(std::mt19937& rng, int64_t out, int64_t in) {
  return random_values(rng, out * in, 1.0f / std::sqrt(static_cast<float>(in)), true);
}

inline Dense make_dense(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  Dense w;
  w.c = c;
  w.q = random_linear(rng, kHd, kHidden);
  w.k = random_linear(rng, kHd, kHidden);
  w.v = random_linear(rng, kHd, kHidden);
  w.q_conv = random_values(rng, kHd * kWidth, 0.6f, false);
  w.k_conv = random_values(rng, kHd * kWidth, 0.6f, false);
  w.v_conv = random_values(rng, kHd * kWidth, 0.6f, false);
  w.f_a = random_linear(rng, kRank, kHidden);
  w.f_b = random_linear(rng, kHd, kRank);
  w.b = random_linear(rng, kHeads, kHidden);
  std::uniform_real_distribution<float> a_log(c.a_log_lo, c.a_log_hi);
  for (int64_t h = 0; h < kHeads + 2; ++h) w.a_log.push_back(a_log(rng));  // padded like K3
  w.dt_bias = random_values(rng, kHd, 0.5f, false);
  for (auto& e : w.dt_bias) e += c.dt_shift;
  if (c.low_rank) {
    w.g_a = random_linear(rng, kRank, kHidden);
    w.g_b = random_linear(rng, kHd, kRank);
  } else {
    w.g = random_linear(rng, kHd, kHidden);
  }
  w.o_norm = random_values(rng, kHeadDim, 0.2f, false);
  for (auto& e : w.o_norm) e += 1.0f;
  w.o = random_linear(rng, kHidden, kHd);
  return w;
}

inline kernels::LinearWeight linear(const std::vector<float>& w, int64_t out, int64_t in) {
  return kernels::LinearWeight::from_f32_as_bf16(w.data(), out, in);
}

inline KdaWeights make_weights(const Dense& w) {
  KdaWeights kw{.q_proj = linear(w.q, kHd, kHidden),
                .k_proj = linear(w.k, kHd, kHidden),
                .v_proj = linear(w.v, kHd, kHidden),
                .q_conv = w.q_conv,
                .k_conv = w.k_conv,
                .v_conv = w.v_conv,
                .f_a_proj = linear(w.f_a, kRank, kHidden),
                .f_b_proj = linear(w.f_b, kHd, kRank),
                .b_proj = linear(w.b, kHeads, kHidden),
                .a_log = w.a_log,
                .dt_bias = w.dt_bias,
                .g_a_proj = {},
                .g_b_proj = {},
                .g_proj = {},
                .o_norm = w.o_norm,
                .o_proj = linear(w.o, kHidden, kHd)};
  if (w.c.low_rank) {
    kw.g_a_proj = linear(w.g_a, kRank, kHidden);
    kw.g_b_proj = linear(w.g_b, kHd, kRank);
  } else {
    kw.g_proj = linear(w.g, kHd, kHidden);
  }
  return kw;
}

inline KdaConfig make_config(const Dense& w, KdaPath path, int64_t chunk_size = 16) {
  KdaConfig config{.hidden_size = kHidden,
                   .num_heads = kHeads,
                   .head_dim = kHeadDim,
                   .conv_width = kWidth,
                   .gate_lower_bound = {},
                   .o_norm_eps = kEps,
                   .chunk_size = chunk_size,
                   .path = path};
  if (w.c.bounded) config.gate_lower_bound = -5.0f;
  return config;
}

inline KdaBlock make_block(const Dense& w, KdaPath path = KdaPath::kAuto, int64_t chunk_size = 16) {
  return KdaBlock(make_config(w, path, chunk_size), make_weights(w));
}

}  // namespace dz::model::kda_testing
