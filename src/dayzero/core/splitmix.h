#pragma once
// splitmix64: a tiny random generator, fast enough to fill GiB of synthetic weights and caches
// (model/synthetic_model.cpp, bench/model_sweep.cpp), giving the same numbers on every machine
// (std:: distributions do not promise that).

#include <cstdint>

namespace dz {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [−√3·stddev, √3·stddev): mean 0, the given standard deviation.
  float uniform(float stddev) {
    const float u = static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return (2.0f * u - 1.0f) * 1.7320508f * stddev;
  }

 private:
  uint64_t state_;
};

}  // namespace dz
