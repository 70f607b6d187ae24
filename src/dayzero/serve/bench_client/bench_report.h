#pragma once
// The output of `dayzero bench serve`: vLLM's result table on stdout and the --save-result JSON
// with vLLM's field names (vllm/benchmarks/serve.py: `completed`, `request_throughput`,
// `mean_ttft_ms`, `p99_ttft_ms`, ...), so files compare with `vllm bench serve` results, plus
// dayzero's additions: failures by HTTP status, the usage/re-tokenized output-count check and the
// server's counter deltas from /metrics.

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "dayzero/serve/bench_client/bench_stats.h"
#include "dayzero/serve/bench_client/bench_types.h"

namespace dz::serve {

struct RunDescription {
  std::string backend;  // "openai" or "openai-chat", as vLLM's --backend
  std::string model_id;
  std::string tokenizer_id;  // empty without a tokenizer
  std::string dataset_name;
  int64_t num_prompts = 0;
  double request_rate = 0;  // may be infinite
  double burstiness = 1;
  int64_t max_concurrency = 0;  // 0: unbounded
  bool has_tokenizer = false;
  std::optional<GoodputSlo> goodput;
};

// The result object written by --save-result. `server_deltas`: counters' change over the run,
// empty when /metrics was unavailable.
nlohmann::json result_json(const RunDescription& run, const BenchMetrics& metrics,
                           std::span<const RequestResult> results, double duration_s,
                           const std::map<std::string, double>& server_deltas);

// vLLM's "Serving Benchmark Result" table, then failures and server deltas.
std::string format_report(const RunDescription& run, const BenchMetrics& metrics,
                          std::span<const RequestResult> results, double duration_s,
                          const std::map<std::string, double>& server_deltas,
                          bool metrics_available);

}  // namespace dz::serve
