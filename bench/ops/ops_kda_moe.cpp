// KDA chunked prefill against the token-by-token recurrence (bench/kda_bench.cpp, at H = 16 so a
// run takes seconds), and one Kimi-K3 latent-MoE layer (bench/moe_latent_bench.cpp: d 7168, latent
// 3584, expert inter 3072, 2 fused shared SiTU experts, top-16 of 64 MXFP4 experts = 1.07 GiB of
// routed experts) for a decode token and a 64-token chunk, tokens grouped by expert.
//
// KDA FLOPs (FMA = 2), per head: chunked, per chunk of n rows, 6·n·d² for the three state products
// plus 4·n²·d for the pairwise terms; recurrent 7·d² per token. Both are judged against the FP32
// GEMM peak (they compute in FP32). MoE bytes: the router, latent projections and shared experts
// (BF16) plus each distinct routed expert the tokens select (MXFP4, as stored), x and out; FLOPs
// 2·(E·d + 2·r·d + 3·S·d + k·3·inter·r) per token. One token is judged against DRAM, 64 against the
// BF16 GEMM peak.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/core/tensor_view.h"
#include "dayzero/kernels/kda.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/blocks/moe.h"
#include "ops.h"

namespace dz::bench::ops {
namespace {

using kernels::LinearWeight;

// ---- KDA ------------------------------------------------------------------------------------

struct KdaInputs {
  std::vector<float> q, k, v, g, beta, state, out;
};

KdaInputs make_kda_inputs(const kernels::KdaDims& dims, int64_t tokens) {
  KdaInputs x;
  uint64_t state = 0xCDA;
  const auto n = static_cast<size_t>(tokens * dims.num_heads * dims.head_dim);
  const auto d = static_cast<size_t>(dims.head_dim);
  for (auto* a : {&x.q, &x.k, &x.v, &x.g}) a->resize(n);
  for (float& a : x.v) a = random_unit(state);
  for (auto* a : {&x.q, &x.k}) {  // L2-normalised rows, as the kernel's contract says
    for (size_t r = 0; r < n; r += d) {
      double ss = 0;
      for (size_t i = 0; i < d; ++i) {
        (*a)[r + i] = random_unit(state);
        ss += double{(*a)[r + i]} * (*a)[r + i];
      }
      for (size_t i = 0; i < d; ++i) (*a)[r + i] /= static_cast<float>(std::sqrt(ss));
    }
  }
  // Decay ≤ 0: −0.1·softplus(u), u uniform in [−2, 2).
  for (float& a : x.g) a = -0.1f * std::log1p(std::exp(2 * random_unit(state)));
  x.beta.resize(static_cast<size_t>(tokens * dims.num_heads));
  for (float& a : x.beta) a = 1.0f / (1.0f + std::exp(-2 * random_unit(state)));
  x.state.resize(static_cast<size_t>(dims.num_heads) * d * d);
  for (float& a : x.state) a = 0.1f * random_unit(state);
  x.out.resize(n);
  return x;
}

void add_kda(std::vector<OpCase>& cases, const kernels::KdaDims& dims, int64_t tokens,
             int64_t chunk) {
  for (bool chunked : {true, false}) {
    OpCase op;
    op.name =
        std::string("kda.") + (chunked ? "chunked" : "recurrent") + ".T" + std::to_string(tokens);
    op.shape = std::to_string(tokens) + " tokens, " + std::to_string(dims.num_heads) +
               " heads, d " + std::to_string(dims.head_dim) +
               (chunked ? ", chunk " + std::to_string(chunk) : ", token by token");
    op.group = "kda";
    op.limit = LimitKind::kGemmF32;
    op.setup = [=, key = op.group](const OpsOptions& options, Fixtures& fixtures) {
      KdaInputs& in = fixtures.get<KdaInputs>(key, [&] { return make_kda_inputs(dims, tokens); });
      const ExecContext ctx{options.num_threads};
      auto arena = std::make_shared<Arena>(
          chunked ? kernels::kda_chunked_scratch_bytes(ctx, dims, chunk) : size_t{64});
      PreparedCase p;
      // The state carries over from call to call (decayed, bounded), as in a long prefill.
      if (chunked) {
        p.body = [&in, arena, ctx, dims, tokens, chunk] {
          arena->reset();
          kernels::kda_chunked(ctx, dims, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                               in.beta.data(), tokens, 0, chunk, in.state.data(), in.out.data(),
                               *arena);
        };
      } else {
        p.body = [&in, ctx, dims, tokens] {
          kernels::kda_recurrent(ctx, dims, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                                 in.beta.data(), tokens, in.state.data(), in.out.data());
        };
      }
      const double h = static_cast<double>(dims.num_heads), d = static_cast<double>(dims.head_dim);
      const double t = static_cast<double>(tokens);
      p.bytes = 4.0 * (5 * t * h * d + t * h + 2 * h * d * d);
      if (chunked) {
        const double n = static_cast<double>(chunk);
        p.flops = h * (t / n) * (6 * n * d * d + 4 * n * n * d);
      } else {
        p.flops = h * t * 7 * d * d;
      }
      return p;
    };
    cases.push_back(std::move(op));
  }
}

// ---- latent MoE -----------------------------------------------------------------------------

struct MoeShape {
  int64_t hidden, latent, inter, shared, experts, top_k;
};

struct MoeLayer {
  std::unique_ptr<model::MoeBlock> moe;
  double expert_bytes = 0;  // stored bytes of one routed expert (gate, up, down)
  double dense_bytes = 0;   // router, latent projections, shared experts: read by every call
};

LinearWeight moe_mxfp4(int64_t out, int64_t in, uint64_t& state) {
  std::vector<uint8_t> packed(static_cast<size_t>(out * in / 2)),
      scales(static_cast<size_t>(out * in / 32));
  for (size_t e = 0; e < packed.size(); e += 8) {
    const uint64_t r = next_random(state);
    for (size_t b = 0; b < 8 && e + b < packed.size(); ++b)
      packed[e + b] = static_cast<uint8_t>(r >> (8 * b));
  }
  for (uint8_t& s : scales) s = static_cast<uint8_t>(118 + next_random(state) % 4);
  return LinearWeight::from_mxfp4(TensorView(packed.data(), DType::kU8, Shape{out, in / 2}),
                                  TensorView(scales.data(), DType::kU8, Shape{out, in / 32}))
      .value();
}

LinearWeight moe_bf16(int64_t out, int64_t in, uint64_t& state) {
  std::vector<float> w(static_cast<size_t>(out * in));
  const float scale = 3.0f / std::sqrt(static_cast<float>(in));
  for (float& v : w) v = random_unit(state) * scale;
  return LinearWeight::from_f32_as_bf16(w.data(), out, in);
}

MoeLayer make_moe(const MoeShape& s) {
  uint64_t state = 0x3E0E;
  model::MoeWeights w;
  // BF16-valued router weights, as checkpoints hold them (MoeBlock then runs it as a BF16 linear).
  w.gate_weight = random_activations(static_cast<size_t>(s.experts * s.hidden), 0x6A7E, 0.02f);
  w.e_score_correction_bias.resize(static_cast<size_t>(s.experts));
  for (float& b : w.e_score_correction_bias) b = 0.05f * (random_unit(state) + 1);
  MoeLayer layer;
  for (int64_t e = 0; e < s.experts; ++e) {
    model::MlpWeights expert{moe_mxfp4(s.inter, s.latent, state),
                             moe_mxfp4(s.inter, s.latent, state),
                             moe_mxfp4(s.latent, s.inter, state)};
    if (e == 0) {
      for (const LinearWeight* p : {&expert.gate_proj, &expert.up_proj, &expert.down_proj})
        layer.expert_bytes += static_cast<double>(p->stored_bytes());
    }
    w.experts.push_back(std::move(expert));
  }
  w.shared_experts.push_back({moe_bf16(s.shared, s.hidden, state),
                              moe_bf16(s.shared, s.hidden, state),
                              moe_bf16(s.hidden, s.shared, state)});
  w.latent_down_proj = moe_bf16(s.latent, s.hidden, state);
  w.latent_up_proj = moe_bf16(s.hidden, s.latent, state);
  w.latent_norm.assign(static_cast<size_t>(s.latent), 1.0f);
  layer.dense_bytes = 2.0 * static_cast<double>(s.experts * s.hidden + 2 * s.latent * s.hidden +
                                                3 * s.shared * s.hidden);
  layer.moe = std::make_unique<model::MoeBlock>(
      model::MoeConfig{.num_experts = s.experts,
                       .num_experts_per_tok = s.top_k,
                       .n_group = 1,
                       .topk_group = 1,
                       .norm_topk_prob = true,
                       .routed_scaling_factor = 1.0f,
                       .renorm_epsilon = 1e-20f,
                       .activation = {.kind = model::MlpActivation::Kind::kSitu,
                                      .situ_beta = 4.0f,
                                      .situ_linear_beta = 25.0f},
                       .latent_norm_eps = 1e-5f},
      std::move(w));
  return layer;
}

struct MoeStep {
  std::vector<float> x, y;
  std::unique_ptr<Arena> scratch;
};

void add_moe(std::vector<OpCase>& cases, const MoeShape& s, int64_t tokens) {
  OpCase op;
  op.name = "moe.latent.t" + std::to_string(tokens);
  op.shape = std::to_string(tokens) + " x d " + std::to_string(s.hidden) + ", top " +
             std::to_string(s.top_k) + " of " + std::to_string(s.experts) + " MXFP4 experts [" +
             std::to_string(s.inter) + ", " + std::to_string(s.latent) + "]";
  op.group = "moe";
  op.limit = tokens == 1 ? LimitKind::kDram : LimitKind::kGemmBf16;
  op.setup = [=, key = op.group](const OpsOptions& options, Fixtures& fixtures) {
    const MoeLayer& layer = fixtures.get<MoeLayer>(key, [&] { return make_moe(s); });
    auto step = std::make_shared<MoeStep>();
    step->x = random_activations(static_cast<size_t>(tokens * s.hidden), 0x7001 + tokens);
    step->y.resize(step->x.size());
    step->scratch = std::make_unique<Arena>(layer.moe->scratch_bytes(tokens));
    const ExecContext ctx{options.num_threads};
    // The experts these tokens select: each is read once per call however many tokens it serves.
    model::RoutingResult routing;
    model::route_grouped_sigmoid(ctx, layer.moe->config(), layer.moe->weights(), step->x.data(),
                                 tokens, s.hidden, routing);
    const std::set<int32_t> distinct(routing.expert_ids.begin(), routing.expert_ids.end());
    PreparedCase p;
    p.body = [&layer, step, ctx, tokens] {
      step->scratch->reset();
      layer.moe->forward(ctx, step->x.data(), tokens, step->y.data(), *step->scratch, nullptr, 0);
    };
    const double t = static_cast<double>(tokens);
    p.bytes = layer.dense_bytes + static_cast<double>(distinct.size()) * layer.expert_bytes +
              8.0 * t * static_cast<double>(s.hidden);
    p.flops = 2.0 * t *
              static_cast<double>(s.experts * s.hidden + 2 * s.latent * s.hidden +
                                  3 * s.shared * s.hidden + s.top_k * 3 * s.inter * s.latent);
    return p;
  };
  cases.push_back(std::move(op));
}

}  // namespace

void add_kda_moe_cases(bool quick, std::vector<OpCase>& cases, std::vector<RatioSpec>& ratios) {
  const kernels::KdaDims kda{.num_heads = quick ? 2 : 16, .head_dim = 128};
  const int64_t tokens = quick ? 128 : 4096;
  add_kda(cases, kda, tokens, 16);  // chunk 16: the model's default (model/blocks/kda.h)
  ratios.push_back({.name = "kda.chunked_speedup.T" + std::to_string(tokens),
                    .slow_case = "kda.recurrent.T" + std::to_string(tokens),
                    .fast_case = "kda.chunked.T" + std::to_string(tokens),
                    .target = quick ? 0.0 : 5.0});
  const MoeShape moe =
      quick ? MoeShape{256, 128, 128, 256, 8, 2} : MoeShape{7168, 3584, 3072, 6144, 64, 16};
  add_moe(cases, moe, 1);
  add_moe(cases, moe, 64);
}

}  // namespace dz::bench::ops
