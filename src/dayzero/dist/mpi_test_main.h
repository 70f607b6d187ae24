#pragma once
// The body of every multi-rank GoogleTest program (*_mpitest.cpp, docs/parallel.md §6): the tests
// run on every rank in the same order, so their collectives line up, and every rank's verdict
// decides the exit status of every rank. Header-only: only test programs include it.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "dayzero/dist/mpi_comm.h"

namespace dz::dist {

// Runs the registered tests with `world` set to a communicator over every rank (60 s deadline per
// collective); needs a live MpiSession.
inline int run_mpi_tests(int* argc, char** argv, MpiComm*& world) {
  ::testing::InitGoogleTest(argc, argv);
  std::unique_ptr<MpiComm> comm = MpiComm::world(60.0);
  world = comm.get();
  const int failed = RUN_ALL_TESTS();
  std::vector<float> any = {static_cast<float>(failed != 0)};
  comm->all_reduce_sum(any, -1);
  world = nullptr;
  return any[0] > 0 ? 1 : 0;
}

// A fresh seed drawn by rank 0, printed there, and the same on every rank.
inline uint32_t shared_test_seed(MpiComm& world) {
  uint32_t seed = std::random_device{}();
  world.broadcast(std::as_writable_bytes(std::span(&seed, 1)), 0, -1);
  if (world.rank() == 0) std::printf("seed %u\n", seed);
  return seed;
}

// MPI for the test program, or the reason it cannot start (exit status 2).
inline std::unique_ptr<MpiSession> start_mpi_for_tests() {
  auto session = MpiSession::start();
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().to_string().c_str());
    return nullptr;
  }
  return std::move(session).value();
}

// The whole main() of a multi-rank test program: MPI started (exit status 2 if it cannot be),
// the tests run with `world` set.
inline int mpi_test_main(int argc, char** argv, MpiComm*& world) {
  const auto session = start_mpi_for_tests();
  if (session == nullptr) return 2;
  return run_mpi_tests(&argc, argv, world);
}

}  // namespace dz::dist
