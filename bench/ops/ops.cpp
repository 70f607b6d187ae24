#include "ops.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "dayzero/core/check.h"

namespace dz::bench::ops {
namespace {

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of the whole process, all threads: on a shared machine this is the time the kernel
// ran while it had a core; wall time also counts the wait for one.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

const char* limit_kind_name(LimitKind kind) {
  switch (kind) {
    case LimitKind::kDram:
      return "dram";
    case LimitKind::kGemmF32:
      return "gemm_f32";
    case LimitKind::kGemmBf16:
      return "gemm_bf16";
  }
  return "?";
}

double limit_value(const MachineLimits& limits, LimitKind kind) {
  switch (kind) {
    case LimitKind::kDram:
      return limits.num_threads == 1 ? limits.dram_read_gbps_1thread : limits.dram_read_gbps;
    case LimitKind::kGemmF32:
      return limits.gemm_f32_gflops;
    case LimitKind::kGemmBf16:
      return limits.gemm_bf16_gflops;
  }
  return 0;
}

std::vector<float> random_activations(size_t count, uint64_t seed, float scale) {
  std::vector<float> out(count);
  uint64_t state = seed | 1;
  for (float& v : out) {
    uint32_t bits = 0;
    const float f = random_unit(state) * scale;
    std::memcpy(&bits, &f, sizeof bits);
    bits &= 0xFFFF0000u;
    std::memcpy(&v, &bits, sizeof v);
  }
  return out;
}

void all_cases(bool quick, std::vector<OpCase>& cases, std::vector<RatioSpec>& ratios) {
  add_linear_cases(quick, cases, ratios);
  add_attention_cases(quick, cases, ratios);
  add_kda_moe_cases(quick, cases, ratios);
}

CaseResult run_case(const OpCase& op, const OpsOptions& options, const MachineLimits& limits,
                    Fixtures& fixtures) {
  PreparedCase prepared = op.setup(options, fixtures);
  DZ_CHECK(prepared.bytes > 0 && prepared.flops > 0, "case {}: bytes and FLOPs must be counted",
           op.name);

  // The warm-up call also sizes the batches.
  double start = wall_seconds();
  prepared.body();
  const double first = std::max(wall_seconds() - start, 1e-7);
  const double batch_target = options.min_seconds / 4;
  const auto per_batch = static_cast<int64_t>(
      std::clamp(std::ceil(batch_target / first), 1.0, static_cast<double>(1 << 20)));

  CaseResult r{.name = op.name, .shape = op.shape, .limit = op.limit};
  double timed = 0, best = 1e300;
  for (int batches = 0; batches < 2 || timed < options.min_seconds; ++batches) {
    start = wall_seconds();
    const double cpu_start = cpu_seconds();
    for (int64_t c = 0; c < per_batch; ++c) prepared.body();
    const double wall = wall_seconds() - start, cpu = cpu_seconds() - cpu_start;
    const auto calls = static_cast<double>(per_batch);
    const double per_call = (options.cpu_clock ? cpu / options.num_threads : wall) / calls;
    if (per_call < best) {
      best = per_call;
      r.wall_ms = wall / calls * 1e3;
      r.cpu_ms = cpu / calls * 1e3;
    }
    timed += wall;
    r.calls += per_batch;
  }
  r.ms = best * 1e3;
  r.bytes = prepared.bytes;
  r.flops = prepared.flops;
  r.gbps = prepared.bytes / best / 1e9;
  r.gflops = prepared.flops / best / 1e9;
  r.limit_value = limit_value(limits, op.limit);
  r.fraction = (op.limit == LimitKind::kDram ? r.gbps : r.gflops) / r.limit_value;
  return r;
}

std::vector<RatioResult> compute_ratios(const std::vector<RatioSpec>& specs,
                                        const std::vector<CaseResult>& results) {
  std::vector<RatioResult> out;
  auto find = [&](const std::string& name) -> const CaseResult* {
    for (const CaseResult& r : results)
      if (r.name == name) return &r;
    return nullptr;
  };
  for (const RatioSpec& spec : specs) {
    const CaseResult* slow = find(spec.slow_case);
    const CaseResult* fast = find(spec.fast_case);
    if (slow && fast) out.push_back({spec, slow->ms / fast->ms});
  }
  return out;
}

MachineLimits measure_limits_for_ops(const OpsOptions& options) {
  LimitsOptions limits;
  limits.num_threads = options.num_threads;
  limits.min_seconds = 0.5;
  limits.cpu_clock = options.cpu_clock;  // the same clock as the cases
  if (options.quick) {
    // Enough to exercise the code path in a test; the figures are not the machine's.
    limits.dram_bytes = 16LL << 20;
    limits.gemm_m = 64;
    limits.gemm_n = 256;
    limits.gemm_k = 256;
    limits.min_seconds = 0.01;
  }
  return measure_limits(limits);
}

}  // namespace dz::bench::ops
