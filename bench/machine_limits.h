#pragma once
// The machine's ceilings (docs/performance.md): DRAM read bandwidth and GEMM throughput, measured
// in the same run as any benchmark that reports a fraction of them.

#include <string>

namespace dz::bench {

struct MachineLimits {
  int num_threads = 0;
  double dram_read_gbps_1thread = 0;  // GB/s, 1e9 bytes
  double dram_read_gbps = 0;          // with num_threads
  double gemm_f32_gflops = 0;         // oneDNN matmul, num_threads
  double gemm_bf16_gflops = 0;
  std::string gemm_f32_impl;   // the oneDNN implementation that ran, e.g. "brg:avx512_core"
  std::string gemm_bf16_impl;  // "brg:avx512_core_amx_bf16" where the CPU has AMX
};

struct LimitsOptions {
  int num_threads = 0;               // 0: all hardware threads
  long long dram_bytes = 2LL << 30;  // buffer read, well over the L3 (260–480 MiB seen)
  int gemm_m = 1024, gemm_n = 4096, gemm_k = 4096;
  double min_seconds = 1.0;  // per measurement
  // Time by the process's CPU seconds divided by the threads that ran instead of wall time: on a
  // loaded machine, the rate while the threads had their cores (`dayzero bench ops --clock cpu`).
  bool cpu_clock = false;
};

MachineLimits measure_limits(const LimitsOptions& options);

// For benchmark programs: the limits measured once per process (0.5 s per figure) on first use,
// printed to stderr with the oneDNN kernels that reached them, so every report has its ceiling.
const MachineLimits& limits_for_this_run();

}  // namespace dz::bench
