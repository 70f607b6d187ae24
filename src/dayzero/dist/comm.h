#pragma once
// The collectives a multi-rank forward needs (docs/parallel.md §2), as the interface the model
// layers call: MpiComm (dist/mpi_comm.h) between processes, SoloComm in one process, where every
// collective is the identity and moves nothing.
//
// Every call counts what it moves into CommStats, keyed by the layer it serves and the operation,
// so `/metrics` and `dayzero bench` can show the traffic per layer and step and the tests can hold
// it to `dayzero analyze`'s formulas. Bytes are counted as this rank receives them from other ranks
// (its own chunk never crosses the wire), which is what those formulas state.

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dz::dist {

enum class CommOp : unsigned char {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kBroadcast,
  kGather,
};
std::string_view comm_op_name(CommOp op);  // "all_reduce", ...

// What a collective serves: the decoder layer (-1 for embeddings and head, kStepLayer for rank
// 0's step descriptions, which are not the model's traffic) and the op.
inline constexpr int kStepLayer = -2;

struct CommKey {
  int layer = -1;
  CommOp op = CommOp::kAllReduce;
  auto operator<=>(const CommKey&) const = default;
};

struct CommCounts {
  int64_t calls = 0;
  int64_t bytes_received = 0;  // from other ranks
  int64_t bytes_sent = 0;      // to other ranks
};

// Traffic of one rank since the last reset().
class CommStats {
 public:
  void add(CommKey key, int64_t bytes_sent, int64_t bytes_received);
  void reset() { counts_.clear(); }
  const std::map<CommKey, CommCounts>& by_key() const { return counts_; }
  // Every layer's, without the step descriptions (kStepLayer): the model's traffic.
  CommCounts total() const;
  CommCounts for_layer(int layer) const;

 private:
  std::map<CommKey, CommCounts> counts_;
};

// Element types that travel. Sums are taken in FP32 whatever travels.
enum class WireType : unsigned char { kF32, kBf16, kI32, kU8 };
int64_t wire_type_bytes(WireType type);

class Comm {
 public:
  Comm() = default;
  Comm(const Comm&) = delete;  // stats_ may point into itself
  Comm& operator=(const Comm&) = delete;
  virtual ~Comm() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Sums `data` over the ranks in place. Every rank ends with the same bits (each element is
  // reduced once, on one rank, in rank order, then gathered: never MPI_Allreduce, whose result may
  // differ between ranks). With `wire` kBf16 the partial sums travel as BF16 and the reduced value
  // is rounded to BF16 once before it is gathered.
  void all_reduce_sum(std::span<float> data, int layer, WireType wire = WireType::kF32);

  // Rank r's `send` (counts[r] elements of `type`) lands at offset sum(counts[0..r)) of `recv`.
  void all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                  std::span<const int64_t> counts, WireType type, int layer);

  // Sums `send` (sum(counts) floats, rank order) and leaves rank r its counts[r] slice in `recv`.
  void reduce_scatter_sum(std::span<const float> send, std::span<float> recv,
                          std::span<const int64_t> counts, int layer);

  // Rank r sends send_counts[d] elements to rank d (consecutive in `send`, by destination) and
  // receives recv_counts[s] from rank s (consecutive in `recv`, by source).
  void all_to_all(std::span<const std::byte> send, std::span<const int64_t> send_counts,
                  std::span<std::byte> recv, std::span<const int64_t> recv_counts, WireType type,
                  int layer);

  // Every rank learns how much every other will send it: counts[d] to rank d in, counts[s] from
  // rank s out (what all_to_all needs before its payload).
  std::vector<int64_t> exchange_counts(std::span<const int64_t> send_counts, int layer);

  // Root's `data` overwrites every other rank's. kForever: no deadline (a rank idle until root
  // sends the next step; a root that dies ends the job through mpirun instead).
  enum class Wait : unsigned char { kDeadline, kForever };
  void broadcast(std::span<std::byte> data, int root, int layer, Wait wait = Wait::kDeadline);

  // Root receives every rank's `send` (counts[r] elements) concatenated in rank order in `recv`
  // (ignored elsewhere).
  void gather(std::span<const std::byte> send, std::span<std::byte> recv,
              std::span<const int64_t> counts, WireType type, int root, int layer);

  virtual void barrier() = 0;

  // A group split from a communicator counts into its parent's stats: one rank's traffic is read
  // in one place whichever group a collective ran in.
  CommStats& stats() { return *stats_; }
  const CommStats& stats() const { return *stats_; }

 protected:
  // The transport. Counts are in elements of `type`; every rank calls with consistent arguments.
  virtual void do_all_gather(const void* send, void* recv, std::span<const int64_t> counts,
                             WireType type, CommOp op, int layer) = 0;
  virtual void do_all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                             std::span<const int64_t> recv_counts, WireType type, CommOp op,
                             int layer) = 0;
  virtual void do_broadcast(void* data, int64_t bytes, int root, int layer, Wait wait) = 0;
  virtual void do_gather(const void* send, void* recv, std::span<const int64_t> counts,
                         WireType type, int root, int layer) = 0;

 private:
  // Sends chunk r of `send` (as `wire`) to rank r and sums in rank order, in FP32, the chunks that
  // arrive here: the reduce-scatter half of every sum.
  std::vector<float> sum_my_chunk(std::span<const float> send, WireType wire,
                                  std::span<const int64_t> chunks, CommOp op, int layer);
  // Every rank's whole `data` gathered and summed here in rank order, in FP32 (as `wire`
  // travels, rounded to BF16 once with kBf16): the all-reduce of two ranks.
  void sum_all_parts(std::span<float> data, WireType wire, int layer);

  CommStats own_stats_;

 protected:
  CommStats* stats_ = &own_stats_;
};

// One rank: every collective is the identity (a copy where send and recv differ) and counts a call
// that moved nothing.
class SoloComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier() override {}

 protected:
  void do_all_gather(const void* send, void* recv, std::span<const int64_t> counts, WireType type,
                     CommOp op, int layer) override;
  void do_all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                     std::span<const int64_t> recv_counts, WireType type, CommOp op,
                     int layer) override;
  void do_broadcast(void* data, int64_t bytes, int root, int layer, Wait wait) override;
  void do_gather(const void* send, void* recv, std::span<const int64_t> counts, WireType type,
                 int root, int layer) override;
};

// Bytes `rank` receives from the others in all_reduce_sum of n elements over `ranks` ranks: the
// other ranks' parts of its chunk, then every other chunk; 2 (N-1)/N · n · s where N divides n
// (docs/parallel.md §3).
int64_t all_reduce_received_bytes(int64_t n, int ranks, int rank, WireType wire);

// Splits n elements into `parts` contiguous chunks as evenly as possible (the first n % parts one
// longer): how all-reduce and the even splits of the model cut a row.
std::vector<int64_t> even_split(int64_t n, int parts);

}  // namespace dz::dist
