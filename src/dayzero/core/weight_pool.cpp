#include "dayzero/core/weight_pool.h"

#include <sys/mman.h>

#include <cstdint>
#include <mutex>
#include <new>

#include "dayzero/core/weight_pool_asan.h"

namespace dz::weight_pool {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Address space per slab; a weight larger than this gets a slab of its own.
constexpr size_t kSlabBytes = size_t{256} << 20;
constexpr size_t kAlignment = 64;
// Under AddressSanitizer each buffer is followed by poisoned bytes, so reading past a weight's end
// is reported as it was when weights came from malloc.
constexpr size_t kRedZone = kAddressSanitizer ? 64 : 0;

size_t round_up(size_t x, size_t m) {
  return (x + m - 1) / m * m;
}

}  // namespace

struct Slab {
  std::byte* base = nullptr;  // 2 MiB aligned
  size_t size = 0;
  size_t used = 0;
  void* mapping = nullptr;  // the whole mapping, alignment slack included
  size_t mapping_bytes = 0;
  int live = 0;  // allocations not yet released
};

namespace {

std::mutex mutex;
Slab* current = nullptr;  // the slab new allocations come from
int num_slabs = 0;

Slab* map_slab(size_t size) {
  // Over-map by one huge page and keep the aligned part: mmap only promises 4 KiB alignment.
  const size_t mapping_bytes = size + kHugePage;
  void* mapping =
      ::mmap(nullptr, mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) throw std::bad_alloc();
  auto* base =
      reinterpret_cast<std::byte*>(round_up(reinterpret_cast<uintptr_t>(mapping), kHugePage));
  ::madvise(base, size, MADV_HUGEPAGE);  // advice only: without THP the slab stays on 4 KiB pages
  ++num_slabs;
  return new Slab{.base = base, .size = size, .mapping = mapping, .mapping_bytes = mapping_bytes};
}

void unmap_slab(Slab* slab) {
  unpoison(slab->base, slab->size);
  ::munmap(slab->mapping, slab->mapping_bytes);
  delete slab;
  --num_slabs;
}

}  // namespace

Allocation allocate(size_t bytes) {
  const size_t size = round_up(bytes, kAlignment) + kRedZone;
  const std::lock_guard lock(mutex);
  if (size > kSlabBytes) {
    Slab* own = map_slab(round_up(size, kHugePage));
    own->used = size;
    own->live = 1;
    poison(own->base + bytes, size - bytes);
    return {own->base, own};
  }
  if (current == nullptr || current->size - current->used < size) {
    // The old slab's tail stays unused: never touched, it holds no memory.
    current = map_slab(kSlabBytes);
  }
  std::byte* data = current->base + current->used;
  current->used += size;
  ++current->live;
  poison(data + bytes, size - bytes);
  return {data, current};
}

void release(Slab* slab) {
  const std::lock_guard lock(mutex);
  if (--slab->live > 0) return;
  if (slab == current) current = nullptr;
  unmap_slab(slab);
}

int live_slabs() {
  const std::lock_guard lock(mutex);
  return num_slabs;
}

}  // namespace dz::weight_pool
