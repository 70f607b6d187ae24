#pragma once
// Model weights packed together into large anonymous mappings that are 2 MiB aligned and advised
// for transparent huge pages (MADV_HUGEPAGE). A decode step streams every weight once; on 4 KiB
// pages a 1–8 MiB weight matrix crosses hundreds of pages, each a TLB miss and a point where the
// hardware prefetchers stop (a batch-1 step of the DeepSeek-V2-Lite shape ran ≈ 20 % slower on
// AMD Zen 5: docs/performance.md). One mapping per weight would start at any 4 KiB boundary, so
// few of its 2 MiB ranges could become huge pages: weights share slabs instead, allocated one after
// another, and a slab is unmapped when the last weight in it is freed: space freed earlier is not
// reused, so the pool is for buffers that live as long as their model. Memory is zero until
// written; untouched slab space costs address space only.

#include <cstddef>

namespace dz::weight_pool {

struct Slab;

struct Allocation {
  std::byte* data = nullptr;  // 64-byte aligned, zero-filled
  Slab* slab = nullptr;       // hand back to release() once
};

// Thread-safe. Throws std::bad_alloc when no mapping can be made; bytes must be > 0.
Allocation allocate(size_t bytes);
void release(Slab* slab);

// Slabs now mapped (tests).
int live_slabs();

}  // namespace dz::weight_pool
