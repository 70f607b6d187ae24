#pragma once
// The server's Prometheus series (docs/serving.md §5.9), named as vLLM's so its dashboards work:
// engine gauges and counters mirrored from EngineMetrics at scrape time, per-request latencies
// and token counts observed by the handlers, and dayzero's rejection and cancellation counters.
// Queue, prefill and decode times split each request at the engine's first-scheduled time
// (RequestOutput::first_scheduled) and its first token, as vLLM's do.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "dayzero/runtime/engine_types.h"
#include "dayzero/serve/metrics_registry.h"

namespace dz::serve::http {

using Clock = std::chrono::steady_clock;

// One request (one choice) as the frontend saw it.
class RequestTimer {
 public:
  explicit RequestTimer(Clock::time_point arrival) : arrival_(arrival), last_token_(arrival) {}
  Clock::time_point arrival() const { return arrival_; }

 private:
  friend class ServerMetrics;
  Clock::time_point arrival_;
  Clock::time_point last_token_;
  Clock::time_point first_token_;
  std::optional<Clock::time_point> first_scheduled_;
  bool first_token_seen_ = false;
};

class ServerMetrics {
 public:
  ServerMetrics(std::string prefix, std::string model_name, int64_t max_model_len);

  // Mirrors the engine's gauges and cumulative counters (called at scrape time).
  void update_engine(const runtime::EngineMetrics& metrics);
  // An output of a request arrived: TTFT on its first tokens, inter-token latency after.
  void on_output(RequestTimer& timer, const runtime::RequestOutput& output, Clock::time_point now);
  // A request finished normally ("stop" / "length") or was aborted ("abort").
  void on_finished(const RequestTimer& timer, const runtime::RequestOutput& last,
                   std::string_view finished_reason, Clock::time_point now);
  // reason: "queue_full", "invalid_request", "unauthorized", "too_large", "context_length"...
  void on_rejected(std::string_view reason);
  void on_cancelled();
  // Generation requests between submit and their response's end (a graceful drain waits for 0).
  void on_run_opened() { open_runs_.fetch_add(1); }
  void on_run_closed() { open_runs_.fetch_sub(1); }
  int64_t open_runs() const { return open_runs_.load(); }

  // Retry-After for a full queue: ceil(waiting / completions per second over the last minute),
  // clamped to [1, 60] s (docs/serving.md §2.3).
  int retry_after_seconds(int64_t num_waiting);

  std::string expose() const { return registry_.expose(); }

 private:
  MetricLabels labels(std::string_view name = {}, std::string_view value = {}) const;
  void note_completion(Clock::time_point now);
  // phase: 0 queue, 1 prefill, 2 decode (kPhaseHistograms).
  void observe_phase(size_t phase, Clock::time_point from, Clock::time_point to);

  MetricsRegistry registry_;
  std::string model_name_;
  std::vector<double> token_buckets_;
  Clock::time_point start_;
  std::atomic<int64_t> open_runs_{0};
  std::mutex completions_mutex_;
  std::deque<Clock::time_point> recent_completions_;
};

}  // namespace dz::serve::http
