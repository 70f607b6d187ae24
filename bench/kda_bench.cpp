// KDA prefill of one 4096-token sequence at Kimi-Linear dims (H = 32, d = 128, FP32): the chunked
// kernel (chunk 16, 32 and 64, docs/models.md §4.7) against the token-by-token recurrence
// (kda_recurrent over the same tokens, its fastest form: one call, heads in parallel), on 1 and 2
// threads. Reports tokens/s (wall) and tokens per CPU-second (robust on a shared machine), the FLOP
// rate against the FP32 GEMM limit of the same run (machine_limits.h; 1 thread: the 1-thread
// limit), and GFLOP per CPU-second against one core's FP32 and BF16 GEMM peak (core_of_f32,
// core_of_bf16: on a loaded machine the wall-timed peak is low, so these can exceed 1). The chunked
// kernel takes the AMX BF16×3 state products at C ≥ 32 where the CPU has AMX (kda.h). BM_KdaDecode:
// one decode token per layer over 192 layers' states (384 MiB, above the L3), state bytes vs DRAM.
//
// FLOPs counted (FMA = 2): chunked, per chunk of n rows and head, 6·n·d² for the three state
// products (S0ᵀ kg, S0ᵀ qg, the state update) plus 4·n²·d for the pairwise L, A, the forward
// substitution and the intra-chunk output (exponentials not counted); recurrent, per token and
// head, 7·d² (decay, prediction, update, read-out). The issue-8 target is chunked ≥ 5× faster.
#include <benchmark/benchmark.h>

#include <algorithm>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <utility>
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

// 1-thread ceilings (GEMM only), for the per-core fraction: GFLOP per CPU-second against one core.
const dz::bench::MachineLimits& core_limits() {
  static const dz::bench::MachineLimits limits = [] {
    dz::bench::LimitsOptions options;
    options.num_threads = 1;
    options.dram_bytes = 64LL << 20;  // unused here; keep the DRAM pass short
    options.min_seconds = 0.5;
    const dz::bench::MachineLimits l = dz::bench::measure_limits(options);
    std::fprintf(stderr, "1-thread limits: FP32 GEMM %.0f GFLOP/s (%s), BF16 %.0f (%s)\n",
                 l.gemm_f32_gflops, l.gemm_f32_impl.c_str(), l.gemm_bf16_gflops,
                 l.gemm_bf16_impl.c_str());
    return l;
  }();
  return limits;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Rates {
  double wall = 0, cpu = 0;  // tokens per second, tokens per CPU-second
};
std::map<std::pair<int64_t, int64_t>, Rates> g_rates;  // (chunk size, 0: recurrent; threads)

void report(benchmark::State& state, double seconds, double cpu, double flops, int64_t key,
            int64_t threads) {
  const double iters = static_cast<double>(state.iterations());
  const double gflops = flops * iters / seconds / 1e9;
  const double gflops_cpu = flops * iters / cpu / 1e9;
  state.counters["tokens/s"] = static_cast<double>(kTokens) * iters / seconds;
  state.counters["tokens/cpu_s"] = static_cast<double>(kTokens) * iters / cpu;
  state.counters["GFLOP/s"] = gflops;
  // Against the same run's limits: wall rate vs the GEMM peak at this thread count (the all-thread
  // limit for 2 threads), and GFLOP per CPU-second vs one core's FP32 and BF16 GEMM peak.
  const auto& all = dz::bench::limits_for_this_run();
  state.counters["of_f32_gemm"] =
      gflops / (threads == 1 ? core_limits().gemm_f32_gflops : all.gemm_f32_gflops);
  state.counters["core_of_f32"] = gflops_cpu / core_limits().gemm_f32_gflops;
  state.counters["core_of_bf16"] = gflops_cpu / core_limits().gemm_bf16_gflops;
  g_rates[{key, threads}] = {static_cast<double>(kTokens) * iters / seconds,
                             static_cast<double>(kTokens) * iters / cpu};
}

void BM_KdaChunked(benchmark::State& state) {
  const int64_t chunk = state.range(0), threads = state.range(1);
  dz::bench::limits_for_this_run();
  core_limits();
  const dz::ExecContext ctx{static_cast<int>(threads)};
  const Inputs& in = inputs();
  std::vector<float> s = in.state, out(in.out.size());
  dz::Arena arena(dz::kernels::kda_chunked_scratch_bytes(ctx, kDims, chunk));
  const auto start = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  for (auto _ : state) {
    arena.reset();
    dz::kernels::kda_chunked(ctx, kDims, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                             in.beta.data(), kTokens, 0, chunk, s.data(), out.data(), arena);
    benchmark::DoNotOptimize(out.data());
  }
  const double cpu = cpu_seconds() - cpu0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double n = static_cast<double>(chunk), d = kDim;
  const double flops = static_cast<double>(kHeads) * static_cast<double>(kTokens / chunk) *
                       (6 * n * d * d + 4 * n * n * d);
  report(state, seconds, cpu, flops, chunk, threads);
}

void BM_KdaRecurrent(benchmark::State& state) {
  const int64_t threads = state.range(0);
  dz::bench::limits_for_this_run();
  core_limits();
  const dz::ExecContext ctx{static_cast<int>(threads)};
  const Inputs& in = inputs();
  std::vector<float> s = in.state, out(in.out.size());
  const auto start = std::chrono::steady_clock::now();
  const double cpu0 = cpu_seconds();
  for (auto _ : state) {
    dz::kernels::kda_recurrent(ctx, kDims, in.q.data(), in.k.data(), in.v.data(), in.g.data(),
                               in.beta.data(), kTokens, s.data(), out.data());
    benchmark::DoNotOptimize(out.data());
  }
  const double cpu = cpu_seconds() - cpu0;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  report(state, seconds, cpu, static_cast<double>(kHeads * kTokens) * 7.0 * kDim * kDim, 0,
         threads);
}

// Decode: one token through kda_recurrent per layer, rotating over enough layers' states (2 MiB
// each at H 32, d 128) to exceed the L3, as a model's decode step does. The state is read and
// written once per token, so the rate is state bytes (read + write) per second against DRAM.
void BM_KdaDecode(benchmark::State& state) {
  const int64_t threads = state.range(0);
  constexpr int64_t kLayers = 192;  // 384 MiB of state
  const auto& limits = dz::bench::limits_for_this_run();
  const dz::ExecContext ctx{static_cast<int>(threads)};
  const Inputs& in = inputs();
  const auto state_floats = static_cast<size_t>(kHeads * kDim * kDim);
  std::vector<float> states(state_floats * kLayers);
  for (int64_t l = 0; l < kLayers; ++l) {
    std::copy(in.state.begin(), in.state.end(), states.begin() + l * state_floats);
  }
  std::vector<float> out(static_cast<size_t>(kHeads * kDim));
  int64_t layer = 0, token = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const size_t off = static_cast<size_t>(token * kHeads * kDim);
    dz::kernels::kda_recurrent(ctx, kDims, in.q.data() + off, in.k.data() + off, in.v.data() + off,
                               in.g.data() + off, in.beta.data() + token * kHeads, 1,
                               states.data() + layer * state_floats, out.data());
    benchmark::DoNotOptimize(out.data());
    layer = (layer + 1) % kLayers;
    token = (token + 1) % kTokens;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gbps = 2.0 * static_cast<double>(state_floats) * 4 *
                      static_cast<double>(state.iterations()) / seconds / 1e9;
  state.counters["state_GB/s"] = gbps;
  state.counters["of_dram"] =
      gbps / (threads == 1 ? limits.dram_read_gbps_1thread : limits.dram_read_gbps);
}

BENCHMARK(BM_KdaChunked)
    ->ArgsProduct({{16, 32, 64}, {1, 2}})
    ->ArgNames({"chunk", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_KdaDecode)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_KdaRecurrent)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (int64_t threads : {1, 2}) {
    const auto rec = g_rates.find({0, threads});
    for (int64_t chunk : {16, 32, 64}) {
      const auto ch = g_rates.find({chunk, threads});
      if (rec == g_rates.end() || ch == g_rates.end()) continue;
      std::printf(
          "T %lld, H %lld, d %lld, %lld thread(s): chunked (C %lld) %.0f tokens/s, recurrent %.0f "
          "tokens/s, ratio %.2fx (by CPU time %.2fx)\n",
          static_cast<long long>(kTokens), static_cast<long long>(kHeads),
          static_cast<long long>(kDim), static_cast<long long>(threads),
          static_cast<long long>(chunk), ch->second.wall, rec->second.wall,
          ch->second.wall / rec->second.wall, ch->second.cpu / rec->second.cpu);
    }
  }
  return 0;
}
