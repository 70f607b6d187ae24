#pragma once
// Comm over MPI (Debian's Open MPI 4.1): one process per rank, launched by `mpirun`
// (docs/parallel.md §2). Every collective is a non-blocking MPI-3 call polled until it completes
// or its deadline passes; past the deadline the rank logs what it waited for and aborts the whole
// job (MPI_Abort), because a pending collective cannot be cancelled and a hang is worse than a
// fast, named failure.

#include <memory>
#include <string>

#include "dayzero/core/status.h"
#include "dayzero/dist/comm.h"

namespace dz::dist {

// Whether this process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE, other
// launchers PMI_SIZE or PMIX_RANK), and the world size it announced (1 when not launched).
bool launched_by_mpi();
int launcher_world_size();

// Initializes MPI once for the process (MPI_THREAD_SERIALIZED: one thread at a time calls MPI,
// not necessarily the one that initialized it) and finalizes it when destroyed.
class MpiSession {
 public:
  static Result<std::unique_ptr<MpiSession>> start();
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  MpiSession() = default;
};

class MpiComm final : public Comm {
 public:
  // All the ranks of the job (a duplicate of MPI_COMM_WORLD); needs a live MpiSession.
  static std::unique_ptr<MpiComm> world(double collective_timeout_s);
  ~MpiComm() override;

  // The ranks with the same color, ordered by key (MPI_Comm_split): a TP or EP group. It counts
  // its traffic into this communicator's stats, so it must not outlive it.
  std::unique_ptr<MpiComm> split(int color, int key) const;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void barrier() override;

  double collective_timeout_s() const { return timeout_s_; }

 protected:
  void do_all_gather(const void* send, void* recv, std::span<const int64_t> counts, WireType type,
                     CommOp op, int layer) override;
  void do_all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                     std::span<const int64_t> recv_counts, WireType type, CommOp op,
                     int layer) override;
  void do_broadcast(void* data, int64_t bytes, int root, int layer, Wait wait) override;
  void do_gather(const void* send, void* recv, std::span<const int64_t> counts, WireType type,
                 int root, int layer) override;

 private:
  struct Handle;
  MpiComm(std::unique_ptr<Handle> handle, double timeout_s);
  std::unique_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
  double timeout_s_;
};

}  // namespace dz::dist
