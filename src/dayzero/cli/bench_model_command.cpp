// `dayzero bench decode (--config X.json | --model DIR) [--batch 1,4,16,64] [--context 1K,8K]
// [--threads N] [--seconds S] [--clock wall|cpu] [--json]` and
// `dayzero bench prefill (--config X.json | --model DIR) [--tokens 512,2048] [--chunk N]
// [--threads N] [--json]`.
//
// Decode: for each context and batch size B, B sequences whose cache already holds `context`
// tokens (written directly, not prefilled: bench/model_sweep.h says why and what that keeps), timed
// one-token-per-sequence steps (model.forward, every row's logits). Per row: ms/step, tokens/s,
// bytes read per step (weights in the form decode reads + distinct routed experts + the cache
// records, indexer keys and states actually read), GB/s and fraction of the DRAM bandwidth, the
// speedup over the first batch size, the ideal speedup from the bytes and achieved/ideal, and the
// speed relative to the first context. Prefill: tokens/s and GFLOP/s (linears 2·active params per
// token + attention from the formulas) as a fraction of the best GEMM peak of the same run.
// Bytes and FLOPs need the synthetic config's formulas; with --model only times are reported.

#include "dayzero/cli/bench_model_command.h"

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "dayzero/cli/model_args.h"
#include "dayzero/core/parallel.h"
#include "machine_limits.h"
#include "model_sweep.h"

namespace dz::cli {
namespace {

struct CommonArgs {
  std::string config_path;
  std::string model_dir;
  std::string kv_cache_dtype = "auto";
  std::string mxfp4_activations = "bf16";
  int num_threads = 0;
  int64_t block_size = 64;
  std::string clock = "wall";
  bool json = false;
  int64_t dram_mib = 2048;
  double limits_seconds = 0.5;
  bool quick_limits = false;  // tests: tiny buffers, the figures are not the machine's limits
  uint64_t seed = 1;
  ParallelArgs parallel;  // with --model, under mpirun (docs/parallel.md)
};

// "1,4,16" or "1K,8K,128K" (K = 1024): positive integers, each item named in the error.
Result<std::vector<int64_t>> parse_size_list(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  size_t begin = 0;
  while (true) {
    const size_t end = std::min(text.find(',', begin), text.size());
    std::string item = text.substr(begin, end - begin);
    int64_t multiplier = 1;
    if (!item.empty() && (item.back() == 'k' || item.back() == 'K')) {
      multiplier = 1024;
      item.pop_back();
    }
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || value < 1 || value > (1LL << 24))
      return make_error(StatusCode::kInvalidArgument,
                        "{}: item \"{}\" is not a positive integer (optionally with a K suffix)",
                        flag, text.substr(begin, end - begin));
    out.push_back(static_cast<int64_t>(value) * multiplier);
    if (end == text.size()) break;
    begin = end + 1;
  }
  return out;
}

void add_common_options(CLI::App& command, CommonArgs& args) {
  auto* config = command.add_option(
      "--config", args.config_path,
      "synthetic model config (bench/configs/*.json): random weights, bytes and FLOPs counted");
  auto* model = command.add_option(
      "--model", args.model_dir, "checkpoint directory instead (times only: no byte/FLOP counts)");
  config->excludes(model);
  model->excludes(config);
  command.add_option("--kv-cache-dtype", args.kv_cache_dtype, "with --model: auto, fp8 or bf16")
      ->check(CLI::IsMember({"auto", "fp8", "bf16"}))
      ->capture_default_str();
  command
      .add_option("--mxfp4-activations", args.mxfp4_activations,
                  "what MXFP4 weights multiply: bf16 or mxint8 (8-bit activations)")
      ->check(CLI::IsMember({"bf16", "mxint8"}))
      ->capture_default_str();
  command.add_option("--threads", args.num_threads, "threads (0: all hardware threads)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command.add_option("--block-size", args.block_size, "tokens per KV cache block")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      .add_option("--clock", args.clock,
                  "wall, or cpu: the process's CPU time / threads, for the steps and the limits "
                  "(use with --threads 1 on a loaded machine)")
      ->check(CLI::IsMember({"wall", "cpu"}))
      ->capture_default_str();
  command.add_flag("--json", args.json, "print one JSON object (limits, model, rows)");
  command
      .add_option("--dram-mib", args.dram_mib,
                  "buffer the same-run DRAM limit reads, MiB (keep it well over the L3)")
      ->check(integer_at_least(16))
      ->capture_default_str();
  command.add_option("--limits-seconds", args.limits_seconds, "time per limit measurement")
      ->check(CLI::Range(0.0, 60.0))
      ->capture_default_str();
  command.add_flag("--quick-limits", args.quick_limits,
                   "measure the limits on a 16 MiB buffer and a 256x1024x1024 GEMM for 0.01 s "
                   "(for tests: the fractions are then not against the machine's limits)");
  command.add_option("--seed", args.seed, "random tokens and context")->capture_default_str();
  add_parallel_options(command, args.parallel);  // with --model
}

int threads_of(const CommonArgs& args) {
  return args.num_threads > 0 ? args.num_threads : default_num_threads();
}

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

Result<bench::BenchModel> load_bench_model(const CommonArgs& args) {
  if (args.config_path.empty() && args.model_dir.empty())
    return make_error(StatusCode::kInvalidArgument, "give --config FILE.json or --model DIR");
  const auto mxfp4_activations = args.mxfp4_activations == "mxint8"
                                     ? kernels::Mxfp4Activations::kMxint8
                                     : kernels::Mxfp4Activations::kBf16;
  if (!args.config_path.empty())
    return bench::load_synthetic_bench_model(args.config_path, mxfp4_activations);
  ModelArgs model_args;
  model_args.model_dir = args.model_dir;
  model_args.kv_cache_dtype = args.kv_cache_dtype;
  model_args.mxfp4_activations = args.mxfp4_activations;
  model_args.num_threads = args.num_threads;
  model_args.parallel = args.parallel;
  const double t0 = bench::clock_seconds(false);
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> lm, load_model(model_args));
  if (lm == nullptr) return bench::BenchModel{};  // a rank that followed rank 0's steps
  bench::BenchModel m = bench::wrap_checkpoint_model(args.model_dir, std::move(lm));
  m.comm = plan_comm();
  m.build_seconds = bench::clock_seconds(false) - t0;
  return m;
}

bench::MachineLimits measure(const CommonArgs& args) {
  bench::LimitsOptions options;
  options.num_threads = threads_of(args);
  options.dram_bytes = args.dram_mib << 20;
  options.min_seconds = args.limits_seconds;
  options.cpu_clock = args.clock == "cpu";  // the limits timed like the steps
  if (args.quick_limits) {
    options.dram_bytes = 16LL << 20;
    options.min_seconds = 0.01;
    options.gemm_m = 256, options.gemm_n = 1024, options.gemm_k = 1024;
  }
  return bench::measure_limits(options);
}

double dram_limit(const bench::MachineLimits& lim, int threads) {
  return threads == 1 ? lim.dram_read_gbps_1thread : lim.dram_read_gbps;
}

nlohmann::json limits_json(const bench::MachineLimits& lim, const CommonArgs& args) {
  return {{"num_threads", lim.num_threads},
          {"dram_read_gbps_1thread", lim.dram_read_gbps_1thread},
          {"dram_read_gbps", lim.dram_read_gbps},
          {"gemm_f32_gflops", lim.gemm_f32_gflops},
          {"gemm_bf16_gflops", lim.gemm_bf16_gflops},
          {"gemm_f32_impl", lim.gemm_f32_impl},
          {"gemm_bf16_impl", lim.gemm_bf16_impl},
          {"dram_mib", args.quick_limits ? 16 : args.dram_mib},
          {"quick", args.quick_limits}};
}

nlohmann::json model_json(const bench::BenchModel& m) {
  nlohmann::json out = {{"name", m.name},
                        {"synthetic", m.synthetic.has_value()},
                        {"build_seconds", m.build_seconds},
                        {"peak_rss_bytes", peak_rss_bytes()}};
  if (m.synthetic) {
    const model::SyntheticModelConfig& c = *m.synthetic;
    out["num_layers"] = c.num_layers;
    out["hidden_size"] = c.hidden_size;
    out["num_params"] = m.bytes.num_params;
    out["active_params"] = m.bytes.active_params;
    out["held_bytes"] = m.bytes.total_bytes;
    out["per_step_weight_bytes"] = m.bytes.per_step_bytes;
    out["per_expert_bytes"] = m.bytes.per_expert_bytes;
    out["num_moe_layers"] = m.bytes.num_moe_layers;
    out["weight_format"] = model::synthetic_format_name(c.weight_format);
    out["expert_format"] = model::synthetic_format_name(c.expert_format);
    out["kv_cache_dtype"] = c.kv_cache_dtype == kernels::KvCacheDtype::kFp8 ? "fp8" : "bf16";
    out["mxfp4_activations"] =
        c.mxfp4_activations == kernels::Mxfp4Activations::kMxint8 ? "mxint8" : "bf16";
  }
  return out;
}

void print_header(const bench::BenchModel& m, const bench::MachineLimits& lim, int threads,
                  const CommonArgs& args) {
  fmt::print(
      "limits ({} threads): DRAM {:.1f} GB/s (1 thread {:.1f}), FP32 GEMM {:.0f} GFLOP/s ({}), "
      "BF16 GEMM {:.0f} GFLOP/s ({}); load {:.2f}\n",
      lim.num_threads, lim.dram_read_gbps, lim.dram_read_gbps_1thread, lim.gemm_f32_gflops,
      lim.gemm_f32_impl, lim.gemm_bf16_gflops, lim.gemm_bf16_impl, bench::load_average());
  fmt::print("model {}: built in {:.1f} s, peak RSS {:.2f} GiB", m.name, m.build_seconds,
             peak_rss_bytes() / double(1 << 30));
  if (m.synthetic) {
    const model::SyntheticModelConfig& c = *m.synthetic;
    fmt::print(
        "; {} layers, hidden {}, {:.2f} B params ({:.2f} GiB held), {:.3f} B active per token; "
        "weights {} / experts {} / KV {}; per-step weights {:.1f} MiB + {:.2f} MiB per routed "
        "expert x {} MoE layers",
        c.num_layers, c.hidden_size, double(m.bytes.num_params) / 1e9,
        double(m.bytes.total_bytes) / double(1 << 30), double(m.bytes.active_params) / 1e9,
        model::synthetic_format_name(c.weight_format),
        model::synthetic_format_name(c.expert_format),
        c.kv_cache_dtype == kernels::KvCacheDtype::kFp8 ? "fp8" : "bf16",
        double(m.bytes.per_step_bytes) / 1048576.0, double(m.bytes.per_expert_bytes) / 1048576.0,
        m.bytes.num_moe_layers);
  }
  fmt::print("\nclock {}, threads {}\n", args.clock, threads);
}

// ---- decode ----

struct DecodeArgs {
  CommonArgs common;
  std::string batches = "1,4,16,64";
  std::string contexts = "1024";
  double seconds = 2.0;
  int min_steps = 3;
  int max_steps = 64;
};

Status run_decode(const DecodeArgs& args) {
  const CommonArgs& c = args.common;
  bench::DecodeOptions opt;
  DZ_ASSIGN_OR_RETURN(opt.batches, parse_size_list(args.batches, "--batch"));
  DZ_ASSIGN_OR_RETURN(opt.contexts, parse_size_list(args.contexts, "--context"));
  DZ_ASSIGN_OR_RETURN(bench::BenchModel m, load_bench_model(c));
  if (m.model == nullptr) return Status::ok_status();  // a rank that followed rank 0's steps
  const int threads = threads_of(c);
  const bench::MachineLimits lim = measure(c);
  opt.num_threads = threads;
  opt.min_seconds = args.seconds;
  opt.min_steps = args.min_steps;
  opt.max_steps = std::max(args.max_steps, args.min_steps);
  opt.cpu_clock = c.clock == "cpu";
  opt.block_size = c.block_size;
  opt.seed = c.seed;
  opt.dram_gbps = dram_limit(lim, threads);
  const bool known = m.synthetic.has_value();
  if (!c.json) {
    print_header(m, lim, threads, c);
    fmt::print(
        "context: synthetic (random cache records, indexer keys and KDA states written directly; "
        "the step reads and selects over them as over a prefilled cache)\n");
    fmt::print(
        "{:>8} {:>4} {:>9} {:>9} {:>10} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} "
        "{:>6}\n",
        "context", "B", "ms/step", "tok/s", "MiB/step", "KV MiB", "GB/s", "of DRAM", "experts",
        "speedup", "ideal", "ach/ideal", "vs ctx0", "load");
  }
  auto print_row = [&](const bench::DecodeRow& r) {
    if (c.json) return;
    auto known_or_dash = [&](double v, int precision) {
      return known ? fmt::format("{:.{}f}", v, precision) : std::string("-");
    };
    fmt::print(
        "{:>8} {:>4} {:>9.1f} {:>9.2f} {:>10} {:>8.1f} {:>8} {:>8} {:>8.1f} {:>8.2f} "
        "{:>8} {:>9} {:>8.2f} {:>6.2f}\n",
        r.context, r.batch, r.seconds_per_step * 1e3, r.tokens_per_second,
        known_or_dash(r.bytes_per_step / 1048576.0, 1), r.cache_bytes / 1048576.0,
        known_or_dash(r.gbps, 2), known_or_dash(r.dram_fraction, 2), r.distinct_experts, r.speedup,
        known_or_dash(r.ideal_speedup, 2), known_or_dash(r.achieved_over_ideal, 2),
        r.vs_first_context, r.load);
    if (m.comm != nullptr)
      fmt::print("{:>8} {:>4} rank 0 received {:.1f} KiB per step from the other ranks\n", "", "",
                 r.comm_bytes_per_step / 1024.0);
    std::fflush(stdout);
  };
  DZ_ASSIGN_OR_RETURN(std::vector<bench::DecodeRow> rows, bench::run_decode(m, opt, print_row));
  if (c.json) {
    nlohmann::json out_rows = nlohmann::json::array();
    for (const bench::DecodeRow& r : rows) {
      nlohmann::json row = {{"context", r.context},
                            {"batch", r.batch},
                            {"steps", r.num_steps},
                            {"ms_per_step", r.seconds_per_step * 1e3},
                            {"tokens_per_second", r.tokens_per_second},
                            {"cache_bytes_per_step", r.cache_bytes},
                            {"distinct_experts_per_layer", r.distinct_experts},
                            {"speedup", r.speedup},
                            {"vs_first_context", r.vs_first_context},
                            {"fill_seconds", r.fill_seconds},
                            {"filled_positions", r.filled_positions},
                            {"load", r.load}};
      if (m.comm != nullptr) row["comm_bytes_received_per_step"] = r.comm_bytes_per_step;
      if (known) {
        row["weight_bytes_per_step"] = r.weight_bytes;
        row["expert_bytes_per_step"] = r.expert_bytes;
        row["bytes_per_step"] = r.bytes_per_step;
        row["gbps"] = r.gbps;
        row["dram_fraction"] = r.dram_fraction;
        row["ideal_speedup"] = r.ideal_speedup;
        row["achieved_over_ideal"] = r.achieved_over_ideal;
      }
      out_rows.push_back(row);
    }
    nlohmann::json out = {{"command", "decode"},
                          {"limits", limits_json(lim, c)},
                          {"model", model_json(m)},
                          {"threads", threads},
                          {"clock", c.clock},
                          {"dram_limit_gbps", opt.dram_gbps},
                          {"context_is_synthetic", true},
                          {"rows", out_rows}};
    fmt::print("{}\n", out.dump(2));
  } else {
    fmt::print("peak RSS {:.2f} GiB\n", peak_rss_bytes() / double(1 << 30));
  }
  return Status::ok_status();
}

// ---- prefill ----

struct PrefillArgs {
  CommonArgs common;
  std::string tokens = "512,2048";
  int64_t chunk = 2048;
  int repeats = 1;
};

Status run_prefill(const PrefillArgs& args) {
  const CommonArgs& c = args.common;
  bench::PrefillOptions opt;
  DZ_ASSIGN_OR_RETURN(opt.token_counts, parse_size_list(args.tokens, "--tokens"));
  DZ_ASSIGN_OR_RETURN(bench::BenchModel m, load_bench_model(c));
  if (m.model == nullptr) return Status::ok_status();  // a rank that followed rank 0's steps
  const int threads = threads_of(c);
  const bench::MachineLimits lim = measure(c);
  opt.chunk_tokens = args.chunk;
  opt.num_threads = threads;
  opt.repeats = args.repeats;
  opt.cpu_clock = c.clock == "cpu";
  opt.block_size = c.block_size;
  opt.seed = c.seed;
  opt.gemm_gflops = std::max(lim.gemm_f32_gflops, lim.gemm_bf16_gflops);
  const bool known = m.synthetic.has_value();
  if (!c.json) {
    print_header(m, lim, threads, c);
    fmt::print(
        "FLOPs: linears 2 x active params per token (lm_head once per chunk) + attention "
        "(MLA 2·H·(d_qk+d_v) per causal pair, DSA min(pos+1, top-k) keys, indexer 2·n_I·d_I per "
        "pair, KDA 6·H·d² per token); fraction of the best GEMM peak ({:.0f} GFLOP/s)\n",
        opt.gemm_gflops);
    fmt::print("{:>7} {:>6} {:>9} {:>10} {:>10} {:>10} {:>9} {:>8} {:>6}\n", "tokens", "chunk",
               "seconds", "tok/s", "lin GFLOP", "attn GFLOP", "GFLOP/s", "of GEMM", "load");
  }
  auto print_row = [&](const bench::PrefillRow& r) {
    if (c.json) return;
    auto known_or_dash = [&](double v, int precision) {
      return known ? fmt::format("{:.{}f}", v, precision) : std::string("-");
    };
    fmt::print("{:>7} {:>6} {:>9.3f} {:>10.1f} {:>10} {:>10.2f} {:>9} {:>8} {:>6.2f}\n",
               r.num_tokens, r.chunk_tokens, r.seconds, r.tokens_per_second,
               known_or_dash(r.linear_flops / 1e9, 1), r.attention_flops / 1e9,
               known_or_dash(r.gflops, 1), known_or_dash(r.gemm_fraction, 3), r.load);
    std::fflush(stdout);
  };
  DZ_ASSIGN_OR_RETURN(std::vector<bench::PrefillRow> rows, bench::run_prefill(m, opt, print_row));
  if (m.comm != nullptr)
    spdlog::info("{}", traffic_summary());  // rank 0's; the others print theirs
  if (c.json) {
    nlohmann::json out_rows = nlohmann::json::array();
    for (const bench::PrefillRow& r : rows) {
      nlohmann::json row = {{"tokens", r.num_tokens},
                            {"chunk", r.chunk_tokens},
                            {"seconds", r.seconds},
                            {"tokens_per_second", r.tokens_per_second},
                            {"attention_flops", r.attention_flops},
                            {"load", r.load}};
      if (known) {
        row["linear_flops"] = r.linear_flops;
        row["gflops"] = r.gflops;
        row["gemm_fraction"] = r.gemm_fraction;
      }
      out_rows.push_back(row);
    }
    nlohmann::json out = {{"command", "prefill"},   {"limits", limits_json(lim, c)},
                          {"model", model_json(m)}, {"threads", threads},
                          {"clock", c.clock},       {"gemm_peak_gflops", opt.gemm_gflops},
                          {"rows", out_rows}};
    fmt::print("{}\n", out.dump(2));
  }
  return Status::ok_status();
}

}  // namespace

RunCommand add_bench_decode_subcommand(CLI::App& bench) {
  auto* command = bench.add_subcommand(
      "decode",
      "Decode steps over a synthetic cached context, swept over batch size and context length");
  auto args = std::make_shared<DecodeArgs>();
  add_common_options(*command, args->common);
  command->add_option("--batch", args->batches, "batch sizes, comma-separated")
      ->capture_default_str();
  command
      ->add_option("--context", args->contexts,
                   "cached tokens before the timed steps, comma-separated (K = 1024)")
      ->capture_default_str();
  command->add_option("--seconds", args->seconds, "minimum time per row")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  command->add_option("--min-steps", args->min_steps, "minimum timed steps per row")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  command->add_option("--max-steps", args->max_steps, "maximum timed steps per row")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  return [args] {
    const Status status = run_decode(*args);
    return status.ok() ? 0 : fail(status);
  };
}

RunCommand add_bench_prefill_subcommand(CLI::App& bench) {
  auto* command = bench.add_subcommand(
      "prefill", "Prefill throughput and GFLOP/s against the best GEMM peak of the same run");
  auto args = std::make_shared<PrefillArgs>();
  add_common_options(*command, args->common);
  command->add_option("--tokens", args->tokens, "prompt lengths, comma-separated (K = 1024)")
      ->capture_default_str();
  command->add_option("--chunk", args->chunk, "tokens per forward (chunked prefill)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command->add_option("--repeats", args->repeats, "best of this many prefills per length")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  return [args] {
    const Status status = run_prefill(*args);
    return status.ok() ? 0 : fail(status);
  };
}

}  // namespace dz::cli
