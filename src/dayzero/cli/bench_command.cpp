// `dayzero bench limits`: the machine's ceilings that every other benchmark reports against
// (docs/performance.md). Later issues add operator and end-to-end benchmarks as sibling
// subcommands; `dayzero bench serve` (bench_serve_command.cpp) loads an OpenAI-compatible server.

#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "dayzero/cli/bench_model_command.h"
#include "dayzero/cli/bench_ops_command.h"
#include "dayzero/cli/bench_serve_command.h"
#include "dayzero/cli/commands.h"
#include "machine_limits.h"

namespace dz::cli {
namespace {

int run_limits(const bench::LimitsOptions& options, bool as_json) {
  bench::MachineLimits limits = bench::measure_limits(options);
  if (as_json) {
    nlohmann::json out = {{"num_threads", limits.num_threads},
                          {"dram_read_gbps_1thread", limits.dram_read_gbps_1thread},
                          {"dram_read_gbps", limits.dram_read_gbps},
                          {"gemm_f32_gflops", limits.gemm_f32_gflops},
                          {"gemm_bf16_gflops", limits.gemm_bf16_gflops},
                          {"gemm_f32_impl", limits.gemm_f32_impl},
                          {"gemm_bf16_impl", limits.gemm_bf16_impl}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("machine limits (%d threads; best of repeated runs, %.1f s each)\n",
              limits.num_threads, options.min_seconds);
  std::printf("  DRAM read bandwidth, 1 thread      %8.1f GB/s   (AVX-512 sum over %lld MiB)\n",
              limits.dram_read_gbps_1thread, options.dram_bytes >> 20);
  std::printf("  DRAM read bandwidth, %d threads     %8.1f GB/s\n", limits.num_threads,
              limits.dram_read_gbps);
  std::printf("  FP32 GEMM (oneDNN matmul)          %8.1f GFLOP/s (%dx%dx%d, %s)\n",
              limits.gemm_f32_gflops, options.gemm_m, options.gemm_n, options.gemm_k,
              limits.gemm_f32_impl.c_str());
  std::printf("  BF16 GEMM (oneDNN matmul)          %8.1f GFLOP/s (%s)\n", limits.gemm_bf16_gflops,
              limits.gemm_bf16_impl.c_str());
  std::printf("  machine balance (FP32)             %8.1f FLOP/B\n",
              limits.gemm_f32_gflops / limits.dram_read_gbps);
  return 0;
}

}  // namespace

RunCommand add_bench_command(CLI::App& app) {
  auto* command = app.add_subcommand("bench", "Benchmarks reported against this machine's limits");
  command->require_subcommand(1);
  auto* limits = command->add_subcommand(
      "limits", "Measure DRAM read bandwidth and FP32/BF16 GEMM throughput (oneDNN)");
  auto options = std::make_shared<bench::LimitsOptions>();
  auto as_json = std::make_shared<bool>(false);
  auto dram_mib = std::make_shared<long long>(options->dram_bytes >> 20);
  limits->add_option("--threads", options->num_threads, "Threads (0: all)")->capture_default_str();
  limits->add_option("--dram-mib", *dram_mib, "Buffer read to measure bandwidth, MiB")
      ->check(CLI::Range(16LL, 16384LL))
      ->capture_default_str();
  limits->add_option("--seconds", options->min_seconds, "Minimum time per measurement")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
  limits->add_flag("--json", *as_json, "Print the figures as JSON");
  RunCommand run_serve = add_bench_serve_subcommand(*command);
  auto* serve = command->get_subcommand("serve");
  RunCommand run_decode = add_bench_decode_subcommand(*command);
  RunCommand run_prefill = add_bench_prefill_subcommand(*command);
  auto* decode = command->get_subcommand("decode");
  auto* prefill = command->get_subcommand("prefill");
  RunCommand run_ops = add_bench_ops_subcommand(*command);
  auto* ops = command->get_subcommand("ops");
  return [=] {
    options->dram_bytes = *dram_mib << 20;
    if (limits->parsed()) return run_limits(*options, *as_json);
    if (serve->parsed()) return run_serve();
    if (decode->parsed()) return run_decode();
    if (prefill->parsed()) return run_prefill();
    if (ops->parsed()) return run_ops();
    return 1;
  };
}

}  // namespace dz::cli
