#pragma once
// `dayzero bench ops` (issue 8): every operator benchmark in one process, each case judged against
// the limit of this machine that bounds it, measured in the same run (machine_limits.h). A case has
// a name, fresh random inputs built by its setup, a timed body, and the bytes and FLOPs of one call
// counted from the formulas (not from counters): decode-shaped cases (GEMV, one-token MoE, the
// absorbed projections) are judged by bytes per second against the DRAM read bandwidth at the
// thread count used, many-token and compute-bound cases by FLOP/s against the FP32 or BF16 GEMM
// peak. Bandwidth cases rotate through a >= 1 GiB set of weights, well over the 480 MiB L3.
//
// The cases live in ops_linear.cpp, ops_attention.cpp and ops_kda_moe.cpp; ops.cpp times them.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "machine_limits.h"

namespace dz::bench::ops {

enum class LimitKind { kDram, kGemmF32, kGemmBf16 };
const char* limit_kind_name(LimitKind kind);                      // "dram", "gemm_f32", "gemm_bf16"
double limit_value(const MachineLimits& limits, LimitKind kind);  // GB/s or GFLOP/s

struct OpsOptions {
  int num_threads = 1;       // resolved (never 0)
  double min_seconds = 0.5;  // timed per case (after one warm-up call)
  bool quick = false;        // tiny shapes, for tests: the figures mean nothing
  bool cpu_clock = false;    // time by process CPU seconds / num_threads instead of wall time
};

// Objects the cases of one group share (a rotating weight set, a cache pool); built on first use,
// dropped when the runner moves to another group, so at most one group's memory is held.
class Fixtures {
 public:
  template <typename T, typename Make>
  T& get(const std::string& key, Make&& make) {
    auto it = items_.find(key);
    if (it == items_.end())
      it = items_.emplace(key, std::shared_ptr<void>(std::make_shared<T>(make()))).first;
    return *static_cast<T*>(it->second.get());
  }
  void clear() { items_.clear(); }

 private:
  std::map<std::string, std::shared_ptr<void>> items_;
};

// What a case's setup returns: the body to time and the work of one call.
struct PreparedCase {
  std::function<void()> body;
  double bytes = 0;  // bytes one call must move from memory: weights / cache read, activations
  double flops = 0;  // counted from the formula, FMA = 2
};

struct OpCase {
  std::string name;   // e.g. "linear.fp8.gemv.t1"; shapes are part of it
  std::string shape;  // one line for humans
  std::string group;  // cases of one group share Fixtures
  LimitKind limit = LimitKind::kDram;
  std::function<PreparedCase(const OpsOptions&, Fixtures&)> setup;
};

// A derived figure: time(slow) / time(fast), e.g. dense MLA decode over sparse at 128K keys.
struct RatioSpec {
  std::string name;
  std::string slow_case;  // numerator (its time)
  std::string fast_case;  // denominator
  double target = 0;      // 0: none stated
};

struct CaseResult {
  std::string name, shape;
  LimitKind limit = LimitKind::kDram;
  double ms = 0;       // best batch, time per call (wall, or CPU / threads with cpu_clock)
  double wall_ms = 0;  // the same batch by wall time
  double cpu_ms = 0;   // the same batch by process CPU time (all threads)
  int64_t calls = 0;   // timed calls, all batches
  double bytes = 0, flops = 0;
  double gbps = 0, gflops = 0;
  double limit_value = 0;  // GB/s or GFLOP/s of the limit it is judged against
  double fraction = 0;     // gbps or gflops / limit_value
};

struct RatioResult {
  RatioSpec spec;
  double value = 0;
};

// Every case at the production shapes, or the tiny ones (quick), in run order (grouped).
void all_cases(bool quick, std::vector<OpCase>& cases, std::vector<RatioSpec>& ratios);

// Per-family registration (one file each).
void add_linear_cases(bool quick, std::vector<OpCase>& cases, std::vector<RatioSpec>& ratios);
void add_attention_cases(bool quick, std::vector<OpCase>& cases, std::vector<RatioSpec>& ratios);
void add_kda_moe_cases(bool quick, std::vector<OpCase>& cases, std::vector<RatioSpec>& ratios);

// Sets up, warms up and times one case: batches of calls, each about min_seconds / 4, until
// min_seconds have been timed and at least two batches ran; the best batch counts (the machine is
// shared, the least disturbed batch is the kernel's speed).
CaseResult run_case(const OpCase& op, const OpsOptions& options, const MachineLimits& limits,
                    Fixtures& fixtures);

// The ratios whose two cases both ran.
std::vector<RatioResult> compute_ratios(const std::vector<RatioSpec>& specs,
                                        const std::vector<CaseResult>& results);

// The limits for this run: 2 GiB / 0.5 s per figure, or a tiny buffer and GEMM when quick.
MachineLimits measure_limits_for_ops(const OpsOptions& options);

// xorshift64: fast fresh random inputs for GiB-sized weight sets.
inline uint64_t next_random(uint64_t& state) {
  state ^= state << 13, state ^= state >> 7, state ^= state << 17;
  return state;
}
// A random float in [-1, 1), never exactly 0 (zeros could take fast paths and flatter a figure).
inline float random_unit(uint64_t& state) {
  const auto r = static_cast<int32_t>(next_random(state) >> 40) - (1 << 23);
  return (static_cast<float>(r) + 0.5f) * (1.0f / (1 << 23));
}
// BF16-valued (truncated) random floats in [-scale, scale): activations as the models store them.
std::vector<float> random_activations(size_t count, uint64_t seed, float scale = 1.0f);

}  // namespace dz::bench::ops
