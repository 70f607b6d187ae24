#include <bit>
#include <cmath>

#include "dayzero/core/check.h"
#include "dayzero/kernels/hadamard.h"

namespace dz::kernels {

void hadamard_ref(std::span<float> x, int64_t n) {
  DZ_CHECK(n >= 1 && std::has_single_bit(static_cast<uint64_t>(n)), "n = {} is not a power of two",
           n);
  DZ_CHECK(x.size() % static_cast<size_t>(n) == 0, "{} values is not a multiple of n = {}",
           x.size(), n);
  // fl32 of the exact 1/sqrt(n), rounded once from FP64.
  const auto inv_sqrt_n = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
  for (size_t row_begin = 0; row_begin < x.size(); row_begin += static_cast<size_t>(n)) {
    float* row = x.data() + row_begin;
    for (int64_t h = 1; h < n; h *= 2) {
      for (int64_t pair_begin = 0; pair_begin < n; pair_begin += 2 * h) {
        for (int64_t i = pair_begin; i < pair_begin + h; ++i) {
          const float a = row[i];
          const float b = row[i + h];
          row[i] = a + b;
          row[i + h] = a - b;
        }
      }
    }
    for (int64_t i = 0; i < n; ++i) row[i] *= inv_sqrt_n;
  }
}

}  // namespace dz::kernels
