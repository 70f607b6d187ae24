#pragma once
// Owned, 64-byte aligned memory (one cache line, one AVX-512 register). Move-only. Buffers of
// kMappedBufferBytes or more are anonymous mappings, zero without being written: a 1 GiB KV cache
// costs nothing until its pages are used (a server, or a restarted worker, is ready at once).

#include <cstddef>
#include <cstdint>
#include <span>

#include "dayzero/core/weight_pool.h"

namespace dz {

inline constexpr size_t kBufferAlignment = 64;
inline constexpr size_t kMappedBufferBytes = size_t{1} << 20;

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t size_bytes);  // zero-filled
  // Zero-filled, from the weight pool (core/weight_pool.h): for weights, read every step.
  static AlignedBuffer for_weights(size_t size_bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size_bytes() const { return size_bytes_; }
  std::span<std::byte> bytes() { return {data_, size_bytes_}; }

  template <typename T>
  std::span<T> as_span() {
    return {reinterpret_cast<T*>(data_), size_bytes_ / sizeof(T)};
  }

 private:
  void release();

  std::byte* data_ = nullptr;
  size_t size_bytes_ = 0;
  size_t mapped_bytes_ = 0;            // > 0: data_ is a mapping of this length
  weight_pool::Slab* slab_ = nullptr;  // set: data_ is in this weight pool slab
};

}  // namespace dz
