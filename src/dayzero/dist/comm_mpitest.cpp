// Multi-rank tests of MpiComm, run under mpirun at 2 and 4 ranks (dist/CMakeLists.txt). Every rank
// runs every test in the same order, so the collectives line up. Inputs are fresh random numbers:
// rank 0 draws the seed, broadcasts it and prints it, and every rank can regenerate every other
// rank's input from (seed, rank) to compute the expected result itself.

#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "dayzero/dist/mpi_comm.h"
#include "dayzero/dist/mpi_test_main.h"
#include "dayzero/formats/codecs.h"

namespace dz::dist {
namespace {

MpiComm* g_world = nullptr;

uint32_t shared_seed() {
  uint32_t seed = std::random_device{}();
  g_world->broadcast(std::as_writable_bytes(std::span(&seed, 1)), 0, -1);
  if (g_world->rank() == 0) std::printf("seed %u\n", seed);
  return seed;
}

std::vector<float> rank_input(uint32_t seed, int rank, int64_t n) {
  std::mt19937 rng(seed + 7919u * static_cast<uint32_t>(rank));
  std::normal_distribution<float> normal;
  std::vector<float> data(static_cast<size_t>(n));
  for (float& x : data) x = normal(rng);
  return data;
}

// The same bits on every rank: each rank's copy is gathered and compared here.
void expect_same_on_every_rank(const std::vector<float>& data) {
  const int ranks = g_world->size();
  std::vector<float> all(data.size() * static_cast<size_t>(ranks));
  const std::vector<int64_t> counts(static_cast<size_t>(ranks), static_cast<int64_t>(data.size()));
  g_world->all_gather(std::as_bytes(std::span(data)), std::as_writable_bytes(std::span(all)),
                      counts, WireType::kF32, -1);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(std::memcmp(all.data() + r * data.size(), data.data(), data.size() * sizeof(float)),
              0)
        << "rank " << r << " holds different bits";
  }
}

TEST(MpiComm, AllReduceSumsInRankOrderAndEveryRankGetsTheSameBits) {
  const uint32_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int ranks = g_world->size();
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{4096}, int64_t{4099}}) {
    std::vector<float> data = rank_input(seed, g_world->rank(), n);
    std::vector<float> expected(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> input = rank_input(seed, r, n);
      for (int64_t i = 0; i < n; ++i)
        expected[static_cast<size_t>(i)] += input[static_cast<size_t>(i)];
    }
    g_world->stats().reset();
    g_world->all_reduce_sum(data, 5);
    EXPECT_EQ(data, expected) << "n " << n;
    expect_same_on_every_rank(data);
    // The formula of docs/parallel.md §3: 2 (N-1)/N n s, exact where N divides n.
    if (n % ranks == 0) {
      const CommCounts counts = g_world->stats().by_key().at({5, CommOp::kAllReduce});
      EXPECT_EQ(counts.bytes_received, 2 * (ranks - 1) * n / ranks * 4) << "n " << n;
      EXPECT_EQ(counts.bytes_sent, counts.bytes_received);
    }
  }
}

TEST(MpiComm, AllReduceInBf16RoundsThePartsAndTheSumOnce) {
  const uint32_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t n = 1000;
  std::vector<float> data = rank_input(seed, g_world->rank(), n);
  std::vector<float> expected(static_cast<size_t>(n), 0.0f);
  for (int r = 0; r < g_world->size(); ++r) {
    const std::vector<float> input = rank_input(seed, r, n);
    for (int64_t i = 0; i < n; ++i) {
      expected[static_cast<size_t>(i)] += formats::round_to_bf16(input[static_cast<size_t>(i)]);
    }
  }
  for (float& x : expected) x = formats::round_to_bf16(x);
  g_world->stats().reset();
  g_world->all_reduce_sum(data, 2, WireType::kBf16);
  EXPECT_EQ(data, expected);
  expect_same_on_every_rank(data);
  const int ranks = g_world->size();
  const int64_t chunk = n / ranks;
  if (n % ranks == 0) {
    EXPECT_EQ(g_world->stats().by_key().at({2, CommOp::kAllReduce}).bytes_received,
              2 * (ranks - 1) * chunk * 2);
  }
}

TEST(MpiComm, AllGatherAndGatherPlaceEachRankAtItsOffset) {
  const uint32_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int ranks = g_world->size();
  const int me = g_world->rank();
  // Uneven counts: rank r contributes r + 3 elements.
  std::vector<int64_t> counts(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) counts[static_cast<size_t>(r)] = r + 3;
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  std::vector<float> expected;
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> theirs = rank_input(seed, r, r + 3);
    expected.insert(expected.end(), theirs.begin(), theirs.end());
  }
  const std::vector<float> mine = rank_input(seed, me, me + 3);

  std::vector<float> all(static_cast<size_t>(total));
  g_world->stats().reset();
  g_world->all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                      counts, WireType::kF32, 1);
  EXPECT_EQ(all, expected);
  EXPECT_EQ(g_world->stats().total().bytes_received, (total - (me + 3)) * 4);

  const int root = ranks - 1;
  std::vector<float> at_root(me == root ? static_cast<size_t>(total) : 0);
  g_world->gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(at_root)),
                  counts, WireType::kF32, root, 1);
  if (me == root) {
    EXPECT_EQ(at_root, expected);
  }
}

TEST(MpiComm, ReduceScatterLeavesEachRankItsSummedSlice) {
  const uint32_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int ranks = g_world->size();
  const int me = g_world->rank();
  const int64_t n = 4 * ranks + 1;
  const std::vector<int64_t> counts = even_split(n, ranks);
  const int64_t begin = std::accumulate(counts.begin(), counts.begin() + me, int64_t{0});
  std::vector<float> expected(static_cast<size_t>(counts[static_cast<size_t>(me)]), 0.0f);
  for (int r = 0; r < ranks; ++r) {
    const std::vector<float> input = rank_input(seed, r, n);
    for (size_t i = 0; i < expected.size(); ++i)
      expected[i] += input[static_cast<size_t>(begin) + i];
  }
  std::vector<float> slice(expected.size());
  g_world->reduce_scatter_sum(rank_input(seed, me, n), slice, counts, 0);
  EXPECT_EQ(slice, expected);
}

TEST(MpiComm, AllToAllDeliversEachRankWhatWasAddressedToIt) {
  const uint32_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int ranks = g_world->size();
  const int me = g_world->rank();
  // Rank s sends (s + 2 d) % 5 values to rank d (some zero), each value encoding (s, d, index).
  auto count_from_to = [](int source, int dest) { return int64_t{(source + 2 * dest) % 5}; };
  auto value = [](int source, int dest, int64_t i) {
    return static_cast<int32_t>(source * 10000 + dest * 100 + i);
  };
  std::vector<int64_t> send_counts;
  std::vector<int32_t> send;
  for (int d = 0; d < ranks; ++d) {
    send_counts.push_back(count_from_to(me, d));
    for (int64_t i = 0; i < send_counts.back(); ++i) send.push_back(value(me, d, i));
  }
  g_world->stats().reset();
  const std::vector<int64_t> recv_counts = g_world->exchange_counts(send_counts, 9);
  std::vector<int32_t> expected;
  for (int s = 0; s < ranks; ++s) {
    EXPECT_EQ(recv_counts[static_cast<size_t>(s)], count_from_to(s, me));
    for (int64_t i = 0; i < count_from_to(s, me); ++i) expected.push_back(value(s, me, i));
  }
  std::vector<int32_t> recv(expected.size());
  g_world->all_to_all(std::as_bytes(std::span(send)), send_counts,
                      std::as_writable_bytes(std::span(recv)), recv_counts, WireType::kI32, 9);
  EXPECT_EQ(recv, expected);
  const int64_t from_others = static_cast<int64_t>(expected.size()) - count_from_to(me, me);
  EXPECT_EQ(g_world->stats().by_key().at({9, CommOp::kAllToAll}).bytes_received,
            (ranks - 1) * 8 + from_others * 4);
}

TEST(MpiComm, BroadcastCopiesTheRootsBytesAndSplitFormsGroups) {
  const int ranks = g_world->size();
  const int me = g_world->rank();
  std::vector<int32_t> data(5, me);
  g_world->broadcast(std::as_writable_bytes(std::span(data)), ranks - 1, -1);
  EXPECT_EQ(data, std::vector<int32_t>(5, ranks - 1));

  // Two groups by parity (a TP x 2 layout): sums stay inside each group.
  std::unique_ptr<MpiComm> group = g_world->split(me % 2, me);
  EXPECT_EQ(group->size(), (ranks + 1 - me % 2) / 2);
  std::vector<float> one = {static_cast<float>(me)};
  group->all_reduce_sum(one, 0);
  float expected = 0;
  for (int r = me % 2; r < ranks; r += 2) expected += static_cast<float>(r);
  EXPECT_EQ(one[0], expected);
}

// Not a test: rank 1 never joins the all-reduce of rank 0, whose deadline must name it and end the
// job (ctest checks the message; the exit status is MPI_Abort's).
int deadline_drill(double timeout_s) {
  std::unique_ptr<MpiComm> comm = MpiComm::world(timeout_s);
  if (comm->rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
    return 0;
  }
  std::vector<float> value = {1.0f};
  comm->all_reduce_sum(value, 7);
  std::fprintf(stderr, "the all-reduce returned without its peer\n");
  return 1;
}

}  // namespace
}  // namespace dz::dist

int main(int argc, char** argv) {
  const auto session = dz::dist::start_mpi_for_tests();
  if (session == nullptr) return 2;
  if (argc > 1 && std::string(argv[1]) == "--deadline-drill") return dz::dist::deadline_drill(1.0);
  return dz::dist::run_mpi_tests(&argc, argv, dz::dist::g_world);
}
