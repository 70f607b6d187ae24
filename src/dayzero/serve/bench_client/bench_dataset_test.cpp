#include "dayzero/serve/bench_client/bench_dataset.h"

#include <cmath>
#include <numeric>
#include <set>

#include <gtest/gtest.h>

#include "dayzero/serve/bench_client/load_runner.h"

namespace dz::serve {
namespace bench_dataset_test {

std::vector<int32_t> ids_from(int32_t lo, int32_t hi) {
  std::vector<int32_t> ids(static_cast<size_t>(hi - lo));
  std::iota(ids.begin(), ids.end(), lo);
  return ids;
}

TEST(BenchDataset, RandomLengthsAndIds) {
  DatasetOptions o{.name = "random",
                   .num_prompts = 200,
                   .input_len = 40,
                   .output_len = 10,
                   .range_ratio = 0.25,
                   .seed = 7};
  std::vector<int32_t> allowed = ids_from(100, 150);
  auto requests = make_dataset(o, allowed);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  std::set<int64_t> input_lens;
  for (const BenchRequest& r : *requests) {
    EXPECT_GE(r.prompt_len, 30);  // ⌊40·0.75⌋
    EXPECT_LE(r.prompt_len, 50);  // ⌈40·1.25⌉
    EXPECT_GE(r.output_len, 7);
    EXPECT_LE(r.output_len, 13);
    EXPECT_EQ(static_cast<int64_t>(r.prompt_ids.size()), r.prompt_len);
    for (int32_t id : r.prompt_ids) {
      EXPECT_GE(id, 100);
      EXPECT_LT(id, 150);
    }
    input_lens.insert(r.prompt_len);
  }
  EXPECT_GT(input_lens.size(), 10u);  // the range is used
  auto again = make_dataset(o, allowed);
  EXPECT_EQ((*again)[5].prompt_ids, (*requests)[5].prompt_ids);  // same seed, same prompts
  o.seed = 8;
  EXPECT_NE((*make_dataset(o, allowed))[5].prompt_ids, (*requests)[5].prompt_ids);
  o.range_ratio = 0;
  auto fixed = make_dataset(o, allowed);  // kept alive: the loop must not range over a temporary
  ASSERT_TRUE(fixed.ok());
  for (const BenchRequest& r : *fixed) {
    EXPECT_EQ(r.prompt_len, 40);
    EXPECT_EQ(r.output_len, 10);
  }
}

TEST(BenchDataset, PrefixRepetition) {
  DatasetOptions o{.name = "prefix-repetition",
                   .num_prompts = 12,
                   .input_len = 5,
                   .output_len = 3,
                   .prefix_len = 20,
                   .num_prefixes = 3,
                   .seed = 1};
  auto requests = make_dataset(o, ids_from(0, 1000));
  ASSERT_TRUE(requests.ok());
  std::map<std::vector<int32_t>, int> prefixes;
  std::set<std::vector<int32_t>> suffixes;
  for (const BenchRequest& r : *requests) {
    ASSERT_EQ(r.prompt_ids.size(), 25u);
    EXPECT_EQ(r.prompt_len, 25);
    EXPECT_EQ(r.output_len, 3);
    ++prefixes[std::vector<int32_t>(r.prompt_ids.begin(), r.prompt_ids.begin() + 20)];
    suffixes.insert(std::vector<int32_t>(r.prompt_ids.begin() + 20, r.prompt_ids.end()));
  }
  EXPECT_EQ(prefixes.size(), 3u);
  for (const auto& [prefix, count] : prefixes) EXPECT_EQ(count, 4);
  EXPECT_EQ(suffixes.size(), 12u);
}

TEST(BenchDataset, Errors) {
  std::vector<int32_t> allowed = ids_from(0, 10);
  DatasetOptions o{.name = "sharegpt", .num_prompts = 1, .input_len = 1, .output_len = 1};
  EXPECT_EQ(make_dataset(o, allowed).status().message(),
            "--dataset-name must be random or prefix-repetition, not 'sharegpt'");
  o.name = "random";
  o.range_ratio = 1.0;
  EXPECT_EQ(make_dataset(o, allowed).status().message(), "--range-ratio must be in [0, 1), not 1");
  o.range_ratio = 0;
  o.output_len = 0;
  EXPECT_EQ(make_dataset(o, allowed).status().message(),
            "--input-len and --output-len must be positive (got 1 and 0)");
  o.output_len = 1;
  EXPECT_EQ(make_dataset(o, {}).status().message(), "no token ids to draw prompts from");
  o.name = "prefix-repetition";
  o.prefix_len = 0;
  EXPECT_EQ(make_dataset(o, allowed).status().message(),
            "prefix-repetition needs positive --prefix-len and --num-prefixes (got 0 and 1)");
}

TEST(ArrivalTimes, InfiniteRateSendsAllAtOnce) {
  EXPECT_EQ(arrival_times(4, INFINITY, 1.0, 0), (std::vector<double>{0, 0, 0, 0}));
}

TEST(ArrivalTimes, PoissonAndGammaEndAtNOverRate) {
  for (double burstiness : {1.0, 0.3, 4.0}) {
    std::vector<double> t = arrival_times(500, 20.0, burstiness, 3);
    ASSERT_EQ(t.size(), 500u);
    EXPECT_NEAR(t.back(), 25.0, 1e-9);  // rescaled to n / rate, as vLLM does
    EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
    EXPECT_GT(t.front(), 0.0);
    // Coefficient of variation of the gaps ≈ 1/√burstiness (gamma shape k).
    std::vector<double> gaps(t.size());
    std::adjacent_difference(t.begin(), t.end(), gaps.begin());
    double mean = t.back() / static_cast<double>(gaps.size()), var = 0;
    for (double g : gaps) var += (g - mean) * (g - mean);
    double cv = std::sqrt(var / static_cast<double>(gaps.size())) / mean;
    EXPECT_NEAR(cv, 1.0 / std::sqrt(burstiness), 0.25 / std::sqrt(burstiness)) << burstiness;
  }
  std::vector<double> even = arrival_times(4, 2.0, INFINITY, 0);
  EXPECT_EQ(even, (std::vector<double>{0.5, 1.0, 1.5, 2.0}));
  EXPECT_EQ(arrival_times(10, 5.0, 1.0, 9), arrival_times(10, 5.0, 1.0, 9));
}

TEST(RequestBody, CompletionsAndChat) {
  LoadOptions o;
  o.model = "tiny";
  o.ignore_eos = true;
  BenchRequest r{.prompt_ids = {5, 6, 7}, .prompt_text = "hi", .prompt_len = 3, .output_len = 9};
  nlohmann::json body = request_body(o, r);
  EXPECT_EQ(body, nlohmann::json::parse(R"({"model":"tiny","prompt":[5,6,7],"max_tokens":9,
      "stream":true,"stream_options":{"include_usage":true},"ignore_eos":true})"));
  o.kind = ApiKind::kChatCompletions;
  o.ignore_eos = false;
  body = request_body(o, r);
  EXPECT_EQ(body, nlohmann::json::parse(R"({"model":"tiny","messages":[{"role":"user",
      "content":"hi"}],"max_completion_tokens":9,"stream":true,
      "stream_options":{"include_usage":true}})"));
}

}  // namespace bench_dataset_test
}  // namespace dz::serve
