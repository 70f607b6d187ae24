#include "dayzero/serve/bench_client/bench_stats.h"

#include <algorithm>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace dz::serve {
namespace bench_stats_test {

TEST(Percentile, MatchesNumpyLinear) {
  // numpy.percentile(v, p) with numpy 1.x on Debian's python3 (values printed with repr).
  const std::vector<double> v = {0.31, 0.07, 0.52, 0.18, 0.95, 0.44, 0.29};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 0.07);
  EXPECT_NEAR(percentile(v, 25), 0.235, 1e-15);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 0.31);
  EXPECT_NEAR(percentile(v, 90), 0.6920000000000002, 1e-15);
  EXPECT_NEAR(percentile(v, 99), 0.9241999999999997, 1e-15);
  EXPECT_NEAR(percentile(v, 99.9), 0.9474200000000003, 1e-15);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 0.95);
  EXPECT_EQ(percentile(std::vector<double>{}, 99), 0.0);
  EXPECT_EQ(percentile(std::vector<double>{4.5}, 37), 4.5);
}

TEST(Percentile, RandomInputsHitOrderStatisticsAndInterpolate) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> u(-5.0, 5.0);
  for (int trial = 0; trial < 20; ++trial) {
    size_t n = 2 + rng() % 50;
    std::vector<double> v(n);
    for (double& x : v) x = u(rng);
    std::vector<double> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    double step = 100.0 / static_cast<double>(n - 1);
    for (size_t k = 0; k < n; ++k)  // p = 100·k/(n−1) is the k-th order statistic
      EXPECT_NEAR(percentile(v, step * static_cast<double>(k)), sorted[k], 1e-12);
    for (size_t k = 0; k + 1 < n; ++k) {  // a quarter of the way to the next one
      double expected = sorted[k] + 0.25 * (sorted[k + 1] - sorted[k]);
      EXPECT_NEAR(percentile(v, step * (static_cast<double>(k) + 0.25)), expected, 1e-9);
    }
  }
}

TEST(Summarize, MeanMedianPopulationStdInMilliseconds) {
  const std::vector<double> v = {0.31, 0.07, 0.52, 0.18, 0.95, 0.44, 0.29};
  const std::vector<double> ps = {50, 99};
  LatencySummary s = summarize(v, ps);
  EXPECT_NEAR(s.mean_ms, 394.2857142857143, 1e-9);
  EXPECT_NEAR(s.std_ms, 266.12870907874325, 1e-9);  // numpy.std, ddof 0
  EXPECT_NEAR(s.median_ms, 310.0, 1e-9);
  ASSERT_EQ(s.percentiles_ms.size(), 2u);
  EXPECT_EQ(s.percentiles_ms[1].first, 99.0);
  EXPECT_NEAR(s.percentiles_ms[1].second, 924.2, 1e-9);
  LatencySummary empty = summarize(std::vector<double>{}, ps);  // vLLM's np.mean([] or 0)
  EXPECT_EQ(empty.mean_ms, 0.0);
  EXPECT_EQ(empty.percentiles_ms[0].second, 0.0);
}

RequestResult ok(double start, double ttft, double latency, std::vector<double> itl, int64_t prompt,
                 int64_t usage_out, int64_t retok_out) {
  RequestResult r;
  r.success = true;
  r.start_s = start;
  r.ttft_s = ttft;
  r.latency_s = latency;
  r.itl_s = std::move(itl);
  r.prompt_len = prompt;
  r.usage_output_tokens = usage_out;
  r.retokenized_tokens = retok_out;
  return r;
}

TEST(ComputeMetrics, VllmFormulas) {
  std::vector<RequestResult> results;
  results.push_back(ok(0.0, 0.10, 0.40, {0.1, 0.1, 0.1}, 16, 4, 4));  // TPOT 0.3/3 = 0.1
  results.push_back(ok(0.2, 0.20, 0.80, {0.3, 0.3}, 20, 7, 6));       // TPOT 0.6/6; usage wins
  results.push_back(ok(1.5, 0.05, 0.05, {}, 8, -1, 1));  // one token: no TPOT, counts 1
  RequestResult failed;
  failed.http_status = 503;
  failed.prompt_len = 99;
  results.push_back(failed);
  const std::vector<double> ps = {50, 90, 99};
  GoodputSlo slo{.ttft_ms = 150.0, .tpot_ms = 100.5, .e2el_ms = std::nullopt};
  BenchMetrics m = compute_metrics(results, 2.0, slo, ps);
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 44);  // failures do not count
  EXPECT_EQ(m.total_output, 12);
  EXPECT_EQ(m.output_lens, (std::vector<int64_t>{4, 7, 1, 0}));
  EXPECT_EQ(m.output_count_mismatches, 1);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 6.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 28.0);
  // Goodput: request 1 meets both (TTFT 100, TPOT 100 ≤ 100.5); request 2 misses TTFT; request 3
  // meets both (its TPOT counts as 0).
  EXPECT_DOUBLE_EQ(m.request_goodput, 1.0);
  EXPECT_NEAR(m.tpot.mean_ms, 100.0, 1e-9);  // (0.1 + 0.1) / 2
  EXPECT_NEAR(m.ttft.mean_ms, (100.0 + 200.0 + 50.0) / 3, 1e-9);
  EXPECT_NEAR(m.ttft.median_ms, 100.0, 1e-9);
  EXPECT_NEAR(m.itl.mean_ms, 180.0, 1e-9);  // five gaps: (0.3 + 0.6) / 5
  EXPECT_NEAR(m.e2el.percentiles_ms[2].second,
              1000 * percentile(std::vector<double>{0.4, 0.8, 0.05}, 99), 1e-9);
  // [0, 0.4) and [0.2, 1.0) overlap; [1.5, 1.55) does not.
  EXPECT_EQ(m.max_concurrent_requests, 2);
  // Chunk times 0.1, 0.2, 0.3, 0.4 | 0.4, 0.7, 1.0 | 1.55: second [0, 1) holds 6.
  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 6.0);
}

TEST(ComputeMetrics, AllFailedIsZeros) {
  std::vector<RequestResult> results(3);
  BenchMetrics m = compute_metrics(results, 1.0, {}, std::vector<double>{99});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 3);
  EXPECT_EQ(m.ttft.mean_ms, 0.0);
  EXPECT_EQ(m.max_concurrent_requests, 0);
  EXPECT_EQ(m.request_goodput, 0.0);
}

}  // namespace bench_stats_test
}  // namespace dz::serve
