#pragma once
// The one way dayzero runs loops on several cores: OpenMP, with the thread count carried in an
// ExecContext that callers pass down explicitly (style.md §16: no global mutable state).

#include <algorithm>
#include <cstdint>

namespace dz {

struct ExecContext {
  int num_threads = 1;
};

// The number of hardware threads OpenMP would use by default.
int default_num_threads();

// Calls fn(begin, end) on disjoint ranges covering [0, num_items), each at least `grain_items`
// long (the last may be shorter), spread over ctx.num_threads threads. Serial when one range fits.
template <typename Fn>
void parallel_for(const ExecContext& ctx, int64_t num_items, int64_t grain_items, Fn&& fn) {
  if (num_items <= 0) return;
  grain_items = std::max<int64_t>(grain_items, 1);
  int64_t num_chunks = (num_items + grain_items - 1) / grain_items;
  int num_threads = static_cast<int>(std::min<int64_t>(ctx.num_threads, num_chunks));
  if (num_threads <= 1) {
    fn(int64_t{0}, num_items);
    return;
  }
#pragma omp parallel for num_threads(num_threads) schedule(static)
  for (int64_t chunk = 0; chunk < num_chunks; ++chunk) {
    int64_t begin = chunk * grain_items;
    fn(begin, std::min(begin + grain_items, num_items));
  }
}

}  // namespace dz
