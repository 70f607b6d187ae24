// LinearWeight (kernels/linear.h) on FP8 128×128 block weights: the fused GEMV at 1–8 tokens and
// the GEMM (AMX tiles, or dequantized tiles + oneDNN) at 9–512, cycling through a >= 1 GiB set of
// [2048, 7168] matrices (the shape of a DeepSeek-V3 expert's gate/up) so that every call reads its
// weights from DRAM, not from the 480 MiB L3. GEMV reports weight bytes per second as a fraction of
// the DRAM read bandwidth measured in the same run (machine_limits.h); the GEMM reports FLOP/s
// against the BF16 GEMM limit. Also a BF16 GEMV on the same shapes (2 bytes per weight) for
// comparison.
#include <benchmark/benchmark.h>

#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
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

constexpr int64_t kOut = 2048, kIn = 7168;
constexpr int64_t kSetBytes = int64_t{1} << 30;

const dz::bench::MachineLimits& limits() {
  return dz::bench::limits_for_this_run();
}

// Random finite E4M3 codes from a xorshift stream; power-of-two scales, or arbitrary ones (what
// checkpoints hold: amax / 448 per block) when !pow2.
std::vector<LinearWeight> make_set(bool fp8, int64_t set_bytes, bool pow2 = true) {
  const int64_t bytes_per_matrix = kOut * kIn * (fp8 ? 1 : 2);
  const int64_t num_matrices = (set_bytes + bytes_per_matrix - 1) / bytes_per_matrix;
  std::vector<LinearWeight> set;
  std::vector<uint8_t> codes(static_cast<size_t>(kOut * kIn));
  std::vector<float> scales(static_cast<size_t>((kOut / 128) * (kIn / 128)), 1.0f / 256);
  std::vector<float> values;
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int64_t m = 0; m < num_matrices; ++m) {
    for (size_t e = 0; e < codes.size(); e += 8) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      for (size_t b = 0; b < 8; ++b) {
        const auto c = static_cast<uint8_t>(state >> (8 * b));
        codes[e + b] = (c & 0x7F) == 0x7F ? 0x7E : c;
      }
    }
    if (!pow2)
      for (float& scale : scales) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        scale = (1.0f + static_cast<float>(state % 1000) / 1000.0f) / 512;
      }
    if (fp8) {
      auto w = LinearWeight::from_fp8_block(
          dz::TensorView(codes.data(), dz::DType::kF8E4M3, dz::Shape{kOut, kIn}),
          dz::TensorView(scales.data(), dz::DType::kF32, dz::Shape{kOut / 128, kIn / 128}), 128,
          128);
      set.push_back(std::move(w).value());
    } else {
      values.resize(codes.size());
      for (size_t e = 0; e < codes.size(); ++e) values[e] = (codes[e] - 128) * (1.0f / 1024);
      set.push_back(LinearWeight::from_f32_as_bf16(values.data(), kOut, kIn));
    }
  }
  return set;
}

const std::vector<LinearWeight>& fp8_set(bool pow2) {
  static const std::vector<LinearWeight> pow2_set = make_set(true, kSetBytes, true);
  if (pow2) return pow2_set;
  static const std::vector<LinearWeight> arbitrary_set = make_set(true, kSetBytes, false);
  return arbitrary_set;
}

// CPU seconds of the whole process (all threads): on a shared machine, bytes per CPU second is
// what the kernel does while it has a core; wall-clock figures there also count waiting.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void run(benchmark::State& state, const std::vector<LinearWeight>& set, int64_t weight_bytes) {
  const int64_t num_tokens = state.range(0);
  const int num_threads = static_cast<int>(state.range(1));
  const dz::ExecContext ctx{num_threads};
  std::vector<float> x(static_cast<size_t>(num_tokens * kIn)), y(num_tokens * kOut);
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
  const double gflops = 2.0 * static_cast<double>(num_tokens * kOut * kIn) * calls / seconds / 1e9;
  const dz::bench::MachineLimits& m = limits();
  const double dram = num_threads == 1 ? m.dram_read_gbps_1thread : m.dram_read_gbps;
  state.counters["GB/s"] = gbps;
  state.counters["of_dram"] = gbps / dram;
  state.counters["GFLOP/s"] = gflops;
  state.counters["of_bf16_gemm"] = gflops / m.gemm_bf16_gflops;
}

void BM_Fp8Linear(benchmark::State& state) {
  limits();
  run(state, fp8_set(state.range(2) != 0), kOut * kIn + (kOut / 128) * (kIn / 128) * 4);
}

void BM_Bf16Linear(benchmark::State& state) {
  limits();
  static const std::vector<LinearWeight> set = make_set(false, kSetBytes);
  run(state, set, kOut * kIn * 2);
}

// One [192, 7168] matrix (1.4 MB, in the 2 MiB L2) again and again: the kernel's own rate without
// DRAM, i.e. how far above the DRAM-bound target its decode and dot products run.
void BM_Fp8LinearInL2(benchmark::State& state) {
  limits();
  static const std::vector<LinearWeight> one = [] {
    std::vector<uint8_t> codes(static_cast<size_t>(192 * kIn));
    uint64_t s = 7;
    for (auto& c : codes) {
      s ^= s << 13, s ^= s >> 7, s ^= s << 17;
      c = (s & 0x7F) == 0x7F ? 0x7E : static_cast<uint8_t>(s);
    }
    std::vector<float> scales(static_cast<size_t>(2 * (kIn / 128)), 1.0f / 256);
    std::vector<LinearWeight> set;
    set.push_back(LinearWeight::from_fp8_block(
                      dz::TensorView(codes.data(), dz::DType::kF8E4M3, dz::Shape{192, kIn}),
                      dz::TensorView(scales.data(), dz::DType::kF32, dz::Shape{2, kIn / 128}), 128,
                      128)
                      .value());
    return set;
  }();
  run(state, one, 192 * kIn + 2 * (kIn / 128) * 4);
}

// The DRAM read loop of machine_limits.h over a 1 GiB buffer, one FP8 matrix's worth of bytes per
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
  const size_t slice_floats = static_cast<size_t>(kOut * kIn) / sizeof(float);
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

void thread_args(benchmark::internal::Benchmark* b, std::initializer_list<int64_t> tokens) {
  const int64_t all = dz::default_num_threads();
  for (int64_t t : tokens) {
    b->Args({t, 1});
    if (all > 1) b->Args({t, all});
  }
  b->ArgNames({"tokens", "threads"})->UseRealTime()->MinTime(1.0);
}

// Third argument: 1 for power-of-two block scales, 0 for arbitrary ones.
BENCHMARK(BM_Fp8Linear)->Apply([](auto* b) {
  const int64_t all = dz::default_num_threads();
  for (int64_t pow2 : {1, 0})
    for (int64_t t : {1, 2, 3, 4, 8, 9, 12, 16, 32, 64, 256, 512}) {
      b->Args({t, 1, pow2});
      if (all > 1) b->Args({t, all, pow2});
    }
  b->ArgNames({"tokens", "threads", "pow2"})->UseRealTime()->MinTime(1.0);
});
BENCHMARK(BM_DramRead)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_Fp8LinearInL2)
    ->Args({1, 1})
    ->Args({2, 1})
    ->Args({4, 1})
    ->Args({8, 1})
    ->ArgNames({"tokens", "threads"});
BENCHMARK(BM_Bf16Linear)->Apply([](auto* b) { thread_args(b, {1}); });

}  // namespace

BENCHMARK_MAIN();
