#include "dayzero/serve/bench_client/prometheus_text.h"

#include <cmath>

#include <gtest/gtest.h>

namespace dz::serve {
namespace prometheus_text_test {

TEST(PrometheusText, SumsOverLabelSets) {
  const char* text =
      "# HELP vllm:prefix_cache_hits_total Prefix cache hits.\n"
      "# TYPE vllm:prefix_cache_hits_total counter\n"
      "vllm:prefix_cache_hits_total{model_name=\"tiny\"} 48\n"
      "vllm:requests_rejected_total{model_name=\"a b}\",reason=\"queue_full\"} 2\n"
      "vllm:requests_rejected_total{model_name=\"x\\\"y\",reason=\"too_long\"} 3 1700000000\r\n"
      "vllm:num_requests_running 4\n"
      "   \n"
      "vllm:kv_cache_usage_perc{model_name=\"tiny\"} NaN\n"
      "broken{unterminated=\"x 1\n"
      "novalue\n"
      "vllm:e2e_request_latency_seconds_bucket{le=\"+Inf\"} 7\n";
  auto sums = parse_prometheus_sums(text);
  EXPECT_EQ(sums.at("vllm:prefix_cache_hits_total"), 48.0);
  EXPECT_EQ(sums.at("vllm:requests_rejected_total"), 5.0);
  EXPECT_EQ(sums.at("vllm:num_requests_running"), 4.0);
  EXPECT_TRUE(std::isnan(sums.at("vllm:kv_cache_usage_perc")));
  EXPECT_EQ(sums.at("vllm:e2e_request_latency_seconds_bucket"), 7.0);
  EXPECT_EQ(sums.count("broken"), 0u);
  EXPECT_EQ(sums.count("novalue"), 0u);
}

TEST(PrometheusText, CounterDeltas) {
  std::map<std::string, double> before = {{"a_total", 3}, {"b_total", 5}, {"gauge", 1}};
  std::map<std::string, double> after = {
      {"a_total", 10}, {"b_total", 5}, {"c_total", 2}, {"gauge", 9}};
  auto d = counter_deltas(before, after);
  EXPECT_EQ(d, (std::map<std::string, double>{{"a_total", 7}, {"c_total", 2}}));
}

}  // namespace prometheus_text_test
}  // namespace dz::serve
