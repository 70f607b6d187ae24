#pragma once
// Reads the server's GET /metrics (Prometheus text exposition format) so a benchmark can report
// what the server counted during the run: prefix-cache queries and hits, preemptions, refusals.

#include <map>
#include <string>
#include <string_view>

namespace dz::serve {

// Metric name (labels dropped) → the sum of its samples over every label set. Comment lines and
// lines that do not parse are skipped. Histogram series keep their _bucket/_sum/_count names.
std::map<std::string, double> parse_prometheus_sums(std::string_view text);

// after − before for every series in `after` whose name ends in "_total" (counters) and moved.
std::map<std::string, double> counter_deltas(const std::map<std::string, double>& before,
                                             const std::map<std::string, double>& after);

}  // namespace dz::serve
