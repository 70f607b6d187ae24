#include "dayzero/serve/metrics_registry.h"

#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace dz::serve {
namespace metrics_registry_test {

TEST(MetricsRegistry, CountersAndGaugesExposeWithHelpTypeAndLabels) {
  MetricsRegistry registry("vllm");
  registry.gauge("num_requests_running", "Running requests.", {{"model_name", "tiny"}}).set(3);
  Counter& stop = registry.counter("request_success_total", "Finished requests.",
                                   {{"model_name", "tiny"}, {"finished_reason", "stop"}});
  stop.add();
  stop.add(2);
  EXPECT_EQ(stop.value(), 3.0);
  // The same name and labels give the same series.
  EXPECT_EQ(&stop, &registry.counter("request_success_total", "Finished requests.",
                                     {{"model_name", "tiny"}, {"finished_reason", "stop"}}));
  EXPECT_EQ(registry.expose(),
            "# HELP vllm:num_requests_running Running requests.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running{model_name=\"tiny\"} 3\n"
            "# HELP vllm:request_success_total Finished requests.\n"
            "# TYPE vllm:request_success_total counter\n"
            "vllm:request_success_total{model_name=\"tiny\",finished_reason=\"stop\"} 3\n");
}

TEST(MetricsRegistry, EmptyPrefixAndUnlabelledSeries) {
  MetricsRegistry registry("");
  registry.gauge("kv_cache_usage_perc", "Usage.").set(0.25);
  EXPECT_EQ(registry.expose(),
            "# HELP kv_cache_usage_perc Usage.\n# TYPE kv_cache_usage_perc gauge\n"
            "kv_cache_usage_perc 0.25\n");
}

TEST(MetricsRegistry, HistogramBucketsAreCumulativeWithBoundsInclusive) {
  MetricsRegistry registry("dz");
  const std::vector<double> bounds = {0.5, 1.0, 2.0};
  Histogram& h = registry.histogram("latency_seconds", "Latency.", bounds, {{"model_name", "m"}});
  for (double v : {0.1, 0.5, 0.75, 2.0, 7.0}) h.observe(v);
  EXPECT_EQ(registry.expose(),
            "# HELP dz:latency_seconds Latency.\n# TYPE dz:latency_seconds histogram\n"
            "dz:latency_seconds_bucket{model_name=\"m\",le=\"0.5\"} 2\n"
            "dz:latency_seconds_bucket{model_name=\"m\",le=\"1\"} 3\n"
            "dz:latency_seconds_bucket{model_name=\"m\",le=\"2\"} 4\n"
            "dz:latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 5\n"
            "dz:latency_seconds_sum{model_name=\"m\"} 10.35\n"
            "dz:latency_seconds_count{model_name=\"m\"} 5\n");
}

TEST(MetricsRegistry, HistogramMatchesAScalarCountOnRandomValues) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> dist(0.0, 3.0);
  const std::vector<double> bounds = ttft_buckets_seconds();
  Histogram h(bounds);
  std::vector<double> values(1000);
  for (double& v : values) {
    v = dist(rng);
    h.observe(v);
  }
  const Histogram::Snapshot snap = h.snapshot();
  ASSERT_EQ(snap.cumulative_counts.size(), bounds.size() + 1);
  double sum = 0;
  for (double v : values) sum += v;
  EXPECT_NEAR(snap.sum, sum, 1e-9 * sum);
  for (size_t i = 0; i < bounds.size(); ++i) {
    uint64_t expected = 0;
    for (double v : values) expected += v <= bounds[i] ? 1 : 0;
    EXPECT_EQ(snap.cumulative_counts[i], expected) << "le " << bounds[i];
  }
  EXPECT_EQ(snap.cumulative_counts.back(), values.size());
}

TEST(MetricsRegistry, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry registry("vllm");
  Counter& counter = registry.counter("generation_tokens_total", "Tokens.");
  Histogram& hist =
      registry.histogram("e2e_request_latency_seconds", "E2E.", request_latency_buckets_seconds());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        counter.add();
        hist.observe(1.0);
      }
    });
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(counter.value(), 40000.0);
  EXPECT_EQ(hist.snapshot().cumulative_counts.back(), 40000u);
}

TEST(MetricsRegistry, AdvanceToNeverLowersACounter) {
  Counter counter;
  counter.advance_to(5);
  counter.advance_to(3);
  EXPECT_EQ(counter.value(), 5.0);
  counter.advance_to(9);
  EXPECT_EQ(counter.value(), 9.0);
}

TEST(MetricsRegistry, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  MetricsRegistry registry("vllm");
  registry.counter("requests_rejected_total", "Rejected.", {{"reason", "x\"y"}}).add();
  EXPECT_NE(registry.expose().find("{reason=\"x\\\"y\"} 1\n"), std::string::npos);
}

TEST(MetricsRegistry, Buckets125StopAtTheMaximum) {
  EXPECT_EQ(buckets_1_2_5(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(buckets_1_2_5(4096),
            (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}));
}

TEST(MetricsRegistryDeathTest, OneNameWithTwoKindsIsAProgrammingError) {
  MetricsRegistry registry("vllm");
  registry.counter("x_total", "X.");
  EXPECT_DEATH(registry.gauge("x_total", "X."), "used with two kinds");
}

}  // namespace metrics_registry_test
}  // namespace dz::serve
