// KDA prefill of one 4096-token sequence at Kimi-Linear dims (H = 32, d = 128, FP32): the chunked
// kernel (chunk 16, 32 and 64, models.md §4.7) against the token-by-token recurrence (kda_recurrent
// over the same tokens, its fastest form: one call, heads in parallel). Reports tokens/s and the
// FLOP rate as a fraction of the FP32 GEMM limit measured in the same run (machine_limits.h).
//
// FLOPs counted (FMA = 2): chunked, per chunk of n rows and head, 6·n·d² for the three state
// products (S0ᵀ kg, S0ᵀ qg, the state update) plus 4·n²·d for the pairwise L, A, the forward
// substitution and the intra-chunk output (exponentials not counted); recurrent, per token and
// head, 7·d² (decay, prediction, update, read-out). The issue-4 target is chunked ≥ 5× faster.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"
#include "dayzero/kernels/kda.h"
#include "machine_limits.h"

namespace {

constexpr int64_t kHeads = 32, kDim = 128, kTokens = 4096;
const dz::kernels::KdaDims kDims{kHeads, kDim};

struct Inputs {
  std::vector<float> q, k, v, g, beta, state, out;
};

const Inputs& inputs() {
  static const Inputs in = [] {
    Inputs x;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const auto n = static_cast<size_t>(kTokens * kHeads * kDim);
    for (auto* a : {&x.q, &x.k, &x.v, &x.g}) a->resize(n);
    for (auto& a : x.v) a = normal(rng);
    for (auto* a : {&x.q, &x.k}) {
      for (size_t r = 0; r < n; r += kDim) {
        double ss = 0;
        for (size_t i = 0; i < kDim; ++i) {
          (*a)[r + i] = normal(rng);
          ss += double{(*a)[r + i]} * (*a)[r + i];
        }
        for (size_t i = 0; i < kDim; ++i) (*a)[r + i] /= static_cast<float>(std::sqrt(ss));
      }
    }
    for (auto& a : x.g) a = -0.1f * std::log1p(std::exp(normal(rng)));
    x.beta.resize(static_cast<size_t>(kTokens * kHeads));
    for (auto& a : x.beta) a = 1.0f / (1.0f + std::exp(-normal(rng)));
    x.state.resize(static_cast<size_t>(kHeads * kDim * kDim));
    for (auto& a : x.state) a = 0.1f * normal(rng);
    x.out.resize(n);
    return x;
  }();
  return in;
}

std::map<int64_t, double> g_tokens_per_s;  // chunk size (0: recurrent) → tokens/s

void report(benchmark::State& state, double seconds, double flops, int64_t key) {
  const double iters = static_cast<double>(state.iterations());
  const double gflops = flops * iters / seconds / 1e9;
  state.counters["tokens/s"] = static_cast<double>(kTokens) * iters / seconds;
  state.counters["GFLOP/s"] = gflops;
  state.counters["of_f32_gemm"] = gflops / dz::bench::limits_for_this_run().gemm_f32_gflops;
  g_tokens_per_s[key] = static_cast<double>(kTokens) * iters / seconds;
}

void BM_KdaChunked(benchmark::State& state) {
  const int64_t chunk = state.range(0);
  dz::bench::limits_for_this_run();
  const dz::ExecContext ctx{dz::default_num_threads()};
  const Inputs& in = inputs();
  std::vector<float> s = in.state, out(in.out.size());
  dz::Arena arena(dz::kernels::kda_chunked_scratch_bytes(ctx, kDims, chunk));
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    arena.reset();
    dz::kernels::kda_chunked(ctx, kDims, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                             in.beta.data(), kTokens, 0, chunk, s.data(), out.data(), arena);
    benchmark::DoNotOptimize(out.data());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double n = static_cast<double>(chunk), d = kDim;
  const double flops = static_cast<double>(kHeads) * static_cast<double>(kTokens / chunk) *
                       (6 * n * d * d + 4 * n * n * d);
  report(state, seconds, flops, chunk);
}

void BM_KdaRecurrent(benchmark::State& state) {
  dz::bench::limits_for_this_run();
  const dz::ExecContext ctx{dz::default_num_threads()};
  const Inputs& in = inputs();
  std::vector<float> s = in.state, out(in.out.size());
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    dz::kernels::kda_recurrent(ctx, kDims, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                               in.beta.data(), kTokens, s.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report(state, seconds, static_cast<double>(kHeads * kTokens) * 7.0 * kDim * kDim, 0);
}

BENCHMARK(BM_KdaChunked)
    ->Arg(16)
    ->Arg(32)
    ->Arg(64)
    ->ArgName("chunk")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KdaRecurrent)->UseRealTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  const auto rec = g_tokens_per_s.find(0);
  for (int64_t chunk : {16, 32, 64}) {
    const auto ch = g_tokens_per_s.find(chunk);
    if (rec == g_tokens_per_s.end() || ch == g_tokens_per_s.end()) continue;
    std::printf(
        "T %lld, H %lld, d %lld: chunked (C %lld) %.0f tokens/s, recurrent %.0f tokens/s, "
        "ratio %.1fx\n",
        static_cast<long long>(kTokens), static_cast<long long>(kHeads),
        static_cast<long long>(kDim), static_cast<long long>(chunk), ch->second, rec->second,
        ch->second / rec->second);
  }
  return 0;
}
