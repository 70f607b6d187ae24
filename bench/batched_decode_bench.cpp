// Decode throughput at batch 1, 4, 16 and 64 on the bandwidth-bound synthetic models of
// bench/configs (issue 5, docs/performance.md "Targets": batch-16 decode vs batch-1). B sequences
// are prefilled once with a short context; then each timed step is one ForwardBatch of B one-token
// sequences
// ("model step": model.forward with every row's logits, as the engine asks for them); then the
// same through runtime::EngineCore ("engine step": scheduler, block tables, sampling).
//
// Reported per B: ms per step, tokens/s, the speedup over B = 1, and the IDEAL speedup from the
// bytes one step must read: the batch-independent weights (attention in the form decode reads,
// dense FFNs, shared experts, routers, lm_head) once, each distinct routed expert the batch
// touched once (counted from the routing of the timed steps), and every sequence's cached KV
// records. ideal(B) = B · bytes(1) / bytes(B); the target is achieved / ideal ≥ 0.80. Also the
// fraction of the DRAM bandwidth at B = 1 (bytes(B) / time / DRAM, every row), the compute floor
// (2 FLOPs per active parameter per token at the BF16 GEMM peak measured in the same run, scaled
// to the thread count), and the roofline speedup B · floor(1) / floor(B) with
// floor = max(bytes / DRAM, compute): where the compute floor exceeds the bytes, no batch can reach
// the bytes-only ideal. The first batch size listed is the baseline (1 by default).
//
// Usage: batched_decode_bench [--context N] [--batches 1,4,16,64] [--rounds R]
//        [--min-seconds S] [--max-steps N] [--threads N] [--clock wall|cpu] [--no-engine]
//        [config.json ...] (default: bench/configs/{dense,moe}_bw.json, relative to the working
//        directory)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/model/kv_cache.h"
#include "dayzero/runtime/engine_core.h"
#include "machine_limits.h"
#include "serving_bench_util.h"

namespace {

using dz::bench::BatchBuilder;
using dz::bench::ExpertCounter;
using dz::bench::load_average;

struct Options {
  int64_t context = 32;
  std::vector<int64_t> batches{1, 4, 16, 64};
  int rounds = 2;
  double min_seconds = 1.5;  // per (round, B)
  int max_steps = 16;        // per (round, B)
  int threads = 0;           // 0: the limits' thread count (all hardware threads)
  bool engine = true;        // also the "engine step" rows
  std::vector<std::string> configs;
};

struct Row {
  int64_t batch = 0;
  double seconds_per_step = 1e30;  // best round
  double kv_bytes = 0;             // per step, at the best round
  double distinct_experts = 0;     // per MoE layer per step, over all timed steps
  double load = 0;                 // at the best round
};

// --clock cpu: time steps by the process's CPU time instead of the wall clock. With one thread on
// a machine shared with other jobs this is the time the step actually ran (not the time it waited
// for a core); memory bandwidth is still shared.
bool g_cpu_clock = false;

double now_seconds() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// E·(1 − (1 − k/E)^B): distinct experts a batch of B touches when each token picks k uniformly.
double expected_distinct(int64_t E, int64_t k, int64_t B) {
  return static_cast<double>(E) *
         (1.0 -
          std::pow(1.0 - static_cast<double>(k) / static_cast<double>(E), static_cast<double>(B)));
}

void run_config(const std::string& path, const Options& opt, const dz::bench::MachineLimits& lim) {
  const double t_build = now_seconds();
  dz::bench::LoadedModel m = dz::bench::load_model(path);
  dz::model::HybridModel& model = *m.model;
  const dz::model::SyntheticWeightBytes& wb = m.bytes;
  const dz::model::SyntheticFfnConfig& ffn = m.config.ffn;
  std::printf(
      "\n== %s: %lld layers, hidden %lld, %s; held %.2f GiB, %.2f B params "
      "(built in %.1f s)\n",
      path.c_str(), static_cast<long long>(m.config.num_layers),
      static_cast<long long>(m.config.hidden_size), ffn.moe ? "MoE" : "dense FFN",
      static_cast<double>(wb.total_bytes) / (1 << 30), static_cast<double>(wb.num_params) / 1e9,
      now_seconds() - t_build);
  std::printf(
      "   per-step weights %.1f MiB; routed expert %.2f MiB x %lld MoE layers (top-%lld of "
      "%lld); active params per token %.3f B\n",
      static_cast<double>(wb.per_step_bytes) / 1048576.0,
      static_cast<double>(wb.per_expert_bytes) / 1048576.0,
      static_cast<long long>(wb.num_moe_layers), static_cast<long long>(ffn.num_experts_per_tok),
      static_cast<long long>(ffn.num_experts), static_cast<double>(wb.active_params) / 1e9);

  const int64_t max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  constexpr int64_t kBlock = 16;
  const int64_t capacity = opt.context + static_cast<int64_t>(opt.rounds) *
                                             static_cast<int64_t>(opt.batches.size()) *
                                             (opt.max_steps + 1);
  const int64_t blocks_per_seq = (capacity + kBlock - 1) / kBlock;
  const std::vector<dz::model::LayerCacheSpec> specs = model.cache_layers();
  const bool recurrent =
      std::any_of(specs.begin(), specs.end(), [](const auto& s) { return s.kda.num_heads > 0; });
  dz::Result<dz::model::KvCache> cache_or = dz::model::KvCache::create(
      specs, max_batch * blocks_per_seq + 1, kBlock, recurrent ? max_batch : 0);
  DZ_CHECK(cache_or.ok(), "{}", cache_or.status().message());
  std::optional<dz::model::KvCache> cache_holder(std::move(cache_or).value());
  dz::model::KvCache& cache = *cache_holder;
  const double kv_per_token = static_cast<double>(cache.bytes_per_token());

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(m.config.vocab_size - 1));
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(max_batch));
  std::vector<std::vector<int32_t>> tables(static_cast<size_t>(max_batch));
  std::vector<int64_t> pos(static_cast<size_t>(max_batch), 0);
  for (int64_t s = 0; s < max_batch; ++s) {
    for (int64_t i = 0; i < capacity; ++i) tokens[static_cast<size_t>(s)].push_back(token(rng));
    for (int64_t b = 0; b < blocks_per_seq; ++b)
      tables[static_cast<size_t>(s)].push_back(static_cast<int32_t>(1 + s * blocks_per_seq + b));
  }
  const int threads = opt.threads > 0 ? opt.threads : lim.num_threads;
  const dz::ExecContext ctx{.num_threads = threads};
  // The ceilings at this thread count: DRAM measured at 1 and at all threads; the GEMM peak
  // (measured at all threads) scaled by threads / all.
  const double dram_gbps = threads == 1 ? lim.dram_read_gbps_1thread : lim.dram_read_gbps;
  const double gemm_gflops =
      lim.gemm_bf16_gflops * std::min(1.0, static_cast<double>(threads) / lim.num_threads);
  std::vector<float> logits;
  BatchBuilder bb;
  auto run = [&](dz::model::TapSink* taps) {
    const dz::model::ForwardBatch& batch = bb.finish();
    logits.resize(bb.rows.size() * static_cast<size_t>(m.config.vocab_size));
    const dz::Status st = model.forward(ctx, batch, cache, bb.rows, logits.data(), taps);
    DZ_CHECK(st.ok(), "{}", st.message());
  };
  auto slot = [&](int64_t s) { return recurrent ? static_cast<int32_t>(s) : int32_t{-1}; };

  // Prefill every sequence once, 512 tokens per forward.
  const double t_prefill = now_seconds();
  for (int64_t s0 = 0; s0 < max_batch;) {
    bb.clear();
    int64_t n = 0;
    for (; s0 < max_batch && n + opt.context <= std::max<int64_t>(512, opt.context); ++s0) {
      const auto s = static_cast<size_t>(s0);
      bb.add(tokens[s], tables[s], kBlock, 0, opt.context, slot(s0));
      pos[s] = opt.context;
      n += opt.context;
    }
    run(nullptr);
  }
  std::printf("   prefilled %lld sequences x %lld tokens in %.1f s (load %.2f)\n",
              static_cast<long long>(max_batch), static_cast<long long>(opt.context),
              now_seconds() - t_prefill, load_average());

  ExpertCounter counter(model);
  std::vector<Row> rows(opt.batches.size());
  std::vector<double> distinct_sum(opt.batches.size(), 0.0);
  std::vector<int64_t> distinct_steps(opt.batches.size(), 0);
  auto decode_step = [&](int64_t B, dz::model::TapSink* taps) {
    bb.clear();
    double kv = 0;
    for (int64_t s = 0; s < B; ++s) {
      const auto i = static_cast<size_t>(s);
      bb.add(tokens[i], tables[i], kBlock, pos[i], pos[i] + 1, slot(s));
      ++pos[i];
      kv += static_cast<double>(pos[i]) * kv_per_token;
    }
    run(taps);
    return kv;
  };
  for (int r = 0; r < opt.rounds; ++r) {
    for (size_t bi = 0; bi < opt.batches.size(); ++bi) {
      const int64_t B = opt.batches[bi];
      decode_step(B, nullptr);  // warm-up: scratch sized, weights' pages touched
      counter.reset();
      double kv_sum = 0;
      int steps = 0;
      const double t0 = now_seconds();
      while (steps < opt.max_steps && (steps < 3 || now_seconds() - t0 < opt.min_seconds)) {
        kv_sum += decode_step(B, &counter);
        ++steps;
      }
      const double per_step = (now_seconds() - t0) / steps;
      distinct_sum[bi] += counter.mean_distinct() * steps;
      distinct_steps[bi] += steps;
      Row& row = rows[bi];
      row.batch = B;
      if (per_step < row.seconds_per_step) {
        row.seconds_per_step = per_step;
        row.kv_bytes = kv_sum / steps;
        row.load = load_average();
      }
    }
  }

  // Bytes of one step at each B, and the table.
  auto step_bytes = [&](size_t bi, double distinct) {
    return static_cast<double>(wb.per_step_bytes) +
           distinct * static_cast<double>(wb.num_moe_layers * wb.per_expert_bytes) +
           rows[bi].kv_bytes;
  };
  std::printf("   %-4s %8s %8s %8s %17s %9s %7s %9s %10s %7s %8s %7s %6s\n", "B", "ms/step",
              "tok/s", "speedup", "experts/layer", "MiB/step", "ideal", "ach/ideal", "compute ms",
              "roof", "ach/roof", "of DRAM", "load");
  double bytes1 = 0, tps1 = 0, floor1_ms = 0;
  for (size_t bi = 0; bi < rows.size(); ++bi) {
    Row& row = rows[bi];
    row.distinct_experts = distinct_sum[bi] / static_cast<double>(distinct_steps[bi]);
    const double bytes = step_bytes(bi, row.distinct_experts);
    const double tps = static_cast<double>(row.batch) / row.seconds_per_step;
    if (bi == 0)
      bytes1 = bytes / static_cast<double>(row.batch), tps1 = tps / static_cast<double>(row.batch);
    const double speedup = tps / tps1;
    const double ideal = static_cast<double>(row.batch) * bytes1 / bytes;
    const double gbps = bytes / row.seconds_per_step / 1e9;
    const double compute_ms = 2.0 * static_cast<double>(wb.active_params) *
                              static_cast<double>(row.batch) / (gemm_gflops * 1e9) * 1e3;
    char experts[32] = "-";
    if (wb.num_moe_layers > 0)
      std::snprintf(experts, sizeof experts, "%.1f (unif %.1f)", row.distinct_experts,
                    expected_distinct(ffn.num_experts, ffn.num_experts_per_tok, row.batch));
    // Roofline: a step takes at least max(bytes / DRAM, FLOPs / GEMM peak).
    const double floor_ms = std::max(bytes / (dram_gbps * 1e9) * 1e3, compute_ms);
    if (bi == 0) floor1_ms = floor_ms / static_cast<double>(row.batch);
    const double roof = static_cast<double>(row.batch) * floor1_ms / floor_ms;
    std::printf(
        "   %-4lld %8.1f %8.1f %8.2f %17s %9.1f %7.2f %9.2f %10.1f %7.2f %8.2f %7.2f %6.2f\n",
        static_cast<long long>(row.batch), row.seconds_per_step * 1e3, tps, speedup, experts,
        bytes / 1048576.0, ideal, speedup / ideal, compute_ms, roof, speedup / roof,
        gbps / dram_gbps, row.load);
  }
  std::fflush(stdout);
  if (!opt.engine) return;

  // "engine step": the same decode through runtime::EngineCore (scheduler, block pool, greedy
  // sampling of every row), B requests of `context` random prompt tokens admitted together; after
  // their prefill, each timed step() must return B new tokens. One round per B.
  cache_holder.reset();  // the model path's cache is no longer needed
  dz::runtime::EngineConfig ec;
  ec.max_num_seqs = max_batch;
  ec.max_num_batched_tokens = std::max<int64_t>(512, max_batch * opt.context);
  ec.block_size = kBlock;
  const int64_t engine_len = opt.context + opt.max_steps + 4;
  ec.max_model_len = engine_len + 1;
  ec.num_blocks = max_batch * ((engine_len + kBlock) / kBlock + 1) + 1;
  ec.enable_prefix_caching = false;
  ec.model_identity = path;
  dz::Result<std::unique_ptr<dz::runtime::EngineCore>> engine_or =
      dz::runtime::EngineCore::create(model, ctx, ec);
  DZ_CHECK(engine_or.ok(), "{}", engine_or.status().message());
  dz::runtime::EngineCore& engine = **engine_or;
  std::printf("   engine step (EngineCore, greedy sampling; model-step figures for comparison):\n");
  std::printf("   %-4s %9s %9s %8s %10s %12s %6s\n", "B", "ms/step", "tok/s", "speedup",
              "ach/ideal", "vs model step", "load");
  int64_t next_id = 0;
  double engine_tps1 = 0;
  for (size_t bi = 0; bi < opt.batches.size(); ++bi) {
    const int64_t B = opt.batches[bi];
    std::vector<int64_t> ids;
    for (int64_t s = 0; s < B; ++s) {
      dz::runtime::GenerationRequest req;
      const auto& t = tokens[static_cast<size_t>(s)];
      req.prompt_token_ids.assign(t.begin(), t.begin() + opt.context);
      req.max_tokens = engine_len - opt.context;
      req.sampling.ignore_eos = true;
      ids.push_back(next_id);
      const dz::Status st = engine.add_request(next_id++, std::move(req));
      DZ_CHECK(st.ok(), "{}", st.message());
    }
    auto count_tokens = [](const std::vector<dz::runtime::RequestOutput>& outs) {
      int64_t n = 0;
      for (const auto& o : outs) {
        DZ_CHECK(o.error.ok(), "{}", o.error.message());
        n += static_cast<int64_t>(o.new_token_ids.size());
      }
      return n;
    };
    // Prefill (possibly several steps) until every request has its first token, then a warm-up.
    for (int64_t sampled = 0; sampled < B;) sampled += count_tokens(engine.step());
    count_tokens(engine.step());
    int steps = 0;
    const double t0 = now_seconds();
    while (steps < opt.max_steps && (steps < 3 || now_seconds() - t0 < opt.min_seconds)) {
      const int64_t n = count_tokens(engine.step());
      DZ_CHECK(n == B, "engine step produced {} tokens for {} decoding requests", n, B);
      ++steps;
    }
    const double per_step = (now_seconds() - t0) / steps;
    const double tps = static_cast<double>(B) / per_step;
    if (bi == 0) engine_tps1 = tps / static_cast<double>(B);
    const double ideal =
        static_cast<double>(B) * bytes1 / step_bytes(bi, rows[bi].distinct_experts);
    std::printf("   %-4lld %9.1f %9.1f %8.2f %10.2f %12.2f %6.2f\n", static_cast<long long>(B),
                per_step * 1e3, tps, tps / engine_tps1, tps / engine_tps1 / ideal,
                rows[bi].seconds_per_step / per_step, load_average());
    for (int64_t id : ids) engine.abort_request(id);
    while (engine.has_unfinished_requests()) engine.step();
  }
  std::fflush(stdout);
}

std::vector<int64_t> parse_list(const char* text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--context" && has_value) {
      opt.context = std::stoll(argv[++i]);
    } else if (arg == "--batches" && has_value) {
      opt.batches = parse_list(argv[++i]);
    } else if (arg == "--rounds" && has_value) {
      opt.rounds = std::stoi(argv[++i]);
    } else if (arg == "--min-seconds" && has_value) {
      opt.min_seconds = std::stod(argv[++i]);
    } else if (arg == "--max-steps" && has_value) {
      opt.max_steps = std::stoi(argv[++i]);
    } else if (arg == "--threads" && has_value) {
      opt.threads = std::stoi(argv[++i]);
    } else if (arg == "--clock" && has_value) {
      g_cpu_clock = std::string(argv[++i]) == "cpu";
    } else if (arg == "--no-engine") {
      opt.engine = false;
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      return 2;
    } else {
      opt.configs.push_back(arg);
    }
  }
  if (opt.configs.empty())
    opt.configs = {"bench/configs/dense_bw.json", "bench/configs/moe_bw.json"};
  const dz::bench::MachineLimits& lim = dz::bench::limits_for_this_run();
  std::printf(
      "limits: DRAM %.1f GB/s (1 thread), %.1f GB/s (%d threads), BF16 GEMM %.0f GFLOP/s, FP32 "
      "GEMM %.0f "
      "GFLOP/s; load %.2f\n",
      lim.dram_read_gbps_1thread, lim.dram_read_gbps, lim.num_threads, lim.gemm_bf16_gflops,
      lim.gemm_f32_gflops, load_average());
  std::printf(
      "clock %s, threads %d, context %lld tokens, %d rounds (best per B), >= %.1f s or %d steps "
      "per round\n",
      g_cpu_clock ? "process CPU time" : "wall", opt.threads > 0 ? opt.threads : lim.num_threads,
      static_cast<long long>(opt.context), opt.rounds, opt.min_seconds, opt.max_steps);
  for (const std::string& path : opt.configs) run_config(path, opt, lim);
  return 0;
}
