#pragma once
// Inner loops of the tiled MLA attention kernels (private to kernels/): a generic variant and an
// AVX-512 one, chosen once from the CPU features (docs/style.md §5). Both accumulate in FP32.

#include <cstdint>

namespace dz::kernels::detail {

struct MlaVecOps {
  const char* name;
  // out[k] = Σ_c x[c] · rows[k·row_stride + c] for k < num_rows, c < dim.
  void (*dot_rows)(const float* x, const float* rows, int64_t row_stride, int64_t num_rows,
                   int64_t dim, float* out);
  // acc[c] += Σ_k p[k] · rows[k·row_stride + c] for c < dim.
  void (*accumulate_rows)(const float* p, const float* rows, int64_t row_stride, int64_t num_rows,
                          int64_t dim, float* acc);
};

MlaVecOps mla_vec_ops_generic();
MlaVecOps mla_vec_ops_avx512();  // only callable where the CPU has AVX-512 F
// The variant this CPU runs (AVX-512 when present), decided once.
const MlaVecOps& mla_vec_ops();

}  // namespace dz::kernels::detail
