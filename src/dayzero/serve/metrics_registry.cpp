#include "dayzero/serve/metrics_registry.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dayzero/core/check.h"

namespace dz::serve {
namespace {

std::string format_value(double value) {
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (std::isnan(value)) return "NaN";
  return fmt::format("{}", value);
}

void append_labels(std::string& out, const MetricLabels& labels,
                   const std::pair<std::string, std::string>* extra = nullptr) {
  if (labels.empty() && extra == nullptr) return;
  out += '{';
  bool first = true;
  auto add = [&](const std::string& name, const std::string& value) {
    if (!first) out += ',';
    first = false;
    out += name;
    out += "=\"";
    out += escape_label_value(value);
    out += '"';
  };
  for (const auto& [name, value] : labels) add(name, value);
  if (extra) add(extra->first, extra->second);
  out += '}';
}

// HELP text escaping: backslash and newline.
std::string escape_help(std::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

void Counter::advance_to(double total) {
  double current = value_.load(std::memory_order_relaxed);
  while (total > current &&
         !value_.compare_exchange_weak(current, total, std::memory_order_relaxed)) {
  }
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {
  DZ_CHECK(std::is_sorted(upper_bounds_.begin(), upper_bounds_.end()));
  DZ_CHECK(std::adjacent_find(upper_bounds_.begin(), upper_bounds_.end()) == upper_bounds_.end());
}

void Histogram::observe(double value) {
  // Prometheus buckets are `le`: a value equal to a bound belongs to that bound's bucket.
  const size_t bucket = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin());
  std::lock_guard lock(mutex_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot snap;
  snap.upper_bounds = upper_bounds_;
  std::lock_guard lock(mutex_);
  uint64_t running = 0;
  for (uint64_t count : counts_) {
    running += count;
    snap.cumulative_counts.push_back(running);
  }
  snap.sum = sum_;
  return snap;
}

std::vector<double> ttft_buckets_seconds() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> inter_token_buckets_seconds() {
  return {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> request_latency_buckets_seconds() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

std::vector<double> buckets_1_2_5(double max_value) {
  std::vector<double> buckets;
  for (double exponent = 1.0;; exponent *= 10.0) {
    for (double mantissa : {1.0, 2.0, 5.0}) {
      const double value = mantissa * exponent;
      if (value > max_value) return buckets;
      buckets.push_back(value);
    }
  }
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

MetricsRegistry::MetricsRegistry(std::string prefix) : prefix_(std::move(prefix)) {}

MetricsRegistry::Series& MetricsRegistry::series(std::string_view name, std::string_view help,
                                                 Kind kind, std::span<const double> upper_bounds,
                                                 const MetricLabels& labels) {
  std::lock_guard lock(mutex_);
  auto it = families_.find(name);
  if (it == families_.end()) {
    Family family{.kind = kind,
                  .help = std::string(help),
                  .upper_bounds = {upper_bounds.begin(), upper_bounds.end()},
                  .series = {}};
    it = families_.emplace(std::string(name), std::move(family)).first;
  }
  Family& family = it->second;
  DZ_CHECK(family.kind == kind, "metric {} used with two kinds", name);
  DZ_CHECK(std::equal(family.upper_bounds.begin(), family.upper_bounds.end(), upper_bounds.begin(),
                      upper_bounds.end()),
           "histogram {} used with two bucket sets", name);
  for (const std::unique_ptr<Series>& s : family.series)
    if (s->labels == labels) return *s;
  auto s = std::make_unique<Series>();
  s->labels = labels;
  switch (kind) {
    case Kind::kCounter:
      s->counter = std::make_unique<Counter>();
      break;
    case Kind::kGauge:
      s->gauge = std::make_unique<Gauge>();
      break;
    case Kind::kHistogram:
      s->histogram = std::make_unique<Histogram>(family.upper_bounds);
      break;
  }
  family.series.push_back(std::move(s));
  return *family.series.back();
}

Counter& MetricsRegistry::counter(std::string_view name, std::string_view help,
                                  const MetricLabels& labels) {
  return *series(name, help, Kind::kCounter, {}, labels).counter;
}

Gauge& MetricsRegistry::gauge(std::string_view name, std::string_view help,
                              const MetricLabels& labels) {
  return *series(name, help, Kind::kGauge, {}, labels).gauge;
}

Histogram& MetricsRegistry::histogram(std::string_view name, std::string_view help,
                                      std::span<const double> upper_bounds,
                                      const MetricLabels& labels) {
  return *series(name, help, Kind::kHistogram, upper_bounds, labels).histogram;
}

std::string MetricsRegistry::expose() const {
  std::string out;
  std::lock_guard lock(mutex_);
  for (const auto& [short_name, family] : families_) {
    const std::string name = prefix_.empty() ? short_name : prefix_ + ":" + short_name;
    static constexpr const char* kTypes[] = {"counter", "gauge", "histogram"};
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, escape_help(family.help), name,
                       kTypes[static_cast<int>(family.kind)]);
    for (const std::unique_ptr<Series>& s : family.series) {
      if (family.kind != Kind::kHistogram) {
        out += name;
        append_labels(out, s->labels);
        const double value = s->counter ? s->counter->value() : s->gauge->value();
        out += ' ' + format_value(value) + '\n';
        continue;
      }
      const Histogram::Snapshot snap = s->histogram->snapshot();
      for (size_t i = 0; i < snap.cumulative_counts.size(); ++i) {
        const double bound = i < snap.upper_bounds.size() ? snap.upper_bounds[i] : INFINITY;
        const std::pair<std::string, std::string> le{"le", format_value(bound)};
        out += name + "_bucket";
        append_labels(out, s->labels, &le);
        out += fmt::format(" {}\n", snap.cumulative_counts[i]);
      }
      out += name + "_sum";
      append_labels(out, s->labels);
      out += ' ' + format_value(snap.sum) + '\n';
      out += name + "_count";
      append_labels(out, s->labels);
      out += fmt::format(" {}\n", snap.cumulative_counts.back());
    }
  }
  return out;
}

}  // namespace dz::serve
