#include "dayzero/core/aligned_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace dz {

AlignedBuffer::AlignedBuffer(size_t size_bytes) : size_bytes_(size_bytes) {
  if (size_bytes == 0) return;
  size_t rounded = (size_bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  if (rounded >= kMappedBufferBytes) {
    // Page-aligned, and zero until written.
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    ::madvise(p, rounded, MADV_HUGEPAGE);  // fewer page faults where the kernel allows it
    data_ = static_cast<std::byte*>(p);
    mapped_bytes_ = rounded;
    return;
  }
  data_ = static_cast<std::byte*>(std::aligned_alloc(kBufferAlignment, rounded));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, rounded);
}

AlignedBuffer AlignedBuffer::for_weights(size_t size_bytes) {
  AlignedBuffer buffer;
  if (size_bytes == 0) return buffer;
  const weight_pool::Allocation allocation = weight_pool::allocate(size_bytes);
  buffer.data_ = allocation.data;
  buffer.size_bytes_ = size_bytes;
  buffer.slab_ = allocation.slab;
  return buffer;
}

void AlignedBuffer::release() {
  if (slab_ != nullptr)
    weight_pool::release(slab_);
  else if (mapped_bytes_ > 0)
    ::munmap(data_, mapped_bytes_);
  else
    std::free(data_);
  data_ = nullptr;
  size_bytes_ = 0;
  mapped_bytes_ = 0;
  slab_ = nullptr;
}

AlignedBuffer::~AlignedBuffer() {
  release();
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      slab_(std::exchange(other.slab_, nullptr)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    slab_ = std::exchange(other.slab_, nullptr);
  }
  return *this;
}

}  // namespace dz
