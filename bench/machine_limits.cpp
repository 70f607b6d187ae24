#include "machine_limits.h"

#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <vector>

#include <dnnl.hpp>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/check.h"
#include "dayzero/core/parallel.h"

namespace dz::bench {

float sum_floats_avx512(const float* data, size_t num_floats);

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// CPU seconds of the whole process, all threads.
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Repeats `run` until `min_seconds` have passed (at least twice, the first run warms up) and
// returns the best time of one run: the machine is shared, and the best run is the least disturbed.
// cpu_threads > 0: a run's time is the process CPU time it took / cpu_threads (see cpu_clock).
template <typename Fn>
double best_seconds(double min_seconds, int cpu_threads, Fn&& run) {
  run();
  double best = 1e30, total = 0;
  for (int reps = 0; reps < 2 || total < min_seconds; ++reps) {
    auto start = Clock::now();
    const double cpu_start = process_cpu_seconds();
    run();
    double elapsed = seconds_since(start);
    const double cpu = (process_cpu_seconds() - cpu_start) / std::max(cpu_threads, 1);
    best = std::min(best, cpu_threads > 0 ? cpu : elapsed);
    total += elapsed;
  }
  return best;
}

double measure_dram_read_gbps(const AlignedBuffer& buffer, int num_threads, double min_seconds,
                              bool cpu_clock) {
  const auto* data = reinterpret_cast<const float*>(buffer.data());
  size_t num_floats = buffer.size_bytes() / sizeof(float);
  // Each thread reads its own contiguous slice, 64-byte aligned.
  size_t slice_floats = (num_floats / static_cast<size_t>(num_threads)) / 16 * 16;
  volatile float sink = 0;
  double seconds = best_seconds(min_seconds, cpu_clock ? num_threads : 0, [&] {
    float total = 0;
#pragma omp parallel for num_threads(num_threads) reduction(+ : total)
    for (int t = 0; t < num_threads; ++t)
      total += sum_floats_avx512(data + static_cast<size_t>(t) * slice_floats, slice_floats);
    sink = sink + total;
  });
  double bytes = static_cast<double>(slice_floats) * sizeof(float) * num_threads;
  return bytes / seconds / 1e9;
}

struct GemmFigure {
  double gflops = 0;
  std::string impl;
};

GemmFigure measure_gemm(dnnl::memory::data_type dtype, const LimitsOptions& options,
                        int num_threads) {
  using dnnl::memory;
  omp_set_num_threads(num_threads);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  memory::dims a_dims{options.gemm_m, options.gemm_k}, b_dims{options.gemm_k, options.gemm_n},
      c_dims{options.gemm_m, options.gemm_n};
  auto a_md = memory::desc(a_dims, dtype, memory::format_tag::ab);
  // Weights as a GEMM library would keep them after repack: let oneDNN choose the layout.
  auto b_any = memory::desc(b_dims, dtype, memory::format_tag::any);
  auto c_md = memory::desc(c_dims, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_any, c_md), engine);

  memory a(a_md, engine), b(pd.weights_desc(), engine), c(c_md, engine);
  // Fresh random inputs: zeros could take fast paths in the hardware and flatter the figure.
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (memory* m : {&a, &b}) {
    auto* bytes = static_cast<uint8_t*>(m->get_data_handle());
    size_t size = m->get_desc().get_size();
    // Odd bytes hold the sign and exponent in both f32 and bf16 layouts: keep those small and
    // positive (0x3C or 0x3D, values around 2^-7) and make every other byte random.
    for (size_t i = 0; i < size; ++i)
      bytes[i] = static_cast<uint8_t>(i % 2 ? 0x3C + byte(rng) % 2 : byte(rng));
  }
  dnnl::matmul gemm(pd);
  double seconds = best_seconds(options.min_seconds, options.cpu_clock ? num_threads : 0, [&] {
    gemm.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  });
  double flops = 2.0 * options.gemm_m * options.gemm_n * options.gemm_k;
  return {.gflops = flops / seconds / 1e9, .impl = pd.impl_info_str()};
}

}  // namespace

MachineLimits measure_limits(const LimitsOptions& options) {
  MachineLimits limits;
  limits.num_threads = options.num_threads > 0 ? options.num_threads : default_num_threads();
  DZ_CHECK(options.dram_bytes >= (1 << 20), "dram_bytes {} too small", options.dram_bytes);

  AlignedBuffer buffer(static_cast<size_t>(options.dram_bytes));
  auto floats = buffer.as_span<float>();
  // First touch from the threads that will read it, and nonzero contents.
#pragma omp parallel for num_threads(limits.num_threads)
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = static_cast<float>(i % 1024) * 0.5f;
  limits.dram_read_gbps_1thread =
      measure_dram_read_gbps(buffer, 1, options.min_seconds, options.cpu_clock);
  limits.dram_read_gbps =
      measure_dram_read_gbps(buffer, limits.num_threads, options.min_seconds, options.cpu_clock);

  GemmFigure f32 = measure_gemm(dnnl::memory::data_type::f32, options, limits.num_threads);
  GemmFigure bf16 = measure_gemm(dnnl::memory::data_type::bf16, options, limits.num_threads);
  limits.gemm_f32_gflops = f32.gflops;
  limits.gemm_f32_impl = f32.impl;
  limits.gemm_bf16_gflops = bf16.gflops;
  limits.gemm_bf16_impl = bf16.impl;
  return limits;
}

const MachineLimits& limits_for_this_run() {
  static const MachineLimits measured = [] {
    LimitsOptions options;
    options.min_seconds = 0.5;
    MachineLimits m = measure_limits(options);
    std::fprintf(stderr,
                 "limits: DRAM %.1f GB/s (1 thread) / %.1f GB/s (%d threads); FP32 GEMM %.0f "
                 "GFLOP/s (%s); BF16 GEMM %.0f GFLOP/s (%s)\n",
                 m.dram_read_gbps_1thread, m.dram_read_gbps, m.num_threads, m.gemm_f32_gflops,
                 m.gemm_f32_impl.c_str(), m.gemm_bf16_gflops, m.gemm_bf16_impl.c_str());
    return m;
  }();
  return measured;
}

}  // namespace dz::bench
