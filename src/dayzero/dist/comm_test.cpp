#include "dayzero/dist/comm.h"

#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "dayzero/formats/codecs.h"

namespace dz::dist {
namespace comm_test {

TEST(EvenSplit, CoversTheRangeWithTheFirstPartsLonger) {
  EXPECT_EQ(even_split(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(even_split(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(even_split(1, 3), (std::vector<int64_t>{1, 0, 0}));
  EXPECT_EQ(even_split(0, 2), (std::vector<int64_t>{0, 0}));
}

TEST(SoloComm, CollectivesAreTheIdentityAndMoveNothing) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> data(37);
  for (float& x : data) x = normal(rng);
  const std::vector<float> original = data;

  SoloComm comm;
  comm.all_reduce_sum(data, 3);
  EXPECT_EQ(data, original);

  // BF16 on the wire rounds once, as the multi-rank path does.
  comm.all_reduce_sum(data, 3, WireType::kBf16);
  for (size_t i = 0; i < data.size(); ++i) EXPECT_EQ(data[i], formats::round_to_bf16(original[i]));

  std::vector<float> gathered(original.size());
  const std::vector<int64_t> counts = {static_cast<int64_t>(original.size())};
  comm.all_gather(std::as_bytes(std::span(original)), std::as_writable_bytes(std::span(gathered)),
                  counts, WireType::kF32, 4);
  EXPECT_EQ(gathered, original);

  std::vector<float> scattered(original.size());
  comm.reduce_scatter_sum(original, scattered, counts, 4);
  EXPECT_EQ(scattered, original);

  const CommCounts total = comm.stats().total();
  EXPECT_EQ(total.calls, 4);
  EXPECT_EQ(total.bytes_received, 0);
  EXPECT_EQ(total.bytes_sent, 0);
  EXPECT_EQ(comm.stats().for_layer(3).calls, 2);
  EXPECT_EQ(comm.stats().by_key().at({4, CommOp::kReduceScatter}).calls, 1);
}

TEST(CommStats, AddsByLayerAndOperation) {
  CommStats stats;
  stats.add({0, CommOp::kAllReduce}, 10, 20);
  stats.add({0, CommOp::kAllReduce}, 1, 2);
  stats.add({1, CommOp::kAllToAll}, 5, 7);
  EXPECT_EQ(stats.by_key().at({0, CommOp::kAllReduce}).calls, 2);
  EXPECT_EQ(stats.for_layer(0).bytes_received, 22);
  EXPECT_EQ(stats.total().bytes_sent, 16);
  EXPECT_EQ(comm_op_name(CommOp::kAllToAll), "all_to_all");
  stats.reset();
  EXPECT_EQ(stats.total().calls, 0);
}

}  // namespace comm_test
}  // namespace dz::dist
