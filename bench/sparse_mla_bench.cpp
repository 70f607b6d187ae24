// One decode step of DeepSeek-V3.2 MLA attention (kernels/mla_attention.h, absorbed form): one
// query token, H = 128 heads, r_kv = 512, d_r = 64, over an FP8 latent cache (656 B per token) of
// 4K, 32K and 128K tokens; sparse over 2048 selected positions (index_topk, in random order as the
// indexer returns them) against dense over every cached token. Pools rotate through a >= 1 GiB set
// (one pool per "layer") so that the records come from DRAM, not from the L3, as they do in a
// 61-layer model.
//
// Bytes: the records read (656 B per key) plus q and o_lat. FLOPs: 2 · H · keys · (2·r_kv + d_r)
// (scores and the latent accumulation, FP32 FMAs). Reported against the FP32 GEMM limit (the kernel
// computes in FP32) and the DRAM read bandwidth measured in the same run (machine_limits.h). The
// sparse/dense ratio of time per step is printed at the end (issue 3 target: >= 5x at 128K).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/kernels/mla_attention.h"
#include "machine_limits.h"

namespace {

using dz::kernels::KvCacheDtype;
using dz::kernels::MlaCacheLayout;

constexpr int64_t kHeads = 128, kLatent = 512, kRope = 64, kTopK = 2048, kBlockSize = 64;
constexpr int64_t kSetBytes = int64_t{1} << 30;
const MlaCacheLayout kLayout{.latent_dim = kLatent, .rope_dim = kRope, .dtype = KvCacheDtype::kFp8};

const dz::bench::MachineLimits& limits() {
  return dz::bench::limits_for_this_run();
}

// num_pools copies of one pool of num_tokens random records (block table = identity).
struct PoolSet {
  int64_t num_tokens = 0;
  std::vector<std::vector<std::byte>> pools;
  std::vector<int32_t> block_table;
};

PoolSet make_pools(int64_t num_tokens) {
  PoolSet set;
  set.num_tokens = num_tokens;
  const int64_t pool_bytes = num_tokens * kLayout.record_bytes();
  const int64_t num_pools = std::max<int64_t>(2, (kSetBytes + pool_bytes - 1) / pool_bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<std::byte> first(static_cast<size_t>(pool_bytes));
  std::vector<float> latent(kLatent), rope(kRope);
  for (int64_t slot = 0; slot < num_tokens; ++slot) {
    for (auto& v : latent) v = normal(rng);
    for (auto& v : rope) v = normal(rng);
    dz::kernels::write_mla_record(kLayout, first.data(), slot, latent.data(), rope.data());
  }
  for (int64_t p = 0; p < num_pools; ++p) set.pools.push_back(first);
  for (int32_t b = 0; b < num_tokens / kBlockSize; ++b) set.block_table.push_back(b);
  return set;
}

std::map<std::pair<int64_t, bool>, double> g_seconds_per_step;  // (tokens, sparse) → s

void BM_MlaDecodeStep(benchmark::State& state) {
  const int64_t num_tokens = state.range(0);
  const bool sparse = state.range(1) != 0;
  const dz::bench::MachineLimits& m = limits();
  const dz::ExecContext ctx{dz::default_num_threads()};
  static std::map<int64_t, PoolSet> sets;  // built once per context length
  if (!sets.count(num_tokens)) sets.emplace(num_tokens, make_pools(num_tokens));
  const PoolSet& set = sets.at(num_tokens);

  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  std::vector<float> q_abs(kHeads * kLatent), q_pe(kHeads * kRope), o_lat(kHeads * kLatent);
  for (auto& v : q_abs) v = normal(rng);
  for (auto& v : q_pe) v = normal(rng);
  const std::vector<int32_t> positions{static_cast<int32_t>(num_tokens - 1)};
  std::vector<int32_t> selection;
  if (sparse) {
    std::vector<int32_t> all(static_cast<size_t>(num_tokens));
    for (int32_t p = 0; p < num_tokens; ++p) all[static_cast<size_t>(p)] = p;
    std::shuffle(all.begin(), all.end(), rng);
    selection.assign(all.begin(), all.begin() + std::min(kTopK, num_tokens));
  }
  const dz::kernels::MlaQueryKeys keys{
      .positions = positions, .selection = selection, .selection_width = sparse ? kTopK : 0};
  const int64_t num_keys = sparse ? std::min(kTopK, num_tokens) : num_tokens;
  const dz::kernels::MlaAbsorbedArgs args{.num_heads = kHeads,
                                          .softmax_scale = 0.135234f,
                                          .q_abs = q_abs.data(),
                                          .q_pe = q_pe.data(),
                                          .q_pe_token_stride = kHeads * kRope,
                                          .q_pe_head_stride = kRope,
                                          .o_lat = o_lat.data()};
  std::vector<std::byte> workspace_buffer(
      dz::kernels::mla_absorbed_workspace_bytes(ctx, kLayout, 1, kHeads) + 64);
  const size_t skip = (64 - reinterpret_cast<uintptr_t>(workspace_buffer.data()) % 64) % 64;
  const std::span<std::byte> workspace = std::span<std::byte>(workspace_buffer).subspan(skip);

  size_t next = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    const dz::kernels::MlaCacheView cache{.layout = kLayout,
                                          .pool = set.pools[next].data(),
                                          .block_size = kBlockSize,
                                          .block_table = set.block_table};
    dz::kernels::mla_attention_absorbed(ctx, cache, keys, args, workspace);
    benchmark::DoNotOptimize(o_lat.data());
    next = (next + 1) % set.pools.size();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double steps = static_cast<double>(state.iterations());
  const double bytes =
      static_cast<double>(num_keys * kLayout.record_bytes() + (kHeads * (2 * kLatent + kRope)) * 4);
  const double flops = 2.0 * kHeads * static_cast<double>(num_keys) * (2 * kLatent + kRope);
  const double gbps = bytes * steps / seconds / 1e9, gflops = flops * steps / seconds / 1e9;
  state.counters["keys"] = static_cast<double>(num_keys);
  state.counters["MB_read"] = bytes / 1e6;
  state.counters["GFLOP"] = flops / 1e9;
  state.counters["GB/s"] = gbps;
  state.counters["of_dram"] = gbps / m.dram_read_gbps;
  state.counters["GFLOP/s"] = gflops;
  state.counters["of_f32_gemm"] = gflops / m.gemm_f32_gflops;
  g_seconds_per_step[{num_tokens, sparse}] = seconds / steps;
}

BENCHMARK(BM_MlaDecodeStep)
    ->ArgsProduct({{4096, 32768, 131072}, {1, 0}})
    ->ArgNames({"cached", "sparse"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  for (int64_t tokens : {4096, 32768, 131072}) {
    const auto sparse = g_seconds_per_step.find({tokens, true});
    const auto dense = g_seconds_per_step.find({tokens, false});
    if (sparse == g_seconds_per_step.end() || dense == g_seconds_per_step.end()) continue;
    std::printf("cached %6lld: sparse %.3f ms, dense %.3f ms, sparse/dense speed ratio %.1fx\n",
                static_cast<long long>(tokens), sparse->second * 1e3, dense->second * 1e3,
                dense->second / sparse->second);
  }
  return 0;
}
