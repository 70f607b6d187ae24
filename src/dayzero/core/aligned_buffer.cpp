#include "dayzero/core/aligned_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace dz {

AlignedBuffer::AlignedBuffer(size_t size_bytes) : size_bytes_(size_bytes) {
  if (size_bytes == 0) return;
  size_t rounded = (size_bytes + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
  data_ = static_cast<std::byte*>(std::aligned_alloc(kBufferAlignment, rounded));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, rounded);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

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
