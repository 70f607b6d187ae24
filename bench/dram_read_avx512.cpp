// The DRAM read loop of `dayzero bench limits`: sums a buffer far larger than the L3 with AVX-512
// loads and eight independent accumulators, so the loop is bound by memory, not by add latency.

#include <immintrin.h>

#include <cstddef>

namespace dz::bench {

float sum_floats_avx512(const float* data, size_t num_floats) {
  __m512 acc[8];
  for (auto& a : acc) a = _mm512_setzero_ps();
  size_t i = 0;
  for (; i + 128 <= num_floats; i += 128)
    for (int lane = 0; lane < 8; ++lane)
      acc[lane] = _mm512_add_ps(acc[lane], _mm512_load_ps(data + i + 16 * lane));
  // Reduce through memory: GCC 12 warns falsely inside _mm512_reduce_add_ps (-Wuninitialized).
  alignas(64) float lanes[16];
  __m512 sum = acc[0];
  for (int lane = 1; lane < 8; ++lane) sum = _mm512_add_ps(sum, acc[lane]);
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float value : lanes) total += value;
  for (; i < num_floats; ++i) total += data[i];
  return total;
}

}  // namespace dz::bench
