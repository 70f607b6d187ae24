#pragma once
// The one way dayzero runs loops on several cores: OpenMP, with the thread count carried in an
// ExecContext that callers pass down explicitly (docs/style.md §16: no global mutable state).

#include <algorithm>
#include <cstdint>

// ThreadSanitizer cannot see the barriers of GCC's OpenMP runtime (libgomp is not instrumented), so
// parallel_for tells it about the fork and the join itself: without that every region looks like
// a race between the forking thread and the workers. The region's shared-variable block, which
// the compiler writes just before the fork and the workers read before any statement of theirs
// runs, cannot be ordered that way: parallel_for's own accesses are left uninstrumented. fn stays
// instrumented (GCC and clang never inline across the attribute), so races inside it are found.
#if defined(__SANITIZE_THREAD__)
#define DZ_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define DZ_UNDER_TSAN 1
#endif
#endif
#ifdef DZ_UNDER_TSAN
#include <sanitizer/tsan_interface.h>
#define DZ_TSAN_RELEASE(addr) __tsan_release(addr)
#define DZ_TSAN_ACQUIRE(addr) __tsan_acquire(addr)
#define DZ_TSAN_UNINSTRUMENTED __attribute__((no_sanitize("thread")))
#else
#define DZ_TSAN_RELEASE(addr) static_cast<void>(addr)
#define DZ_TSAN_ACQUIRE(addr) static_cast<void>(addr)
#define DZ_TSAN_UNINSTRUMENTED
#endif

namespace dz {

struct ExecContext {
  int num_threads = 1;
};

// The number of hardware threads OpenMP would use by default.
int default_num_threads();

// Work a second thread must get before parallel_for wakes it: a fork and join cost 3–8 µs on the
// 2-vCPU machines (an empty region 2.7 µs; the first touch of the other core's activations on
// top), more than small loops take: the demo model forked 40 times a decode step for a few µs of
// work each (docs/performance.md, "Parallel regions of small operators"). In the kernels' own
// units: FLOPs, or bytes of weights read.
inline constexpr int64_t kMinParallelFlops = 1'000'000;
inline constexpr int64_t kMinParallelBytes = 1 << 20;

// The grain (items per range) for parallel_for that gives every range at least `min_work` when
// each item does `work_per_item`: 1 for items heavy enough on their own; a loop whose whole work is
// below min_work runs serially.
inline int64_t grain_for_work(int64_t work_per_item, int64_t min_work) {
  const int64_t per_item = std::max<int64_t>(work_per_item, 1);
  return std::max<int64_t>((min_work + per_item - 1) / per_item, 1);
}

// Calls fn(begin, end) on disjoint ranges covering [0, num_items), each at least `grain_items`
// long (the last may be shorter), spread over ctx.num_threads threads. Serial when one range fits.
template <typename Fn>
DZ_TSAN_UNINSTRUMENTED void parallel_for(const ExecContext& ctx, int64_t num_items,
                                         int64_t grain_items, Fn&& fn) {
  if (num_items <= 0) return;
  grain_items = std::max<int64_t>(grain_items, 1);
  int64_t num_chunks = (num_items + grain_items - 1) / grain_items;
  int num_threads = static_cast<int>(std::min<int64_t>(ctx.num_threads, num_chunks));
  if (num_threads <= 1) {
    fn(int64_t{0}, num_items);
    return;
  }
  char fork_edge = 0, join_edge = 0;  // their addresses name the region's edges for TSan
  DZ_TSAN_RELEASE(&fork_edge);
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    DZ_TSAN_ACQUIRE(&fork_edge);
    int64_t begin = chunk * grain_items;
    fn(begin, std::min(begin + grain_items, num_items));
    DZ_TSAN_RELEASE(&join_edge);
  }
  DZ_TSAN_ACQUIRE(&join_edge);
}

}  // namespace dz
