#pragma once
// A bump allocator for one engine step (docs/style.md §6): sized once at startup, reset after every
// step, never grows. Running out is a broken sizing invariant, not a request error.

#include <cstddef>
#include <span>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/tensor_view.h"

namespace dz {

class Arena {
 public:
  explicit Arena(size_t capacity_bytes);

  // `size_bytes` bytes aligned to `alignment` (a power of two, at most 64).
  std::span<std::byte> allocate(size_t size_bytes, size_t alignment = kBufferAlignment);
  // A contiguous tensor view carved from the arena; its contents are unspecified.
  TensorView allocate_tensor(DType dtype, Shape shape);
  void reset() { used_bytes_ = 0; }
  // A scope inside a step: what was allocated after mark() is given back by release(mark), so
  // a loop of calls that each take a workspace needs room for one, not for all.
  size_t mark() const { return used_bytes_; }
  void release(size_t mark);

  // num_elems floats (64-byte aligned, contents unspecified).
  float* allocate_floats(int64_t num_elems) {
    return reinterpret_cast<float*>(
        allocate(static_cast<size_t>(num_elems) * sizeof(float)).data());
  }

  size_t capacity_bytes() const { return buffer_.size_bytes(); }
  size_t used_bytes() const { return used_bytes_; }
  size_t peak_bytes() const { return peak_bytes_; }

 private:
  AlignedBuffer buffer_;
  size_t used_bytes_ = 0;
  size_t peak_bytes_ = 0;
};

}  // namespace dz
