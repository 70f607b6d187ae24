// The BF16 panel GEMM (kernels/gemm_small_bf16.h, the body this CPU runs) against oneDNN's BF16
// matmul on the same reordered weight, at 1–512 tokens: decode steps, speculative verification
// rows and small batches (1–64), prefill chunks (128–512; the AVX512-BF16 body only). Three
// residencies: one [256, 256] matrix (128 KiB, in L2: the demo model's projections), one [4096,
// 256] matrix (2 MiB: an LM head of 4096 words, in L3) and a >= 1 GiB set of [2048, 7168] matrices
// (every call reads its weight from DRAM, reported as a fraction of the DRAM read bandwidth
// measured in the same run). Microseconds per call are the figure to compare (the Time column);
// both sides round the activations to BF16 inside the timing.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include <omp.h>
#include <dnnl.hpp>

#include "dayzero/core/parallel.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/gemm_small_bf16.h"
#include "machine_limits.h"

namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

struct Shape {
  int64_t out, in;
};

// One weight in oneDNN's blocked layout, with the oneDNN primitives for each token count.
struct Weight {
  Shape shape;
  memory blocked;
  // By (tokens, threads): a oneDNN primitive keeps the thread count it was created with.
  std::map<std::pair<int64_t, int>, dnnl::matmul> matmuls;
};

const dnnl::engine& engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::matmul::primitive_desc matmul_desc(Shape s, int64_t tokens) {
  return {dnnl::matmul::desc(memory::desc({tokens, s.in}, Dt::bf16, Tag::ab),
                             memory::desc({s.in, s.out}, Dt::bf16, Tag::any),
                             memory::desc({tokens, s.out}, Dt::f32, Tag::ab)),
          engine()};
}

std::unique_ptr<Weight> make_weight(Shape s, uint64_t seed) {
  std::vector<uint16_t> codes(static_cast<size_t>(s.out * s.in));
  for (uint16_t& c : codes) {
    seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
    c = dz::formats::encode_bf16(static_cast<float>(seed % 2001) / 1000.0f - 1.0f);
  }
  auto w = std::make_unique<Weight>();
  w->shape = s;
  w->blocked = memory(matmul_desc(s, 64).weights_desc(), engine());
  memory plain(memory::desc({s.in, s.out}, Dt::bf16, Tag::ba), engine(), codes.data());
  dnnl::stream stream(engine());
  dnnl::reorder(plain, w->blocked).execute(stream, plain, w->blocked);
  stream.wait();
  return w;
}

std::vector<std::unique_ptr<Weight>> make_set(Shape s, int64_t set_bytes) {
  std::vector<std::unique_ptr<Weight>> set;
  const int64_t bytes = s.out * s.in * 2;
  for (int64_t i = 0; i < (set_bytes + bytes - 1) / bytes; ++i)
    set.push_back(make_weight(s, 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i)));
  return set;
}

const std::vector<std::unique_ptr<Weight>>& weights(int which) {
  static std::vector<std::unique_ptr<Weight>> sets[3];
  static const Shape shapes[3] = {{256, 256}, {4096, 256}, {2048, 7168}};
  if (sets[which].empty()) sets[which] = make_set(shapes[which], which == 2 ? int64_t{1} << 30 : 1);
  return sets[which];
}

// Args: tokens, threads, residency (0 L2, 1 L3, 2 DRAM), path (0 small GEMM, 1 oneDNN).
void BM_Bf16FewTokens(benchmark::State& state) {
  const int64_t tokens = state.range(0);
  const dz::ExecContext ctx{static_cast<int>(state.range(1))};
  const auto& set = weights(static_cast<int>(state.range(2)));
  const bool onednn = state.range(3) != 0;
  if (!onednn && !dz::kernels::gemm_small_bf16_takes(tokens)) {
    state.SkipWithError("the panel GEMM does not take this many tokens on this CPU");
    return;
  }
  const Shape s = set[0]->shape;
  omp_set_num_threads(ctx.num_threads);  // before oneDNN creates its primitives
  std::vector<float> x(static_cast<size_t>(tokens * s.in)), y(static_cast<size_t>(tokens * s.out));
  for (size_t e = 0; e < x.size(); ++e) x[e] = static_cast<float>(e % 17) * 0.125f - 1.0f;
  std::vector<uint16_t> x_bf16(x.size());
  std::vector<dz::kernels::Bf16PanelWeight> panels;
  for (const auto& w : set) {
    if (onednn) {
      w->matmuls.try_emplace({tokens, ctx.num_threads}, matmul_desc(s, tokens));
    } else {
      const auto view = dz::kernels::bf16_panel_weight(w->blocked.get_desc(),
                                                       w->blocked.get_data_handle(), s.in, s.out);
      if (!view) {
        state.SkipWithError("oneDNN chose another layout");
        return;
      }
      panels.push_back(*view);
    }
  }
  dnnl::stream stream(engine());
  memory x_mem(memory::desc({tokens, s.in}, Dt::bf16, Tag::ab), engine(), x_bf16.data());
  memory y_mem(memory::desc({tokens, s.out}, Dt::f32, Tag::ab), engine(), y.data());
  size_t next = 0;
  for (auto _ : state) {
    if (onednn) {
      for (size_t e = 0; e < x.size(); ++e) x_bf16[e] = dz::formats::encode_bf16(x[e]);
      Weight& w = *set[next];
      w.matmuls.at({tokens, ctx.num_threads})
          .execute(stream,
                   {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w.blocked}, {DNNL_ARG_DST, y_mem}});
      stream.wait();
    } else {
      dz::kernels::gemm_small_bf16(ctx, panels[next], x.data(), tokens, y.data());
    }
    benchmark::DoNotOptimize(y.data());
    next = (next + 1) % set.size();
  }
  const double bytes =
      static_cast<double>(s.out * s.in * 2) * static_cast<double>(state.iterations());
  state.counters["GB/s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  if (state.range(2) == 2) {
    const dz::bench::MachineLimits& m = dz::bench::limits_for_this_run();
    const double dram = ctx.num_threads == 1 ? m.dram_read_gbps_1thread : m.dram_read_gbps;
    state.counters["of_dram"] = benchmark::Counter(bytes / 1e9 / dram, benchmark::Counter::kIsRate);
  }
}

void few_token_args(benchmark::internal::Benchmark* b) {
  for (int residency : {0, 1, 2})
    for (int threads : {1, 2})
      for (int tokens : {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 512})
        for (int onednn : {0, 1}) b->Args({tokens, threads, residency, onednn});
}

BENCHMARK(BM_Bf16FewTokens)->Apply(few_token_args)->UseRealTime()->MinTime(0.05);

}  // namespace

BENCHMARK_MAIN();
