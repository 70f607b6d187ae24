#pragma once
// The metrics of `vllm bench serve` (vllm-project/vllm: vllm/benchmarks/serve.py,
// calculate_metrics), computed from the per-request results of a run. Latencies are summarised
// as numpy would: mean, median, population std (ddof 0) and percentiles with linear
// interpolation; an empty list summarises as zeros (vLLM's `np.mean(x or 0)`).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dayzero/serve/bench_client/bench_types.h"

namespace dz::serve {

// numpy.percentile(values, p) with the default linear method; p in [0, 100]. Empty → 0.
double percentile(std::span<const double> values, double p);

struct LatencySummary {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

// `values_s` in seconds; the summary in milliseconds.
LatencySummary summarize(std::span<const double> values_s, std::span<const double> percentiles);

// --goodput ttft:MS tpot:MS e2el:MS: a request is good when it meets every SLO given.
struct GoodputSlo {
  std::optional<double> ttft_ms;
  std::optional<double> tpot_ms;
  std::optional<double> e2el_ms;
  bool any() const { return ttft_ms || tpot_ms || e2el_ms; }
};

struct BenchMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  int64_t total_input = 0;
  int64_t total_output = 0;
  double request_throughput = 0;
  double request_goodput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  LatencySummary ttft;
  LatencySummary tpot;  // per request (E2EL − TTFT) / (output − 1), requests with output > 1
  LatencySummary itl;   // every gap of every successful request
  LatencySummary e2el;
  double max_output_tokens_per_s = 0;   // busiest whole second, counting chunks as vLLM does
  int64_t max_concurrent_requests = 0;  // peak of overlapping [start, start + E2EL)
  std::vector<int64_t> output_lens;     // per request, 0 for failures (vLLM's actual_output_lens)
  int64_t output_count_mismatches = 0;  // usage.completion_tokens != re-tokenized count
};

BenchMetrics compute_metrics(std::span<const RequestResult> results, double duration_s,
                             const GoodputSlo& slo, std::span<const double> percentiles);

}  // namespace dz::serve
