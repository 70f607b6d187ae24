// Time to first token with and without a prefix-cache hit (issue 5): runtime::EngineCore serves a
// long prompt (default 2048 tokens: a 1984-token prefix shared with an earlier request and a
// 64-token own suffix). Cold: the first request of a prefix computes all of its prompt; hit: a
// later request with the same prefix takes the prefix's full blocks from the cache and computes
// only its suffix (the hit is checked: num_cached_tokens = the shared blocks). Two prefixes are
// served, each cold then hit, after a short warm-up request, so both figures are measured twice.
// One step may prefill the whole prompt (max_num_batched_tokens = long_prefill_threshold =
// prompt length). Also reported: the FLOPs of each (2 per active parameter per token, attention
// excluded) and the achieved FLOP/s of the cold prefill against the BF16 GEMM peak of this run.
//
// Usage: prefix_ttft_bench [--prompt N] [--shared N] [--block B] [--threads T] [--clock wall|cpu]
//        [config.json]
//        (default bench/configs/dense_bw.json)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "dayzero/runtime/engine_core.h"
#include "machine_limits.h"
#include "serving_bench_util.h"

namespace {

// --clock cpu: process CPU time instead of the wall clock (one thread on a shared machine: the
// time the request's steps actually ran).
bool g_cpu_clock = false;

double now_seconds() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Ttft {
  double seconds = 0;
  int64_t cached_tokens = 0;
  int64_t steps = 0;
};

Ttft first_token(dz::runtime::EngineCore& engine, int64_t id, std::vector<int32_t> prompt) {
  dz::runtime::GenerationRequest req;
  req.prompt_token_ids = std::move(prompt);
  req.max_tokens = 1;
  req.sampling.ignore_eos = true;
  Ttft out;
  const double t0 = now_seconds();
  DZ_CHECK(engine.add_request(id, std::move(req)).ok(), "add_request");
  for (bool done = false; !done;) {
    ++out.steps;
    for (const dz::runtime::RequestOutput& o : engine.step()) {
      DZ_CHECK(o.error.ok(), "{}", o.error.message());
      if (o.request_id == id && !o.new_token_ids.empty()) {
        done = true;
        out.cached_tokens = o.num_cached_tokens;
      }
    }
  }
  out.seconds = now_seconds() - t0;
  while (engine.has_unfinished_requests()) engine.step();
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t prompt_len = 2048, shared = 1984, block = 16;
  int threads = 0;
  std::string config = "bench/configs/dense_bw.json";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--prompt" && has_value) {
      prompt_len = std::stoll(argv[++i]);
    } else if (arg == "--shared" && has_value) {
      shared = std::stoll(argv[++i]);
    } else if (arg == "--block" && has_value) {
      block = std::stoll(argv[++i]);
    } else if (arg == "--threads" && has_value) {
      threads = std::stoi(argv[++i]);
    } else if (arg == "--clock" && has_value) {
      g_cpu_clock = std::string(argv[++i]) == "cpu";
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      return 2;
    } else {
      config = arg;
    }
  }
  DZ_CHECK(shared < prompt_len, "the shared prefix must be shorter than the prompt");
  const dz::bench::MachineLimits& lim = dz::bench::limits_for_this_run();
  if (threads <= 0) threads = lim.num_threads;
  dz::bench::LoadedModel m = dz::bench::load_model(config);
  dz::runtime::EngineConfig ec;
  ec.max_num_seqs = 4;
  ec.max_num_batched_tokens = prompt_len;
  ec.long_prefill_threshold = prompt_len;
  ec.block_size = block;
  ec.max_model_len = prompt_len + 8;
  ec.num_blocks = 4 * ((prompt_len + 8) / block + 2) + 1 + 4;
  ec.model_identity = config;
  const dz::ExecContext ctx{.num_threads = threads};
  dz::Result<std::unique_ptr<dz::runtime::EngineCore>> engine_or =
      dz::runtime::EngineCore::create(*m.model, ctx, ec);
  DZ_CHECK(engine_or.ok(), "{}", engine_or.status().message());
  dz::runtime::EngineCore& engine = **engine_or;

  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(m.config.vocab_size - 1));
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> v;
    for (int64_t i = 0; i < n; ++i) v.push_back(token(rng));
    return v;
  };
  first_token(engine, 0, random_tokens(64));  // warm-up: scratch, oneDNN primitives

  const double gemm_gflops =
      lim.gemm_bf16_gflops * std::min(1.0, static_cast<double>(threads) / lim.num_threads);
  const double flops_per_token = 2.0 * static_cast<double>(m.bytes.active_params);
  const int64_t expect_hit = shared / block * block;
  std::printf(
      "prefix TTFT (%s clock): %s (%.2f B active params), %d threads, prompt %lld tokens of which "
      "%lld shared (%lld in full blocks of %lld); limits: BF16 GEMM %.0f GFLOP/s at %d "
      "threads\n",
      g_cpu_clock ? "CPU" : "wall", config.c_str(),
      static_cast<double>(m.bytes.active_params) / 1e9, threads, static_cast<long long>(prompt_len),
      static_cast<long long>(shared), static_cast<long long>(expect_hit),
      static_cast<long long>(block), lim.gemm_bf16_gflops, lim.num_threads);
  std::printf("  %-8s %-5s %10s %8s %8s %12s %10s %6s\n", "prefix", "kind", "TTFT ms", "cached",
              "steps", "GFLOP", "of peak", "load");
  int64_t id = 1;
  double cold_sum = 0, hit_sum = 0;
  for (int p = 0; p < 2; ++p) {
    const std::vector<int32_t> prefix = random_tokens(shared);
    for (int kind = 0; kind < 2; ++kind) {
      std::vector<int32_t> prompt = prefix;
      const std::vector<int32_t> suffix = random_tokens(prompt_len - shared);
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      const Ttft t = first_token(engine, id++, prompt);
      DZ_CHECK(t.cached_tokens == (kind == 0 ? 0 : expect_hit), "{} cached tokens, expected {}",
               t.cached_tokens, kind == 0 ? 0 : expect_hit);
      const double gflop =
          flops_per_token * static_cast<double>(prompt_len - t.cached_tokens) / 1e9;
      std::printf("  %-8d %-5s %10.1f %8lld %8lld %12.1f %10.2f %6.2f\n", p,
                  kind == 0 ? "cold" : "hit", t.seconds * 1e3,
                  static_cast<long long>(t.cached_tokens), static_cast<long long>(t.steps), gflop,
                  gflop / t.seconds / gemm_gflops, dz::bench::load_average());
      (kind == 0 ? cold_sum : hit_sum) += t.seconds;
    }
  }
  std::printf(
      "  mean TTFT cold %.1f ms, hit %.1f ms: %.1fx faster (computed tokens %lld vs "
      "%lld)\n",
      cold_sum / 2 * 1e3, hit_sum / 2 * 1e3, cold_sum / hit_sum, static_cast<long long>(prompt_len),
      static_cast<long long>(prompt_len - expect_hit));
  return 0;
}
