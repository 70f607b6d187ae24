#include "dayzero/dist/comm.h"

#include <cstring>
#include <numeric>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"

namespace dz::dist {

std::string_view comm_op_name(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllToAll:
      return "all_to_all";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kGather:
      return "gather";
  }
  return "unknown";
}

void CommStats::add(CommKey key, int64_t bytes_sent, int64_t bytes_received) {
  CommCounts& counts = counts_[key];
  ++counts.calls;
  counts.bytes_sent += bytes_sent;
  counts.bytes_received += bytes_received;
}

CommCounts CommStats::total() const {
  CommCounts sum;
  for (const auto& [key, counts] : counts_) {
    if (key.layer == kStepLayer) continue;
    sum.calls += counts.calls;
    sum.bytes_sent += counts.bytes_sent;
    sum.bytes_received += counts.bytes_received;
  }
  return sum;
}

CommCounts CommStats::for_layer(int layer) const {
  CommCounts sum;
  for (const auto& [key, counts] : counts_) {
    if (key.layer != layer) continue;
    sum.calls += counts.calls;
    sum.bytes_sent += counts.bytes_sent;
    sum.bytes_received += counts.bytes_received;
  }
  return sum;
}

int64_t wire_type_bytes(WireType type) {
  switch (type) {
    case WireType::kF32:
      return 4;
    case WireType::kBf16:
      return 2;
    case WireType::kI32:
      return 4;
    case WireType::kU8:
      return 1;
  }
  return 1;
}

int64_t all_reduce_received_bytes(int64_t n, int ranks, int rank, WireType wire) {
  if (ranks == 1) return 0;
  const int64_t mine = even_split(n, ranks)[static_cast<size_t>(rank)];
  return ((ranks - 1) * mine + (n - mine)) * wire_type_bytes(wire);
}

std::vector<int64_t> even_split(int64_t n, int parts) {
  DZ_CHECK(parts > 0 && n >= 0, "even_split({}, {})", n, parts);
  std::vector<int64_t> sizes(static_cast<size_t>(parts), n / parts);
  for (int64_t i = 0; i < n % parts; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

namespace {

int64_t sum_of(std::span<const int64_t> counts) {
  return std::accumulate(counts.begin(), counts.end(), int64_t{0});
}

void check_counts(std::span<const int64_t> counts, int size, const char* what) {
  DZ_CHECK(static_cast<int>(counts.size()) == size, "{}: one count per rank", what);
  for (int64_t count : counts) DZ_CHECK(count >= 0, "{}: negative count", what);
}

}  // namespace

void Comm::all_reduce_sum(std::span<float> data, int layer, WireType wire) {
  DZ_CHECK(wire == WireType::kF32 || wire == WireType::kBf16, "all_reduce_sum sums floats");
  const int ranks = size();
  const auto n = static_cast<int64_t>(data.size());
  if (ranks == 1) {
    if (wire == WireType::kBf16) {
      for (float& x : data) x = formats::round_to_bf16(x);
    }
    stats_->add({layer, CommOp::kAllReduce}, 0, 0);
    return;
  }
  // Sent: every other chunk, then mine to every other rank: as much as is received.
  const int64_t received = all_reduce_received_bytes(n, ranks, rank(), wire);
  stats_->add({layer, CommOp::kAllReduce}, received, received);
  if (ranks == 2) {
    // Two ranks: one all-gather of both partial vectors, summed on each in rank order: the same
    // bits and bytes as the general form below (n·s received), in one MPI call instead of two
    // (most of a small decode all-reduce's time, docs/performance.md).
    sum_all_parts(data, wire, layer);
    return;
  }
  // Reduce-scatter as an all-to-all of chunks summed here in rank order, then an all-gather: each
  // element is reduced once, so every rank holds the same bits, and the order does not depend on
  // the algorithm MPI picks for the message size.
  const std::vector<int64_t> chunks = even_split(n, ranks);
  std::vector<float> reduced = sum_my_chunk(data, wire, chunks, CommOp::kAllReduce, layer);
  if (wire == WireType::kF32) {
    do_all_gather(reduced.data(), data.data(), chunks, wire, CommOp::kAllReduce, layer);
  } else {
    std::vector<uint16_t> mine_bf16(reduced.size());
    for (size_t i = 0; i < reduced.size(); ++i) mine_bf16[i] = formats::encode_bf16(reduced[i]);
    std::vector<uint16_t> gathered(static_cast<size_t>(n));
    do_all_gather(mine_bf16.data(), gathered.data(), chunks, wire, CommOp::kAllReduce, layer);
    for (int64_t i = 0; i < n; ++i)
      data[i] = formats::decode_bf16(gathered[static_cast<size_t>(i)]);
  }
}

void Comm::sum_all_parts(std::span<float> data, WireType wire, int layer) {
  const int ranks = size();
  const auto n = static_cast<int64_t>(data.size());
  const std::vector<int64_t> whole(static_cast<size_t>(ranks), n);
  std::vector<float> sum(data.size(), 0.0f);
  if (wire == WireType::kF32) {
    std::vector<float> parts(data.size() * static_cast<size_t>(ranks));
    do_all_gather(data.data(), parts.data(), whole, wire, CommOp::kAllReduce, layer);
    for (int source = 0; source < ranks; ++source)
      for (int64_t i = 0; i < n; ++i)
        sum[static_cast<size_t>(i)] += parts[static_cast<size_t>(source * n + i)];
    std::copy(sum.begin(), sum.end(), data.begin());
    return;
  }
  std::vector<uint16_t> encoded(data.size());
  for (size_t i = 0; i < data.size(); ++i) encoded[i] = formats::encode_bf16(data[i]);
  std::vector<uint16_t> parts(data.size() * static_cast<size_t>(ranks));
  do_all_gather(encoded.data(), parts.data(), whole, wire, CommOp::kAllReduce, layer);
  for (int source = 0; source < ranks; ++source)
    for (int64_t i = 0; i < n; ++i)
      sum[static_cast<size_t>(i)] +=
          formats::decode_bf16(parts[static_cast<size_t>(source * n + i)]);
  for (int64_t i = 0; i < n; ++i)
    data[static_cast<size_t>(i)] = formats::round_to_bf16(sum[static_cast<size_t>(i)]);
}

std::vector<float> Comm::sum_my_chunk(std::span<const float> send, WireType wire,
                                      std::span<const int64_t> chunks, CommOp op, int layer) {
  const int ranks = size();
  const int64_t mine = chunks[static_cast<size_t>(rank())];
  const std::vector<int64_t> recv_counts(static_cast<size_t>(ranks), mine);
  std::vector<float> sum(static_cast<size_t>(mine), 0.0f);
  if (wire == WireType::kF32) {
    std::vector<float> parts(static_cast<size_t>(mine * ranks));
    do_all_to_all(send.data(), chunks, parts.data(), recv_counts, wire, op, layer);
    for (int source = 0; source < ranks; ++source)
      for (int64_t i = 0; i < mine; ++i)
        sum[static_cast<size_t>(i)] += parts[static_cast<size_t>(source * mine + i)];
  } else {
    std::vector<uint16_t> encoded(send.size());
    for (size_t i = 0; i < send.size(); ++i) encoded[i] = formats::encode_bf16(send[i]);
    std::vector<uint16_t> parts(static_cast<size_t>(mine * ranks));
    do_all_to_all(encoded.data(), chunks, parts.data(), recv_counts, wire, op, layer);
    for (int source = 0; source < ranks; ++source)
      for (int64_t i = 0; i < mine; ++i)
        sum[static_cast<size_t>(i)] +=
            formats::decode_bf16(parts[static_cast<size_t>(source * mine + i)]);
  }
  return sum;
}

void Comm::all_gather(std::span<const std::byte> send, std::span<std::byte> recv,
                      std::span<const int64_t> counts, WireType type, int layer) {
  check_counts(counts, size(), "all_gather");
  const int64_t elem = wire_type_bytes(type);
  const int64_t mine = counts[static_cast<size_t>(rank())];
  DZ_CHECK(static_cast<int64_t>(send.size()) == mine * elem, "all_gather: send size");
  DZ_CHECK(static_cast<int64_t>(recv.size()) == sum_of(counts) * elem, "all_gather: recv size");
  do_all_gather(send.data(), recv.data(), counts, type, CommOp::kAllGather, layer);
  const int64_t others = sum_of(counts) - mine;
  stats_->add({layer, CommOp::kAllGather}, (size() - 1) * mine * elem, others * elem);
}

void Comm::reduce_scatter_sum(std::span<const float> send, std::span<float> recv,
                              std::span<const int64_t> counts, int layer) {
  check_counts(counts, size(), "reduce_scatter_sum");
  const int ranks = size();
  const int64_t mine = counts[static_cast<size_t>(rank())];
  DZ_CHECK(static_cast<int64_t>(send.size()) == sum_of(counts), "reduce_scatter: send size");
  DZ_CHECK(static_cast<int64_t>(recv.size()) == mine, "reduce_scatter: recv size");
  const std::vector<float> reduced =
      sum_my_chunk(send, WireType::kF32, counts, CommOp::kReduceScatter, layer);
  std::copy(reduced.begin(), reduced.end(), recv.begin());
  const int64_t elem = wire_type_bytes(WireType::kF32);
  stats_->add({layer, CommOp::kReduceScatter}, (sum_of(counts) - mine) * elem,
              (ranks - 1) * mine * elem);
}

void Comm::all_to_all(std::span<const std::byte> send, std::span<const int64_t> send_counts,
                      std::span<std::byte> recv, std::span<const int64_t> recv_counts,
                      WireType type, int layer) {
  check_counts(send_counts, size(), "all_to_all send");
  check_counts(recv_counts, size(), "all_to_all recv");
  const int64_t elem = wire_type_bytes(type);
  DZ_CHECK(static_cast<int64_t>(send.size()) == sum_of(send_counts) * elem, "all_to_all send");
  DZ_CHECK(static_cast<int64_t>(recv.size()) == sum_of(recv_counts) * elem, "all_to_all recv");
  do_all_to_all(send.data(), send_counts, recv.data(), recv_counts, type, CommOp::kAllToAll, layer);
  const auto self = static_cast<size_t>(rank());
  stats_->add({layer, CommOp::kAllToAll}, (sum_of(send_counts) - send_counts[self]) * elem,
              (sum_of(recv_counts) - recv_counts[self]) * elem);
}

std::vector<int64_t> Comm::exchange_counts(std::span<const int64_t> send_counts, int layer) {
  check_counts(send_counts, size(), "exchange_counts");
  const std::vector<int64_t> ones(static_cast<size_t>(size()), 2);  // one int64 as two int32
  std::vector<int64_t> recv_counts(static_cast<size_t>(size()));
  do_all_to_all(send_counts.data(), ones, recv_counts.data(), ones, WireType::kI32,
                CommOp::kAllToAll, layer);
  const int64_t bytes = (size() - 1) * 8;
  stats_->add({layer, CommOp::kAllToAll}, bytes, bytes);
  return recv_counts;
}

void Comm::broadcast(std::span<std::byte> data, int root, int layer, Wait wait) {
  DZ_CHECK(root >= 0 && root < size(), "broadcast root {}", root);
  do_broadcast(data.data(), static_cast<int64_t>(data.size()), root, layer, wait);
  const auto bytes = static_cast<int64_t>(data.size());
  stats_->add({layer, CommOp::kBroadcast}, rank() == root ? (size() - 1) * bytes : 0,
              rank() == root ? 0 : bytes);
}

void Comm::gather(std::span<const std::byte> send, std::span<std::byte> recv,
                  std::span<const int64_t> counts, WireType type, int root, int layer) {
  check_counts(counts, size(), "gather");
  DZ_CHECK(root >= 0 && root < size(), "gather root {}", root);
  const int64_t elem = wire_type_bytes(type);
  const int64_t mine = counts[static_cast<size_t>(rank())];
  DZ_CHECK(static_cast<int64_t>(send.size()) == mine * elem, "gather: send size");
  if (rank() == root) {
    DZ_CHECK(static_cast<int64_t>(recv.size()) == sum_of(counts) * elem, "gather: recv size");
  }
  do_gather(send.data(), recv.data(), counts, type, root, layer);
  const bool is_root = rank() == root;
  stats_->add({layer, CommOp::kGather}, is_root ? 0 : mine * elem,
              is_root ? (sum_of(counts) - mine) * elem : 0);
}

// SoloComm: one rank, so every "collective" is a copy of this rank's own data.

void SoloComm::do_all_gather(const void* send, void* recv, std::span<const int64_t> counts,
                             WireType type, CommOp, int) {
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(counts[0] * wire_type_bytes(type)));
}

void SoloComm::do_all_to_all(const void* send, std::span<const int64_t> send_counts, void* recv,
                             std::span<const int64_t>, WireType type, CommOp, int) {
  if (send != recv) {
    std::memcpy(recv, send, static_cast<size_t>(send_counts[0] * wire_type_bytes(type)));
  }
}

void SoloComm::do_broadcast(void*, int64_t, int, int, Wait) {}

void SoloComm::do_gather(const void* send, void* recv, std::span<const int64_t> counts,
                         WireType type, int, int) {
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(counts[0] * wire_type_bytes(type)));
}

}  // namespace dz::dist
