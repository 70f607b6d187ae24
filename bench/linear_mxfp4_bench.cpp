// LinearWeight (kernels/linear.h) on compressed-tensors MXFP4 weights, cycling through a >= 1 GiB
// set of [3072, 3584] matrices (a Kimi-K3 expert's w1/w3, docs/formats.md §3.4) so that every call
// reads its weights from DRAM, not from the 480 MiB L3. The kernels are those LinearWeight picks
// (with AMX: the tile GEMV to 16 tokens and the tile GEMM past it; without: the fused VDPBF16PS
// GEMV to 8 tokens and the dequantized-tile GEMM past it; DZ_CPU_ISA=avx512 runs the latter on an
// AMX machine). The GEMV reports packed weight bytes (codes + scales, 4.25 bits per weight) per
// second as a fraction of the DRAM read bandwidth measured in the same run (machine_limits.h); the
// GEMM reports FLOP/s against the BF16 GEMM limit. The peer is BF16 weights of the same shape
// (3.76× the bytes per weight) on the oneDNN path. The Mxint8 variants run the same weights with
// MXINT8 activations (LinearWeight's 8-bit mode: the VPDPBUSD GEMV at every token count).
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/parallel.h"
#include "dayzero/kernels/linear.h"
#include "machine_limits.h"

namespace dz::bench {
float sum_floats_avx512(const float* data, size_t num_floats);  // dram_read_avx512.cpp
}  // namespace dz::bench

namespace {

using dz::kernels::LinearWeight;
using dz::kernels::Mxfp4Activations;

constexpr int64_t kOut = 3072, kIn = 3584;
constexpr int64_t kSetBytes = int64_t{1} << 30;
constexpr int64_t kMxfp4Bytes = kOut * kIn / 2 + kOut * kIn / 32;

const dz::bench::MachineLimits& limits() {
  static const bool printed = [] {
    std::fprintf(stderr, "MXFP4 tile workspace: %zu bytes per thread\n",
                 LinearWeight::mxfp4_workspace_bytes_per_thread());
    return true;
  }();
  (void)printed;
  return dz::bench::limits_for_this_run();
}

uint64_t next_random(uint64_t& state) {
  state ^= state << 13, state ^= state >> 7, state ^= state << 17;
  return state;
}

// Random nibbles (every E2M1 code) from a xorshift stream; scale codes 118–125, as trained weights.
std::vector<LinearWeight> make_mxfp4_set(Mxfp4Activations activations) {
  const int64_t num_matrices = (kSetBytes + kMxfp4Bytes - 1) / kMxfp4Bytes;
  std::vector<LinearWeight> set;
  std::vector<uint8_t> packed(static_cast<size_t>(kOut * kIn / 2));
  std::vector<uint8_t> scales(static_cast<size_t>(kOut * kIn / 32));
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int64_t m = 0; m < num_matrices; ++m) {
    for (size_t e = 0; e < packed.size(); e += 8) {
      const uint64_t r = next_random(state);
      for (size_t b = 0; b < 8; ++b) packed[e + b] = static_cast<uint8_t>(r >> (8 * b));
    }
    for (auto& s : scales) s = static_cast<uint8_t>(118 + next_random(state) % 8);
    auto w = LinearWeight::from_mxfp4(
        dz::TensorView(packed.data(), dz::DType::kU8, dz::Shape{kOut, kIn / 2}),
        dz::TensorView(scales.data(), dz::DType::kU8, dz::Shape{kOut, kIn / 32}), activations);
    set.push_back(std::move(w).value());
  }
  return set;
}

std::vector<LinearWeight> make_bf16_set() {
  const int64_t num_matrices = (kSetBytes + kOut * kIn * 2 - 1) / (kOut * kIn * 2);
  std::vector<LinearWeight> set;
  std::vector<float> values(static_cast<size_t>(kOut * kIn));
  uint64_t state = 0x2545F4914F6CDD1Dull;
  for (int64_t m = 0; m < num_matrices; ++m) {
    for (auto& v : values)
      v = static_cast<float>(next_random(state) % 255) * (1.0f / 1024) - 0.125f;
    set.push_back(LinearWeight::from_f32_as_bf16(values.data(), kOut, kIn));
  }
  return set;
}

const std::vector<LinearWeight>& mxfp4_set() {
  static const std::vector<LinearWeight> set = make_mxfp4_set(Mxfp4Activations::kBf16);
  return set;
}

const std::vector<LinearWeight>& mxfp4_mxint8_set() {
  static const std::vector<LinearWeight> set = make_mxfp4_set(Mxfp4Activations::kMxint8);
  return set;
}

const std::vector<LinearWeight>& bf16_set() {
  static const std::vector<LinearWeight> set = make_bf16_set();
  return set;
}

// CPU seconds of the whole process (all threads): on a shared machine, bytes per CPU second is
// what the kernel does while it has a core; wall-clock figures there also count waiting.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void run(benchmark::State& state, const std::vector<LinearWeight>& set, int64_t weight_bytes) {
  const int64_t out_rows = set[0].out_features();
  const int64_t num_tokens = state.range(0);
  const int num_threads = static_cast<int>(state.range(1));
  const dz::ExecContext ctx{num_threads};
  std::vector<float> x(static_cast<size_t>(num_tokens * kIn)), y(num_tokens * out_rows);
  for (size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(e % 17) * 0.125f - 1.0f;
  size_t next = 0;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_seconds();
  for (auto _ : state) {
    set[next].forward(ctx, x.data(), num_tokens, y.data());
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % set.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu_seconds = process_cpu_seconds() - cpu_start;
  const double calls = static_cast<double>(state.iterations());
  state.counters["GB/cpu_s"] = static_cast<double>(weight_bytes) * calls / cpu_seconds / 1e9;
  const double gbps = static_cast<double>(weight_bytes) * calls / seconds / 1e9;
  const double gflops =
      2.0 * static_cast<double>(num_tokens * out_rows * kIn) * calls / seconds / 1e9;
  const dz::bench::MachineLimits& m = limits();
  const double dram = num_threads == 1 ? m.dram_read_gbps_1thread : m.dram_read_gbps;
  state.counters["GB/s"] = gbps;
  state.counters["of_dram"] = gbps / dram;
  state.counters["GFLOP/s"] = gflops;
  state.counters["of_bf16_gemm"] = gflops / m.gemm_bf16_gflops;
  state.counters["workspace_KiB"] =
      static_cast<double>(LinearWeight::mxfp4_workspace_bytes_per_thread()) / 1024.0;
}

void BM_Mxfp4Linear(benchmark::State& state) {
  limits();
  run(state, mxfp4_set(), kMxfp4Bytes);
}

void BM_Mxfp4Mxint8Linear(benchmark::State& state) {
  limits();
  run(state, mxfp4_mxint8_set(), kMxfp4Bytes);
}

// One [512, 3584] matrix (0.97 MB, in a 1–2 MiB L2) again and again: the kernel's own rate
// without DRAM, i.e. how much of the DRAM-bound target it could reach.
template <Mxfp4Activations kActivations>
void BM_Mxfp4LinearInL2(benchmark::State& state) {
  limits();
  static const std::vector<LinearWeight> one = [] {
    std::vector<LinearWeight> set;
    std::vector<uint8_t> packed(static_cast<size_t>(512 * kIn / 2)), scales(512 * kIn / 32, 120);
    uint64_t s = 7;
    for (auto& b : packed) b = static_cast<uint8_t>(next_random(s));
    set.push_back(LinearWeight::from_mxfp4(
                      dz::TensorView(packed.data(), dz::DType::kU8, dz::Shape{512, kIn / 2}),
                      dz::TensorView(scales.data(), dz::DType::kU8, dz::Shape{512, kIn / 32}),
                      kActivations)
                      .value());
    return set;
  }();
  run(state, one, 512 * kIn / 2 + 512 * kIn / 32);
}

// The DRAM read loop of machine_limits.h over a 1 GiB buffer, one MXFP4 matrix's worth of bytes per
// iteration, timed like the GEMV: the same-conditions ceiling for GB/cpu_s on a shared machine.
void BM_DramRead(benchmark::State& state) {
  limits();
  static const dz::AlignedBuffer buffer = [] {
    dz::AlignedBuffer b(static_cast<size_t>(kSetBytes));
    auto floats = b.as_span<float>();
    for (size_t e = 0; e < floats.size(); ++e) floats[e] = static_cast<float>(e % 7);
    return b;
  }();
  const auto* data = reinterpret_cast<const float*>(buffer.data());
  const size_t slice_floats = static_cast<size_t>(kMxfp4Bytes) / sizeof(float) / 64 * 64;
  const size_t num_slices = static_cast<size_t>(kSetBytes) / sizeof(float) / slice_floats;
  size_t next = 0;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_seconds();
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        dz::bench::sum_floats_avx512(data + next * slice_floats, slice_floats));
    next = (next + 1) % num_slices;
  }
  const double bytes =
      static_cast<double>(slice_floats * sizeof(float)) * static_cast<double>(state.iterations());
  state.counters["GB/cpu_s"] = bytes / (process_cpu_seconds() - cpu_start) / 1e9;
  state.counters["GB/s"] =
      bytes / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 1e9;
}

void BM_Bf16Linear(benchmark::State& state) {
  limits();
  run(state, bf16_set(), kOut * kIn * 2);
}

void thread_args(benchmark::internal::Benchmark* b, std::initializer_list<int64_t> tokens) {
  const int64_t all = dz::default_num_threads();
  for (int64_t t : tokens) {
    b->Args({t, 1});
    if (all > 1) b->Args({t, all});
  }
  b->ArgNames({"tokens", "threads"})->UseRealTime()->MinTime(1.0);
}

BENCHMARK(BM_Mxfp4Linear)->Apply([](auto* b) { thread_args(b, {1, 2, 4, 8, 16, 17, 64, 255}); });
BENCHMARK(BM_DramRead)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_Mxfp4Mxint8Linear)->Apply([](auto* b) {
  thread_args(b, {1, 2, 4, 8, 16, 17, 64, 255});
});
BENCHMARK_TEMPLATE(BM_Mxfp4LinearInL2, Mxfp4Activations::kBf16)
    ->ArgsProduct({{1, 2, 4, 8}, {1}})
    ->ArgNames({"tokens", "threads"});
BENCHMARK_TEMPLATE(BM_Mxfp4LinearInL2, Mxfp4Activations::kMxint8)
    ->ArgsProduct({{1, 2, 4, 8}, {1}})
    ->ArgNames({"tokens", "threads"});
BENCHMARK(BM_Bf16Linear)->Apply([](auto* b) { thread_args(b, {1, 255}); });

}  // namespace

BENCHMARK_MAIN();
