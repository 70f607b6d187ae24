// One Kimi-K3 latent-MoE layer (docs/models.md §6.3, §7.3) at the released widths — d 7168, latent
// 3584, expert inter 3072, 2 fused shared experts (6144), top-16 SiTU experts in compressed-tensors
// MXFP4 — with 64 of the 896 routed experts (memory: the layer's full 896 would be 15 GiB). What it
// shows (issue 4): the routed experts stay at 4.25 bits per weight in memory, plus one fixed
// dequantization workspace per thread, and how long a decode token and a prefill chunk take. The
// router's biases spread tokens over all experts as a real router does. Reported: the experts'
// stored bits per weight, the workspace, the bytes a decode token reads (router, latent
// projections, shared experts, 16 experts) as a fraction of the DRAM bandwidth measured in the same
// run.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/blocks/moe.h"
#include "machine_limits.h"

namespace {

using dz::kernels::LinearWeight;

constexpr int64_t kHidden = 7168, kLatent = 3584, kInter = 3072, kShared = 6144;
constexpr int64_t kExperts = 64, kTopK = 16;

uint64_t next_random(uint64_t& state) {
  state ^= state << 13, state ^= state >> 7, state ^= state << 17;
  return state;
}

LinearWeight mxfp4(int64_t out, int64_t in, uint64_t& state) {
  std::vector<uint8_t> packed(static_cast<size_t>(out * in / 2));
  std::vector<uint8_t> scales(static_cast<size_t>(out * in / 32));
  for (auto& b : packed) b = static_cast<uint8_t>(next_random(state));
  for (auto& s : scales) s = static_cast<uint8_t>(118 + next_random(state) % 4);
  return LinearWeight::from_mxfp4(
             dz::TensorView(packed.data(), dz::DType::kU8, dz::Shape{out, in / 2}),
             dz::TensorView(scales.data(), dz::DType::kU8, dz::Shape{out, in / 32}))
      .value();
}

LinearWeight bf16(int64_t out, int64_t in, uint64_t& state) {
  std::vector<float> w(static_cast<size_t>(out * in));
  const float scale = 1.0f / static_cast<float>(in);
  for (auto& v : w) v = (static_cast<float>(next_random(state) % 2001) - 1000.0f) * scale * 0.003f;
  return LinearWeight::from_f32_as_bf16(w.data(), out, in);
}

struct Layer {
  std::unique_ptr<dz::model::MoeBlock> moe;
  int64_t expert_bytes = 0;     // stored bytes of all routed experts
  int64_t expert_weights = 0;   // their parameters
  int64_t per_token_bytes = 0;  // what one decode token reads
};

const Layer& layer() {
  static const Layer l = [] {
    uint64_t state = 0x9E3779B97F4A7C15ull;
    dz::model::MoeWeights w;
    w.gate_weight.resize(static_cast<size_t>(kExperts * kHidden));
    for (auto& v : w.gate_weight)
      v = (static_cast<float>(next_random(state) % 2001) - 1000.0f) * 1e-5f;
    w.e_score_correction_bias.resize(kExperts);
    for (auto& b : w.e_score_correction_bias)
      b = static_cast<float>(next_random(state) % 1000) * 1e-4f;
    Layer out;
    for (int64_t e = 0; e < kExperts; ++e) {
      dz::model::MlpWeights expert{mxfp4(kInter, kLatent, state), mxfp4(kInter, kLatent, state),
                                   mxfp4(kLatent, kInter, state)};
      for (const LinearWeight* p : {&expert.gate_proj, &expert.up_proj, &expert.down_proj}) {
        out.expert_bytes += p->stored_bytes();
        out.expert_weights += p->out_features() * p->in_features();
      }
      w.experts.push_back(std::move(expert));
    }
    w.shared_experts.push_back({bf16(kShared, kHidden, state), bf16(kShared, kHidden, state),
                                bf16(kHidden, kShared, state)});
    w.latent_down_proj = bf16(kLatent, kHidden, state);
    w.latent_up_proj = bf16(kHidden, kLatent, state);
    w.latent_norm.assign(kLatent, 1.0f);
    const int64_t shared_bytes = 3 * kShared * kHidden * 2;
    out.per_token_bytes = kExperts * kHidden * 4 + 2 * kLatent * kHidden * 2 + shared_bytes +
                          kTopK * out.expert_bytes / kExperts;
    out.moe = std::make_unique<dz::model::MoeBlock>(
        dz::model::MoeConfig{.num_experts = kExperts,
                             .num_experts_per_tok = kTopK,
                             .n_group = 1,
                             .topk_group = 1,
                             .norm_topk_prob = true,
                             .routed_scaling_factor = 1.0f,
                             .renorm_epsilon = 1e-20f,
                             .activation = {.kind = dz::model::MlpActivation::Kind::kSitu,
                                            .situ_beta = 4.0f,
                                            .situ_linear_beta = 25.0f},
                             .latent_norm_eps = 1e-5f},
        std::move(w));
    std::fprintf(
        stderr,
        "K3 latent MoE, %lld of 896 experts: routed experts %.1f MiB stored for %lld "
        "weights = %.3f bits/weight; dequantization workspace %zu KiB per thread\n",
        static_cast<long long>(kExperts), static_cast<double>(out.expert_bytes) / 1048576.0,
        static_cast<long long>(out.expert_weights),
        8.0 * static_cast<double>(out.expert_bytes) / static_cast<double>(out.expert_weights),
        LinearWeight::mxfp4_workspace_bytes_per_thread() / 1024);
    return out;
  }();
  return l;
}

void BM_K3LatentMoe(benchmark::State& state) {
  const dz::bench::MachineLimits& m = dz::bench::limits_for_this_run();
  const Layer& l = layer();
  const int64_t num_tokens = state.range(0);
  const dz::ExecContext ctx{m.num_threads};
  std::vector<float> x(static_cast<size_t>(num_tokens * kHidden)), y(x.size());
  uint64_t s = 11;
  for (auto& v : x) v = (static_cast<float>(next_random(s) % 2001) - 1000.0f) * 1e-3f;
  dz::Arena scratch(l.moe->scratch_bytes(num_tokens));
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    scratch.reset();
    l.moe->forward(ctx, x.data(), num_tokens, y.data(), scratch, nullptr, 0);
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double calls = static_cast<double>(state.iterations());
  state.counters["tokens/s"] =
      benchmark::Counter(calls * static_cast<double>(num_tokens), benchmark::Counter::kIsRate);
  state.counters["expert_bits_per_weight"] =
      8.0 * static_cast<double>(l.expert_bytes) / static_cast<double>(l.expert_weights);
  state.counters["workspace_KiB_per_thread"] =
      static_cast<double>(LinearWeight::mxfp4_workspace_bytes_per_thread()) / 1024.0;
  state.counters["scratch_MiB"] = static_cast<double>(scratch.capacity_bytes()) / 1048576.0;
  if (num_tokens == 1) {
    const double gbps = calls * static_cast<double>(l.per_token_bytes) / seconds / 1e9;
    state.counters["decode_GB/s"] = gbps;
    state.counters["of_dram"] = gbps / m.dram_read_gbps;
    state.counters["decode_bytes_MiB"] = static_cast<double>(l.per_token_bytes) / 1048576.0;
  }
}

BENCHMARK(BM_K3LatentMoe)
    ->Arg(1)
    ->Arg(16)
    ->Arg(256)
    ->ArgName("tokens")
    ->UseRealTime()
    ->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
