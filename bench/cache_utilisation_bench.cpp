// Paged-cache utilisation under a mixed-length load (docs/performance.md: live tokens / allocated
// token slots ≥ 95 % with block size 16 at a mean sequence length of 512, and no waste beyond each
// sequence's last partial block). runtime::EngineCore serves N requests whose lengths (prompt +
// output) are uniform in [mean/4, 7·mean/4] (mean `mean`), prompt a uniform share of 10–90 % of
// it, EOS ignored so every request runs to its length; metrics() is sampled after every step.
//
// Reported: the utilisation over all steps (mean, minimum, and the pooled Σ live / Σ allocated),
// the waste per running request (allocated − live slots; the bound is block_size − 1 each: only
// the last block is partial, nothing is reserved ahead), the expected waste of a uniformly
// distributed last-block fill, preemptions and the step count. The model is the small synthetic
// one (bench/configs/small_mla.json): the figure is bookkeeping, not speed.
//
// Usage: cache_utilisation_bench [--requests N] [--mean L] [--block B] [--max-seqs S]
//        [--num-blocks N] [--seed X] [config.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "dayzero/runtime/engine_core.h"
#include "serving_bench_util.h"

int main(int argc, char** argv) {
  int64_t num_requests = 48, mean_len = 512, block = 16, max_seqs = 16, num_blocks = 0;
  uint32_t seed = 1;
  std::string config = "bench/configs/small_mla.json";
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--requests" && has_value) {
      num_requests = std::stoll(argv[++i]);
    } else if (arg == "--mean" && has_value) {
      mean_len = std::stoll(argv[++i]);
    } else if (arg == "--block" && has_value) {
      block = std::stoll(argv[++i]);
    } else if (arg == "--max-seqs" && has_value) {
      max_seqs = std::stoll(argv[++i]);
    } else if (arg == "--num-blocks" && has_value) {
      num_blocks = std::stoll(argv[++i]);
    } else if (arg == "--seed" && has_value) {
      seed = static_cast<uint32_t>(std::stoul(argv[++i]));
    } else if (arg.rfind("--", 0) == 0) {
      std::fprintf(stderr, "unknown option %s\n", arg.c_str());
      return 2;
    } else {
      config = arg;
    }
  }
  dz::bench::LoadedModel m = dz::bench::load_model(config);
  const int64_t max_len = mean_len * 7 / 4;
  dz::runtime::EngineConfig ec;
  ec.max_num_seqs = max_seqs;
  ec.max_num_batched_tokens = 512;
  ec.block_size = block;
  ec.max_model_len = max_len + 1;
  // Room for every running request at its longest plus the reserve: utilisation, not preemption.
  // (--num-blocks smaller: a tight pool, where preemption frees and recomputes).
  ec.num_blocks =
      num_blocks > 0 ? num_blocks : max_seqs * ((max_len + block - 1) / block + 1) * 2 + 1;
  ec.model_identity = config;
  const dz::ExecContext ctx{.num_threads = 1};
  dz::Result<std::unique_ptr<dz::runtime::EngineCore>> engine_or =
      dz::runtime::EngineCore::create(*m.model, ctx, ec);
  DZ_CHECK(engine_or.ok(), "{}", engine_or.status().message());
  dz::runtime::EngineCore& engine = **engine_or;

  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> length(mean_len / 4, max_len);
  std::uniform_real_distribution<double> share(0.1, 0.9);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(m.config.vocab_size - 1));
  int64_t total_len = 0;
  for (int64_t id = 0; id < num_requests; ++id) {
    const int64_t len = length(rng);
    const int64_t prompt = std::clamp<int64_t>(
        static_cast<int64_t>(share(rng) * static_cast<double>(len)), 1, len - 1);
    dz::runtime::GenerationRequest req;
    for (int64_t i = 0; i < prompt; ++i) req.prompt_token_ids.push_back(token(rng));
    req.max_tokens = len - prompt;
    req.sampling.ignore_eos = true;
    total_len += len;
    const dz::Status st = engine.add_request(id, std::move(req));
    DZ_CHECK(st.ok(), "{}", st.message());
  }

  const auto t0 = std::chrono::steady_clock::now();
  double util_sum = 0, util_min = 1.0, live_sum = 0, alloc_sum = 0;
  double waste_per_req_sum = 0, waste_per_req_max = 0;
  int64_t steps = 0, measured = 0, over_bound = 0, generated = 0;
  dz::runtime::EngineMetrics last;
  while (engine.has_unfinished_requests()) {
    for (const dz::runtime::RequestOutput& o : engine.step()) {
      DZ_CHECK(o.error.ok(), "{}", o.error.message());
      generated += static_cast<int64_t>(o.new_token_ids.size());
    }
    ++steps;
    last = engine.metrics();
    if (last.num_running == 0 || last.allocated_slots == 0) continue;
    const double util =
        static_cast<double>(last.live_tokens) / static_cast<double>(last.allocated_slots);
    const double waste = static_cast<double>(last.allocated_slots - last.live_tokens) /
                         static_cast<double>(last.num_running);
    ++measured;
    util_sum += util;
    util_min = std::min(util_min, util);
    live_sum += static_cast<double>(last.live_tokens);
    alloc_sum += static_cast<double>(last.allocated_slots);
    waste_per_req_sum += waste;
    waste_per_req_max = std::max(waste_per_req_max, waste);
    if (last.allocated_slots - last.live_tokens > last.num_running * (block - 1)) ++over_bound;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "cache utilisation: %s, %lld requests, lengths uniform in [%lld, %lld] (mean %.0f "
      "drawn), block %lld, max_num_seqs %lld, pool %lld blocks; load %.2f\n",
      config.c_str(), static_cast<long long>(num_requests), static_cast<long long>(mean_len / 4),
      static_cast<long long>(max_len),
      static_cast<double>(total_len) / static_cast<double>(num_requests),
      static_cast<long long>(block), static_cast<long long>(max_seqs),
      static_cast<long long>(ec.num_blocks), dz::bench::load_average());
  std::printf(
      "  steps %lld (%lld with running requests), %lld tokens generated in %.1f s, "
      "preemptions %lld\n",
      static_cast<long long>(steps), static_cast<long long>(measured),
      static_cast<long long>(generated), seconds, static_cast<long long>(last.num_preemptions));
  std::printf(
      "  utilisation live/allocated: mean over steps %.4f, minimum %.4f, pooled %.4f "
      "(target >= 0.95)\n",
      util_sum / static_cast<double>(measured), util_min, live_sum / alloc_sum);
  std::printf(
      "  waste per running request: mean %.2f slots, max %.2f (bound %lld = block - 1; "
      "uniform last-block fill gives %.1f); steps over the bound: %lld\n",
      waste_per_req_sum / static_cast<double>(measured), waste_per_req_max,
      static_cast<long long>(block - 1), static_cast<double>(block - 1) / 2.0,
      static_cast<long long>(over_bound));
  return over_bound == 0 ? 0 : 1;
}
