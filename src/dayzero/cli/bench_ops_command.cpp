// `dayzero bench ops [--threads N] [--seconds S] [--filter SUBSTR] [--list] [--json] [--quick]`:
// runs the operator cases of bench/ops/ (quantized GEMV and GEMM, indexer, sparse vs dense MLA
// decode, KDA chunked vs recurrent, MLA absorb, MoE) in this process and prints, per case, the time
// of one call, the bytes and FLOPs counted from the formulas, and the fraction of the limit that
// bounds it, measured first in the same run (DRAM read bandwidth at the thread count used, FP32 and
// BF16 GEMM peaks; docs/performance.md). Derived ratios (sparse vs dense, chunked vs recurrent)
// follow.

#include "dayzero/cli/bench_ops_command.h"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/core/parallel.h"
#include "ops.h"

namespace dz::cli {
namespace {

struct BenchOpsArgs {
  int num_threads = 0;
  double seconds = 0.5;
  std::string filter;
  std::string clock = "wall";
  bool list = false;
  bool json = false;
  bool quick = false;
};

// The 1, 5 and 15 minute load averages: printed beside every figure (the machine is shared).
std::vector<double> load_average() {
  std::ifstream in("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  if (!(in >> a >> b >> c)) return {};
  return {a, b, c};
}

std::string load_text(const std::vector<double>& load) {
  if (load.size() != 3) return "unknown";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", load[0], load[1], load[2]);
  return text;
}

nlohmann::json case_json(const bench::ops::CaseResult& r) {
  return {{"name", r.name},
          {"shape", r.shape},
          {"ms", r.ms},
          {"wall_ms", r.wall_ms},
          {"cpu_ms", r.cpu_ms},
          {"calls", r.calls},
          {"bytes", r.bytes},
          {"flops", r.flops},
          {"gbps", r.gbps},
          {"gflops", r.gflops},
          {"limit_kind", bench::ops::limit_kind_name(r.limit)},
          {"limit", r.limit_value},
          {"fraction", r.fraction}};
}

int run_bench_ops(const BenchOpsArgs& args) {
  using namespace bench::ops;
  std::vector<OpCase> all;
  std::vector<RatioSpec> ratio_specs;
  all_cases(args.quick, all, ratio_specs);
  std::vector<const OpCase*> selected;
  for (const OpCase& op : all)
    if (op.name.find(args.filter) != std::string::npos) selected.push_back(&op);
  if (selected.empty()) {
    std::fprintf(stderr, "dayzero bench ops: no case matches --filter '%s' (see --list)\n",
                 args.filter.c_str());
    return 2;
  }
  if (args.list) {
    if (args.json) {
      nlohmann::json list = nlohmann::json::array();
      for (const OpCase* op : selected)
        list.push_back(
            {{"name", op->name}, {"shape", op->shape}, {"limit_kind", limit_kind_name(op->limit)}});
      std::printf("%s\n", nlohmann::json{{"cases", list}}.dump(2).c_str());
    } else {
      for (const OpCase* op : selected)
        std::printf("%-28s %-10s %s\n", op->name.c_str(), limit_kind_name(op->limit),
                    op->shape.c_str());
    }
    return 0;
  }

  const OpsOptions options{
      .num_threads = args.num_threads > 0 ? args.num_threads : default_num_threads(),
      .min_seconds = args.seconds,
      .quick = args.quick,
      .cpu_clock = args.clock == "cpu"};
  const auto started = std::chrono::steady_clock::now();
  const std::vector<double> load_start = load_average();
  if (!args.json)
    std::printf("dayzero bench ops: %d thread%s, >= %.2f s per case, %s clock%s; load %s\n",
                options.num_threads, options.num_threads == 1 ? "" : "s", options.min_seconds,
                args.clock.c_str(), args.quick ? ", QUICK shapes (figures mean nothing)" : "",
                load_text(load_start).c_str());
  std::fflush(stdout);
  const bench::MachineLimits limits = measure_limits_for_ops(options);
  const double dram = limit_value(limits, LimitKind::kDram);
  if (!args.json) {
    std::printf(
        "limits, same run: DRAM read %.1f GB/s (%d thread(s); %.1f with 1), FP32 GEMM %.0f "
        "GFLOP/s (%s), BF16 GEMM %.0f GFLOP/s (%s)\n\n",
        dram, limits.num_threads, limits.dram_read_gbps_1thread, limits.gemm_f32_gflops,
        limits.gemm_f32_impl.c_str(), limits.gemm_bf16_gflops, limits.gemm_bf16_impl.c_str());
    std::printf("%-28s %10s %10s %10s %9s %9s %-9s %8s  %s\n", "case", "ms", "MB", "GFLOP", "GB/s",
                "GFLOP/s", "limit", "fraction", "shape");
    std::fflush(stdout);
  }

  Fixtures fixtures;
  std::string group;
  std::vector<CaseResult> results;
  for (const OpCase* op : selected) {
    if (op->group != group) fixtures.clear();  // one group's weights in memory at a time
    group = op->group;
    results.push_back(run_case(*op, options, limits, fixtures));
    const CaseResult& r = results.back();
    if (args.json) {
      std::fprintf(stderr, "bench ops: %s %.3f ms\n", r.name.c_str(), r.ms);
    } else {
      std::printf("%-28s %10.3f %10.2f %10.3f %9.1f %9.1f %-9s %8.3f  %s\n", r.name.c_str(), r.ms,
                  r.bytes / 1e6, r.flops / 1e9, r.gbps, r.gflops, limit_kind_name(r.limit),
                  r.fraction, r.shape.c_str());
      std::fflush(stdout);
    }
  }
  fixtures.clear();
  const std::vector<RatioResult> ratios = compute_ratios(ratio_specs, results);
  const double total_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const std::vector<double> load_end = load_average();

  if (args.json) {
    nlohmann::json cases = nlohmann::json::array(), ratio_list = nlohmann::json::array();
    for (const CaseResult& r : results) cases.push_back(case_json(r));
    for (const RatioResult& r : ratios) {
      nlohmann::json item = {{"name", r.spec.name},
                             {"value", r.value},
                             {"slow_case", r.spec.slow_case},
                             {"fast_case", r.spec.fast_case}};
      if (r.spec.target > 0) {
        item["target"] = r.spec.target;
        item["met"] = r.value >= r.spec.target;
      }
      ratio_list.push_back(item);
    }
    const nlohmann::json out = {{"threads", options.num_threads},
                                {"min_seconds", options.min_seconds},
                                {"clock", args.clock},
                                {"quick", args.quick},
                                {"load_average_start", load_start},
                                {"load_average_end", load_end},
                                {"total_seconds", total_s},
                                {"limits",
                                 {{"num_threads", limits.num_threads},
                                  {"dram_read_gbps", dram},
                                  {"dram_read_gbps_1thread", limits.dram_read_gbps_1thread},
                                  {"gemm_f32_gflops", limits.gemm_f32_gflops},
                                  {"gemm_bf16_gflops", limits.gemm_bf16_gflops},
                                  {"gemm_f32_impl", limits.gemm_f32_impl},
                                  {"gemm_bf16_impl", limits.gemm_bf16_impl}}},
                                {"cases", cases},
                                {"ratios", ratio_list}};
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  if (!ratios.empty()) std::printf("\n");
  for (const RatioResult& r : ratios) {
    std::printf("%-28s %8.2fx  (%s / %s)", r.spec.name.c_str(), r.value, r.spec.slow_case.c_str(),
                r.spec.fast_case.c_str());
    if (r.spec.target > 0)
      std::printf("  target >= %.0fx: %s", r.spec.target,
                  r.value >= r.spec.target ? "met" : "NOT met");
    std::printf("\n");
  }
  std::printf(
      "\nlimit: dram = %.1f GB/s, gemm_f32 = %.0f GFLOP/s, gemm_bf16 = %.0f GFLOP/s; "
      "total %.0f s; load at the end %s\n",
      dram, limits.gemm_f32_gflops, limits.gemm_bf16_gflops, total_s, load_text(load_end).c_str());
  return 0;
}

}  // namespace

RunCommand add_bench_ops_subcommand(CLI::App& bench) {
  auto* c = bench.add_subcommand(
      "ops",
      "Run every operator benchmark (GEMV/GEMM, indexer, MLA, KDA, MoE) and report each against "
      "the limits measured in the same run");
  auto args = std::make_shared<BenchOpsArgs>();
  c->add_option("--threads", args->num_threads, "Threads (0: all)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  c->add_option("--seconds", args->seconds, "Minimum timed seconds per case")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
  c->add_option("--filter", args->filter, "Run only the cases whose name contains this");
  c->add_option("--clock", args->clock,
                "wall, or cpu: process CPU time / threads (steadier on a loaded machine)")
      ->check(CLI::IsMember({"wall", "cpu"}))
      ->capture_default_str();
  c->add_flag("--list", args->list, "List the cases and exit");
  c->add_flag("--json", args->json, "Print one JSON object: limits, cases, ratios");
  c->add_flag("--quick", args->quick, "Tiny shapes and limits (tests; the figures mean nothing)");
  return [args] { return run_bench_ops(*args); };
}

}  // namespace dz::cli
