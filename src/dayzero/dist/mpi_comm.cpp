#include "dayzero/dist/mpi_comm.h"

#include <mpi.h>

#include <chrono>
#include <climits>
#include <cstdlib>
#include <limits>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "dayzero/core/check.h"

namespace dz::dist {

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

int launcher_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* value = std::getenv(name)) return std::atoi(value);
  }
  return 1;
}

Result<std::unique_ptr<MpiSession>> MpiSession::start() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return Status(StatusCode::kInternal, "MPI is already initialized");
  int provided = 0;
  if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
    return Status(StatusCode::kUnsupported, "MPI_Init_thread failed");
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    MPI_Finalize();
    return make_error(StatusCode::kUnsupported,
                      "this MPI provides thread level {}, dayzero needs MPI_THREAD_SERIALIZED "
                      "(the engine thread, not the main thread, runs the collectives)",
                      provided);
  }
  return std::unique_ptr<MpiSession>(new MpiSession());
}

MpiSession::~MpiSession() {
  MPI_Finalize();
}

struct MpiComm::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
};

namespace {

MPI_Datatype mpi_type(WireType type) {
  switch (type) {
    case WireType::kF32:
      return MPI_FLOAT;
    case WireType::kBf16:
      return MPI_UINT16_T;
    case WireType::kI32:
      return MPI_INT32_T;
    case WireType::kU8:
      return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

int as_mpi_count(int64_t count) {
  DZ_CHECK(count >= 0 && count <= INT_MAX, "MPI count {} does not fit an int", count);
  return static_cast<int>(count);
}

// Counts and displacements of a v-collective, in elements.
struct Layout {
  std::vector<int> counts;
  std::vector<int> displs;
};
Layout layout_of(std::span<const int64_t> counts) {
  Layout layout;
  int64_t offset = 0;
  for (int64_t count : counts) {
    layout.counts.push_back(as_mpi_count(count));
    layout.displs.push_back(as_mpi_count(offset));
    offset += count;
  }
  return layout;
}

constexpr double kNoDeadline = std::numeric_limits<double>::infinity();

// Polls until the request completes. MPI_Test also drives Open MPI's progress engine. The first
// 50 us spin (a step's collectives are short); after that the thread yields and then sleeps, so
// that ranks oversubscribing the cores (tests: 4 ranks on 2 cores) leave them to the ranks still
// computing, and past 100 ms it sleeps a millisecond at a time (a rank idle between requests).
// Past the deadline: log and MPI_Abort, which tears down every rank.
void wait_for(MPI_Request& request, MPI_Comm comm, double timeout_s, CommOp op, int layer) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = timeout_s == kNoDeadline
                            ? Clock::time_point::max()
                            : start + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(timeout_s));
  for (int64_t polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const auto now = Clock::now();
    if (now > deadline) {
      int rank = 0, size = 0;
      MPI_Comm_rank(comm, &rank);
      MPI_Comm_size(comm, &size);
      spdlog::critical(
          "rank {}/{}: {} of layer {} did not complete within the collective timeout of {} s "
          "(a peer rank died or hangs); aborting every rank",
          rank, size, comm_op_name(op), layer, timeout_s);
      MPI_Abort(comm, 3);
    }
    const auto waited = now - start;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(2)) {
      std::this_thread::yield();
    } else if (waited < std::chrono::milliseconds(100)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace

MpiComm::MpiComm(std::unique_ptr<Handle> handle, double timeout_s)
    : handle_(std::move(handle)), timeout_s_(timeout_s) {
  MPI_Comm_rank(handle_->comm, &rank_);
  MPI_Comm_size(handle_->comm, &size_);
  // A failed MPI call returns an error to the caller instead of aborting inside the library, so
  // the message names what dayzero was doing.
  MPI_Comm_set_errhandler(handle_->comm, MPI_ERRORS_RETURN);
}

MpiComm::~MpiComm() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && handle_->comm != MPI_COMM_NULL) MPI_Comm_free(&handle_->comm);
}

std::unique_ptr<MpiComm> MpiComm::world(double collective_timeout_s) {
  auto handle = std::make_unique<Handle>();
  MPI_Comm_dup(MPI_COMM_WORLD, &handle->comm);
  return std::unique_ptr<MpiComm>(new MpiComm(std::move(handle), collective_timeout_s));
}

std::unique_ptr<MpiComm> MpiComm::split(int color, int key) const {
  auto handle = std::make_unique<Handle>();
  MPI_Comm_split(handle_->comm, color, key, &handle->comm);
  std::unique_ptr<MpiComm> group(new MpiComm(std::move(handle), timeout_s_));
  group->stats_ = stats_;
  return group;
}

void MpiComm::barrier() {
  MPI_Request request;
  MPI_Ibarrier(handle_->comm, &request);
  wait_for(request, handle_->comm, timeout_s_, CommOp::kBroadcast, -1);
}

void MpiComm::do_all_gather(const void* send, void* recv, std::span<const int64_t> counts,
                            WireType type, CommOp op, int layer) {
  const Layout layout = layout_of(counts);
  MPI_Request request;
  const int rc = MPI_Iallgatherv(send, layout.counts[static_cast<size_t>(rank_)], mpi_type(type),
                                 recv, layout.counts.data(), layout.displs.data(), mpi_type(type),
                                 handle_->comm, &request);
  DZ_CHECK(rc == MPI_SUCCESS, "MPI_Iallgatherv failed ({}) for layer {}", rc, layer);
  wait_for(request, handle_->comm, timeout_s_, op, layer);
}

void MpiComm::do_all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                            std::span<const int64_t> recv_counts, WireType type, CommOp op,
                            int layer) {
  const Layout out = layout_of(send_counts);
  const Layout in = layout_of(recv_counts);
  MPI_Request request;
  const int rc =
      MPI_Ialltoallv(send, out.counts.data(), out.displs.data(), mpi_type(type), recv,
                     in.counts.data(), in.displs.data(), mpi_type(type), handle_->comm, &request);
  DZ_CHECK(rc == MPI_SUCCESS, "MPI_Ialltoallv failed ({}) for layer {}", rc, layer);
  wait_for(request, handle_->comm, timeout_s_, op, layer);
}

void MpiComm::do_broadcast(void* data, int64_t bytes, int root, int layer, Wait wait) {
  MPI_Request request;
  const int rc = MPI_Ibcast(data, as_mpi_count(bytes), MPI_BYTE, root, handle_->comm, &request);
  DZ_CHECK(rc == MPI_SUCCESS, "MPI_Ibcast failed ({}) for layer {}", rc, layer);
  wait_for(request, handle_->comm, wait == Wait::kForever ? kNoDeadline : timeout_s_,
           CommOp::kBroadcast, layer);
}

void MpiComm::do_gather(const void* send, void* recv, std::span<const int64_t> counts,
                        WireType type, int root, int layer) {
  const Layout layout = layout_of(counts);
  MPI_Request request;
  const int rc = MPI_Igatherv(send, layout.counts[static_cast<size_t>(rank_)], mpi_type(type), recv,
                              layout.counts.data(), layout.displs.data(), mpi_type(type), root,
                              handle_->comm, &request);
  DZ_CHECK(rc == MPI_SUCCESS, "MPI_Igatherv failed ({}) for layer {}", rc, layer);
  wait_for(request, handle_->comm, timeout_s_, CommOp::kGather, layer);
}

}  // namespace dz::dist
