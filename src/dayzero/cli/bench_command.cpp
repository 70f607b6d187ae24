#include "dayzero/cli/commands.h"

namespace dz::cli {

RunCommand add_bench_command(CLI::App& app) {
  auto* command = app.add_subcommand("bench", "Benchmarks reported against this machine's limits");
  command->require_subcommand(1);
  command->add_subcommand("limits", "Measure DRAM read bandwidth and FP32/BF16 GEMM throughput");
  return [] { return 1; };
}

}  // namespace dz::cli
