#include "dayzero/kernels/hadamard.h"
#include "dayzero/core/check.h"
#include "dayzero/kernels/cpu_features.h"

namespace dz::kernels {

void hadamard(std::span<float> x, int64_t n) {
  if (n == 128 && cpu_features().avx512) {
    DZ_CHECK(x.size() % 128 == 0, "{} values is not a multiple of n = 128", x.size());
    return detail::hadamard128_avx512(x);
  }
  hadamard_ref(x, n);
}

}  // namespace dz::kernels
