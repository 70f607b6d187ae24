#include "dayzero/serve/bench_client/bench_report.h"

#include <chrono>
#include <cmath>
#include <ctime>

#include <fmt/format.h>

namespace dz::serve {
namespace {

struct NamedSummary {
  const char* key;     // "ttft": the JSON field infix
  const char* label;   // "TTFT": the table's name
  const char* header;  // the table's section title
  const LatencySummary* summary;
};

std::vector<NamedSummary> summaries(const BenchMetrics& m) {
  return {{"ttft", "TTFT", "Time to First Token", &m.ttft},
          {"tpot", "TPOT", "Time per Output Token (excl. 1st token)", &m.tpot},
          {"itl", "ITL", "Inter-token Latency", &m.itl},
          {"e2el", "E2EL", "End-to-end Latency", &m.e2el}};
}

// vLLM's percentile key: "99" for 99.0, "99.9" otherwise.
std::string percentile_word(double p) {
  return p == std::floor(p) ? fmt::format("{}", static_cast<int64_t>(p)) : fmt::format("{}", p);
}

// The server counters the report names, as vLLM spells them, with dayzero's additions.
struct ServerCounter {
  const char* name;
  const char* label;
};
constexpr ServerCounter kServerCounters[] = {
    {"vllm:prompt_tokens_total", "Prompt tokens (server):"},
    {"vllm:generation_tokens_total", "Generation tokens (server):"},
    {"vllm:prefix_cache_queries_total", "Prefix cache queries (tokens):"},
    {"vllm:prefix_cache_hits_total", "Prefix cache hits (tokens):"},
    {"vllm:num_preemptions_total", "Preemptions:"},
    {"vllm:requests_rejected_total", "Requests rejected:"},
    {"vllm:requests_cancelled_total", "Requests cancelled:"},
};

std::map<int, int64_t> failures_by_status(std::span<const RequestResult> results) {
  std::map<int, int64_t> by_status;
  for (const RequestResult& r : results)
    if (!r.success) ++by_status[r.http_status];
  return by_status;
}

std::string now_string() {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d-%H%M%S", &tm);
  return buffer;
}

}  // namespace

nlohmann::json result_json(const RunDescription& run, const BenchMetrics& m,
                           std::span<const RequestResult> results, double duration_s,
                           const std::map<std::string, double>& server_deltas) {
  nlohmann::json j;
  j["date"] = now_string();
  j["backend"] = run.backend;
  j["model_id"] = run.model_id;
  j["tokenizer_id"] = run.tokenizer_id;
  j["dataset_name"] = run.dataset_name;
  j["num_prompts"] = run.num_prompts;
  // vLLM writes an infinite rate as the string "inf".
  j["request_rate"] =
      std::isinf(run.request_rate) ? nlohmann::json("inf") : nlohmann::json(run.request_rate);
  j["burstiness"] = run.burstiness;
  j["max_concurrency"] = run.max_concurrency > 0 ? nlohmann::json(run.max_concurrency) : nullptr;
  j["duration"] = duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = run.goodput ? nlohmann::json(m.request_goodput) : nullptr;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  nlohmann::json input_lens = nlohmann::json::array(), ttfts = nlohmann::json::array(),
                 itls = nlohmann::json::array(), latencies = nlohmann::json::array(),
                 start_times = nlohmann::json::array(), queue_times = nlohmann::json::array(),
                 texts = nlohmann::json::array(), errors = nlohmann::json::array();
  int64_t cached_tokens = 0;
  for (const RequestResult& r : results) {
    input_lens.push_back(r.prompt_len);
    ttfts.push_back(r.ttft_s);
    itls.push_back(r.itl_s);
    latencies.push_back(r.latency_s);
    start_times.push_back(r.start_s);
    queue_times.push_back(r.queue_s);
    texts.push_back(r.generated_text);
    errors.push_back(r.error);
    if (r.success && r.cached_tokens > 0) cached_tokens += r.cached_tokens;
  }
  j["input_lens"] = std::move(input_lens);
  j["output_lens"] = m.output_lens;
  j["ttfts"] = std::move(ttfts);
  j["itls"] = std::move(itls);
  j["latencies"] = std::move(latencies);
  j["start_times"] = std::move(start_times);
  j["queue_times"] = std::move(queue_times);
  j["generated_texts"] = std::move(texts);
  j["errors"] = std::move(errors);
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  for (const NamedSummary& s : summaries(m)) {
    j[fmt::format("mean_{}_ms", s.key)] = s.summary->mean_ms;
    j[fmt::format("median_{}_ms", s.key)] = s.summary->median_ms;
    j[fmt::format("std_{}_ms", s.key)] = s.summary->std_ms;
    for (const auto& [p, value] : s.summary->percentiles_ms)
      j[fmt::format("p{}_{}_ms", percentile_word(p), s.key)] = value;
  }
  // dayzero's additions, not in vLLM's files.
  nlohmann::json by_status = nlohmann::json::object();
  for (const auto& [status, count] : failures_by_status(results))
    by_status[std::to_string(status)] = count;
  j["failed_by_http_status"] = std::move(by_status);  // "0": no HTTP response
  j["output_token_count_mismatches"] = m.output_count_mismatches;
  j["total_cached_prompt_tokens"] = cached_tokens;
  j["server_metrics_delta"] = server_deltas;
  return j;
}

std::string format_report(const RunDescription& run, const BenchMetrics& m,
                          std::span<const RequestResult> results, double duration_s,
                          const std::map<std::string, double>& server_deltas,
                          bool metrics_available) {
  std::string out;
  auto line = [&](std::string_view label, auto value) {
    out += fmt::format("{:<40} {:<10}\n", label, value);
  };
  auto line2 = [&](std::string_view label, double value) {
    out += fmt::format("{:<40} {:<10.2f}\n", label, value);
  };
  out += fmt::format("{:=^50}\n", " Serving Benchmark Result ");
  line("Successful requests:", m.completed);
  line("Failed requests:", m.failed);
  if (run.max_concurrency > 0) line("Maximum request concurrency:", run.max_concurrency);
  if (!std::isinf(run.request_rate)) line2("Request rate configured (RPS):", run.request_rate);
  line2("Benchmark duration (s):", duration_s);
  line("Total input tokens:", m.total_input);
  line("Total generated tokens:", m.total_output);
  line2("Request throughput (req/s):", m.request_throughput);
  if (run.goodput) line2("Request goodput (req/s):", m.request_goodput);
  line2("Output token throughput (tok/s):", m.output_throughput);
  line2("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  line("Peak concurrent requests:", m.max_concurrent_requests);
  line2("Total token throughput (tok/s):", m.total_token_throughput);
  for (const NamedSummary& s : summaries(m)) {
    out += fmt::format("{:-^50}\n", s.header);
    line2(fmt::format("Mean {} (ms):", s.label), s.summary->mean_ms);
    line2(fmt::format("Median {} (ms):", s.label), s.summary->median_ms);
    line2(fmt::format("Std {} (ms):", s.label), s.summary->std_ms);
    for (const auto& [p, value] : s.summary->percentiles_ms)
      line2(fmt::format("P{} {} (ms):", percentile_word(p), s.label), value);
  }
  if (run.has_tokenizer) line("Usage vs re-tokenized count mismatches:", m.output_count_mismatches);
  out += fmt::format("{:-^50}\n", "Server counters over the run (/metrics)");
  if (!metrics_available) {
    out += "(GET /metrics unavailable)\n";
  } else {
    for (const ServerCounter& c : kServerCounters) {
      auto it = server_deltas.find(c.name);
      line2(c.label, it == server_deltas.end() ? 0.0 : it->second);
    }
    auto queries = server_deltas.find("vllm:prefix_cache_queries_total");
    auto hits = server_deltas.find("vllm:prefix_cache_hits_total");
    if (queries != server_deltas.end() && queries->second > 0)
      line2("Prefix cache hit rate (%):",
            100.0 * (hits == server_deltas.end() ? 0.0 : hits->second) / queries->second);
  }
  if (m.failed > 0) {
    out += fmt::format("{:-^50}\n", "Failures");
    for (const auto& [status, count] : failures_by_status(results))
      line(status == 0 ? std::string("No HTTP response:") : fmt::format("HTTP {}:", status), count);
    int shown = 0;
    for (const RequestResult& r : results) {
      if (r.success || shown == 5) continue;
      out += fmt::format("error {}: {}\n", shown++, r.error.substr(0, 300));
    }
  }
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace dz::serve
