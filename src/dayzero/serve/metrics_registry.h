#pragma once
// A small Prometheus registry (docs/serving.md §5.9): thread-safe counters, gauges and histograms
// in labelled families, exposed in the text format (version 0.0.4) that vLLM's /metrics speaks.
// Families are created on first use and never removed, so the references handed out stay valid
// for the registry's lifetime; updates take no registry lock.

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dz::serve {

// Label name → value, in the order they are printed.
using MetricLabels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void add(double amount = 1.0) { value_.fetch_add(amount, std::memory_order_relaxed); }
  // Raises the counter to `total` (never lowers it): mirrors a cumulative count kept elsewhere.
  void advance_to(double total);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void set(double value) { value_.store(value, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // upper_bounds: increasing, finite; +Inf is implicit.
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;  // per bound, then one for +Inf (= count)
    double sum = 0.0;
  };
  Snapshot snapshot() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative), last = above every bound
  double sum_ = 0.0;
};

// vLLM's bucket sets (vllm/v1/metrics/loggers.py).
std::vector<double> ttft_buckets_seconds();
std::vector<double> inter_token_buckets_seconds();
std::vector<double> request_latency_buckets_seconds();
// 1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets).
std::vector<double> buckets_1_2_5(double max_value);

class MetricsRegistry {
 public:
  // prefix: the namespace before ':' ("vllm" → vllm:num_requests_running); may be empty.
  explicit MetricsRegistry(std::string prefix);

  // The series `name`{labels} of a family, created on first use. A name used with two kinds, or
  // a histogram with other buckets, is a programming error (DZ_CHECK).
  Counter& counter(std::string_view name, std::string_view help, const MetricLabels& labels = {});
  Gauge& gauge(std::string_view name, std::string_view help, const MetricLabels& labels = {});
  Histogram& histogram(std::string_view name, std::string_view help,
                       std::span<const double> upper_bounds, const MetricLabels& labels = {});

  // Every family in name order, its series in creation order.
  std::string expose() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Series {
    MetricLabels labels;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    Kind kind;
    std::string help;
    std::vector<double> upper_bounds;  // histograms
    std::vector<std::unique_ptr<Series>> series;
  };
  Series& series(std::string_view name, std::string_view help, Kind kind,
                 std::span<const double> upper_bounds, const MetricLabels& labels);

  std::string prefix_;
  mutable std::mutex mutex_;
  std::map<std::string, Family, std::less<>> families_;
};

// Prometheus label-value escaping: backslash, double quote and newline.
std::string escape_label_value(std::string_view value);

}  // namespace dz::serve
