#include "dayzero/kernels/cpu_features.h"

#include <spdlog/spdlog.h>

namespace dz::kernels {

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f;
    f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
    f.avx512_vbmi = f.avx512 && __builtin_cpu_supports("avx512vbmi");
    f.avx512_bf16 = f.avx512 && __builtin_cpu_supports("avx512bf16");
    spdlog::debug("kernels: avx512 {}, avx512_vbmi {}, avx512_bf16 {}", f.avx512, f.avx512_vbmi,
                  f.avx512_bf16);
    return f;
  }();
  return features;
}

}  // namespace dz::kernels
