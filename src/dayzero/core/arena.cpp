#include "dayzero/core/arena.h"

#include <algorithm>

#include "dayzero/core/check.h"

namespace dz {

Arena::Arena(size_t capacity_bytes) : buffer_(capacity_bytes) {}

std::span<std::byte> Arena::allocate(size_t size_bytes, size_t alignment) {
  DZ_CHECK(alignment > 0 && (alignment & (alignment - 1)) == 0 && alignment <= kBufferAlignment,
           "alignment {}", alignment);
  size_t begin = (used_bytes_ + alignment - 1) & ~(alignment - 1);
  DZ_CHECK(begin + size_bytes <= buffer_.size_bytes(),
           "arena of {} bytes exhausted: {} used, {} requested", buffer_.size_bytes(), used_bytes_,
           size_bytes);
  used_bytes_ = begin + size_bytes;
  peak_bytes_ = std::max(peak_bytes_, used_bytes_);
  return {buffer_.data() + begin, size_bytes};
}

void Arena::release(size_t mark) {
  DZ_CHECK(mark <= used_bytes_, "arena release to {} above the {} bytes in use", mark, used_bytes_);
  used_bytes_ = mark;
}

TensorView Arena::allocate_tensor(DType dtype, Shape shape) {
  TensorView probe(nullptr, dtype, shape);
  auto bytes = allocate(static_cast<size_t>(probe.size_bytes()));
  return TensorView(bytes.data(), dtype, shape);
}

}  // namespace dz
