#include "dayzero/serve/bench_client/bench_stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <utility>

namespace dz::serve {

double percentile(std::span<const double> values, double p) {
  if (values.empty()) return 0.0;
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  // numpy's "linear" method: the virtual index (n − 1)·p/100, interpolated between neighbours.
  double index = static_cast<double>(sorted.size() - 1) * p / 100.0;
  size_t lo = static_cast<size_t>(std::floor(index));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  double frac = index - static_cast<double>(lo);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * frac;
}

LatencySummary summarize(std::span<const double> values_s, std::span<const double> percentiles) {
  LatencySummary s;
  if (!values_s.empty()) {
    double n = static_cast<double>(values_s.size());
    double mean = std::accumulate(values_s.begin(), values_s.end(), 0.0) / n;
    double sq = 0;
    for (double v : values_s) sq += (v - mean) * (v - mean);
    s.mean_ms = mean * 1000.0;
    s.std_ms = std::sqrt(sq / n) * 1000.0;
    s.median_ms = percentile(values_s, 50.0) * 1000.0;
  }
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile(values_s, p) * 1000.0);
  return s;
}

BenchMetrics compute_metrics(std::span<const RequestResult> results, double duration_s,
                             const GoodputSlo& slo, std::span<const double> percentiles) {
  BenchMetrics m;
  std::vector<double> ttfts, tpots, itls, e2els;
  int64_t good = 0;
  double min_start = 0, max_end = 0;
  for (const RequestResult& r : results) {
    if (!r.success) {
      ++m.failed;
      m.output_lens.push_back(0);
      continue;
    }
    int64_t out = output_tokens(r);
    m.output_lens.push_back(out);
    if (r.usage_output_tokens >= 0 && r.retokenized_tokens >= 0 &&
        r.usage_output_tokens != r.retokenized_tokens)
      ++m.output_count_mismatches;
    m.total_input += r.prompt_len;
    m.total_output += out;
    double tpot = 0;  // vLLM counts a single-token request as TPOT 0 for goodput only
    if (out > 1) {
      tpot = (r.latency_s - r.ttft_s) / static_cast<double>(out - 1);
      tpots.push_back(tpot);
    }
    itls.insert(itls.end(), r.itl_s.begin(), r.itl_s.end());
    ttfts.push_back(r.ttft_s);
    e2els.push_back(r.latency_s);
    if (slo.any()) {
      // vLLM: good when every SLO ≥ the request's value.
      bool ok = (!slo.ttft_ms || *slo.ttft_ms / 1000.0 >= r.ttft_s) &&
                (!slo.tpot_ms || *slo.tpot_ms / 1000.0 >= tpot) &&
                (!slo.e2el_ms || *slo.e2el_ms / 1000.0 >= r.latency_s);
      if (ok) ++good;
    }
    if (m.completed == 0 || r.start_s < min_start) min_start = r.start_s;
    if (m.completed == 0 || r.start_s + r.latency_s > max_end) max_end = r.start_s + r.latency_s;
    ++m.completed;
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.request_goodput = static_cast<double>(good) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  }
  m.ttft = summarize(ttfts, percentiles);
  m.tpot = summarize(tpots, percentiles);
  m.itl = summarize(itls, percentiles);
  m.e2el = summarize(e2els, percentiles);

  if (m.completed > 0) {
    // Chunks per whole second from the first start (vLLM's tokens_per_second buckets), and the
    // peak overlap of half-open [start, end) intervals, departures sorted before arrivals.
    size_t num_buckets = static_cast<size_t>(std::ceil(max_end - min_start)) + 1;
    std::vector<double> per_second(num_buckets, 0.0);
    std::vector<std::pair<double, int>> events;
    for (const RequestResult& r : results) {
      if (!r.success) continue;
      double t = r.start_s + r.ttft_s;
      auto count = [&](double at) {
        double bucket = std::floor(at - min_start);
        if (bucket >= 0 && bucket < static_cast<double>(num_buckets))
          per_second[static_cast<size_t>(bucket)] += 1;
      };
      count(t);
      for (double gap : r.itl_s) count(t += gap);
      events.emplace_back(r.start_s, 1);
      events.emplace_back(r.start_s + r.latency_s, -1);
    }
    m.max_output_tokens_per_s = *std::max_element(per_second.begin(), per_second.end());
    std::sort(events.begin(), events.end());
    int64_t now = 0;
    for (const auto& [time, delta] : events) {
      now += delta;
      m.max_concurrent_requests = std::max(m.max_concurrent_requests, now);
    }
  }
  return m;
}

}  // namespace dz::serve
