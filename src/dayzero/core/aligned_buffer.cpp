#include "dayzero/core/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace dz {
namespace {

// Buffers of 2 MiB or more start on a 2 MiB boundary and ask for transparent huge pages over their
// whole 2 MiB pages (the system default here is THP on madvise only). Weight matrices are streamed
// once per token: with 4 KiB pages each 4 KiB of a stream costs a TLB miss (a two-dimensional page
// walk under a hypervisor) and restarts the hardware prefetcher. FP8 GEMV over a 1 GiB set of
// [1408, 2048] matrices, 1 thread, same load: 6-8 GB/s per CPU second with 4 KiB pages, 14 with
// 2 MiB pages (the plain read loop 9 -> 14). Only whole 2 MiB pages inside the buffer are advised,
// and the buffer is zero-filled (every page touched) anyway, so no memory is added.
constexpr size_t kHugePageBytes = size_t{2} << 20;

}  // namespace

AlignedBuffer::AlignedBuffer(size_t size_bytes) : size_bytes_(size_bytes) {
  if (size_bytes == 0) return;
  size_t rounded = (size_bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  const bool huge = rounded >= kHugePageBytes;
  void* data = nullptr;
  if (posix_memalign(&data, huge ? kHugePageBytes : kBufferAlignment, rounded) != 0)
    throw std::bad_alloc();
  data_ = static_cast<std::byte*>(data);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: where the kernel has no THP, 4 KiB pages serve as before.
  if (huge) ::madvise(data, rounded / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
#endif
  std::memset(data_, 0, rounded);
}

AlignedBuffer::~AlignedBuffer() {
  std::free(data_);
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

}  // namespace dz
