// The lightning indexer (kernels/lightning_indexer.h) at DeepSeek-V3.2's shape: n_I = 64 heads,
// d_I = 128, top-k 2048, over 4K, 32K and 128K keys in the paged FP8 index cache (block 64, a
// shuffled block table). One decode token per call, plus a 64-token prefill chunk at the end of a
// 32K context. Work counted per visible key: 2·n_I·d_I FLOPs for the dots plus n_I (ReLU) + 2·n_I
// (weights) + 1 (key scale); bytes: the 132-byte cached key (the queries are negligible). Reports
// GFLOP/s as a fraction of the FP32 GEMM limit (docs/performance.md target: ≥ 60 % for L ≥ 64K) and
// GB/s as a fraction of the DRAM limit, both measured in the same run (machine_limits.h). The
// 17 MiB cache at 128K fits in the L3: the kernel is compute-bound (≈ 124 FLOP per byte).
// Variants (args): 1 reference, 2 AVX-512 FMA, 3 AVX-512 + AMX-BF16 tiles, 4 AVX-512 VDPBF16PS.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/parallel.h"
#include "dayzero/kernels/lightning_indexer.h"
#include "machine_limits.h"

namespace {

using dz::kernels::IndexerVariant;

constexpr int64_t kHeads = 64, kHeadDim = 128, kTopK = 2048, kBlockSize = 64;

const dz::bench::MachineLimits& limits() {
  return dz::bench::limits_for_this_run();
}

// Random finite E4M3 codes (act_quant-like magnitudes do not matter for speed), power-of-two
// scales, blocks in shuffled order.
struct Fixture {
  dz::kernels::IndexCacheLayout layout{.key_dim = kHeadDim, .block_size = kBlockSize};
  dz::AlignedBuffer pool;
  std::vector<int32_t> block_table;
  std::vector<uint8_t> q_codes;
  std::vector<float> weights;

  Fixture(int64_t num_keys, int64_t num_queries) {
    const int64_t num_blocks = (num_keys + kBlockSize - 1) / kBlockSize;
    pool = dz::AlignedBuffer(static_cast<size_t>(num_blocks * layout.block_bytes()));
    std::mt19937 rng(1);
    auto* bytes = reinterpret_cast<uint8_t*>(pool.data());
    for (int64_t b = 0; b < num_blocks; ++b) {
      uint8_t* block = bytes + b * layout.block_bytes();
      for (int64_t i = 0; i < kBlockSize * kHeadDim; ++i) {
        const auto c = static_cast<uint8_t>(rng());
        block[i] = (c & 0x7F) == 0x7F ? 0x7E : c;
      }
      auto* scales = reinterpret_cast<float*>(block + kBlockSize * kHeadDim);
      for (int64_t i = 0; i < kBlockSize; ++i) scales[i] = 1.0f / 64;
    }
    block_table.resize(static_cast<size_t>(num_blocks));
    std::iota(block_table.begin(), block_table.end(), 0);
    std::shuffle(block_table.begin(), block_table.end(), rng);
    q_codes.resize(static_cast<size_t>(num_queries * kHeads * kHeadDim));
    for (auto& c : q_codes) c = static_cast<uint8_t>(rng() % 0x7E);
    weights.resize(static_cast<size_t>(num_queries * kHeads));
    std::normal_distribution<float> normal;
    for (auto& w : weights) w = normal(rng);
  }
};

// Args: cached keys L, queries (the last `queries` positions of the context), variant, threads.
void BM_LightningIndexer(benchmark::State& state) {
  const dz::bench::MachineLimits& m = limits();
  const int64_t num_keys = state.range(0), num_queries = state.range(1);
  const auto variant = static_cast<IndexerVariant>(state.range(2));
  const dz::ExecContext ctx{static_cast<int>(state.range(3))};
  const dz::kernels::IndexKeyCache shape_only{
      {.key_dim = kHeadDim, .block_size = kBlockSize}, nullptr, {}};
  if (variant == IndexerVariant::kAvx512 &&
      !dz::kernels::lightning_indexer_avx512_available(shape_only)) {
    state.SkipWithError("no AVX-512 VBMI");
    return;
  }
  if (variant == IndexerVariant::kAvx512Bf16 &&
      !dz::kernels::lightning_indexer_avx512_bf16_available(shape_only)) {
    state.SkipWithError("no AVX512-BF16");
    return;
  }
  if (variant == IndexerVariant::kAmx &&
      !dz::kernels::lightning_indexer_amx_available(shape_only)) {
    state.SkipWithError("no AMX-BF16 granted");
    return;
  }
  const Fixture f(num_keys, num_queries);
  std::vector<int32_t> positions(static_cast<size_t>(num_queries));
  std::iota(positions.begin(), positions.end(), static_cast<int32_t>(num_keys - num_queries));
  const dz::kernels::IndexKeyCache keys{f.layout, f.pool.data(), f.block_table};
  const dz::kernels::IndexerQueries queries{.q_codes = f.q_codes.data(),
                                            .head_weights = f.weights.data(),
                                            .positions = positions,
                                            .num_heads = kHeads};
  dz::AlignedBuffer workspace(
      dz::kernels::lightning_indexer_workspace_bytes(ctx, keys, queries, kTopK));
  std::vector<int32_t> selection(static_cast<size_t>(num_queries * kTopK));
  for (auto _ : state) {
    dz::kernels::lightning_indexer(ctx, keys, queries, kTopK, selection, {}, workspace.bytes(),
                                   variant);
    benchmark::DoNotOptimize(selection.data());
  }
  double scored_keys = 0;
  for (int32_t pos : positions) scored_keys += pos + 1;
  const double calls = static_cast<double>(state.iterations());
  const double flops = scored_keys * (2.0 * kHeads * kHeadDim + 3.0 * kHeads + 1.0);
  // Bytes read: each key once per call (a prefill tile shares the keys it streams).
  const double bytes = static_cast<double>(num_keys) * (kHeadDim + 4);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * calls / 1e9, benchmark::Counter::kIsRate);
  state.counters["GB/s"] = benchmark::Counter(bytes * calls / 1e9, benchmark::Counter::kIsRate);
  state.counters["of_fp32_gemm"] =
      benchmark::Counter(flops * calls / 1e9 / m.gemm_f32_gflops, benchmark::Counter::kIsRate);
  state.counters["of_dram"] =
      benchmark::Counter(bytes * calls / 1e9 / m.dram_read_gbps, benchmark::Counter::kIsRate);
}

void args(benchmark::internal::Benchmark* b) {
  const int64_t threads = dz::default_num_threads();
  const auto avx = static_cast<int64_t>(IndexerVariant::kAvx512);
  const auto amx = static_cast<int64_t>(IndexerVariant::kAmx);
  const auto bf16 = static_cast<int64_t>(IndexerVariant::kAvx512Bf16);
  const auto ref = static_cast<int64_t>(IndexerVariant::kRef);
  for (int64_t variant : {amx, bf16, avx}) {
    for (int64_t keys : {4096, 32768, 131072}) {
      b->Args({keys, 1, variant, 1});
      if (threads > 1) b->Args({keys, 1, variant, threads});
    }
    b->Args({32768, 64, variant, threads});
  }
  b->Args({4096, 1, ref, threads});
  b->ArgNames({"keys", "queries", "variant", "threads"})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(1.0);
}

BENCHMARK(BM_LightningIndexer)->Apply(args);

}  // namespace

BENCHMARK_MAIN();
