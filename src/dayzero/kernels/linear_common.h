#pragma once
// What the linear weight formats (linear_bf16.h, linear_fp8_block.h, linear_mxfp4.h) share outside
// oneDNN: the check their loaders run on a weight matrix, and the per-thread buffers their forwards
// convert activations into. Internal to kernels/.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"

namespace dz::kernels::detail {

// A weight matrix must be rank 2 [out, in], non-empty, with contiguous columns; `what` names it in
// the error.
Status check_matrix(const TensorView& view, std::string_view what);

// buffer's storage, grown (with a quarter to spare) to at least size_bytes.
std::byte* ensure(AlignedBuffer& buffer, size_t size_bytes);

// The calling thread's buffers for activations as BF16 codes and as BF16-valued floats. Contents
// never outlive one forward() call, so they carry no state between calls.
struct ActivationScratch {
  AlignedBuffer bf16, f32;
  AlignedBuffer mxint8;  // MXINT8 activations in the VNNI GEMV's layout (linear_kernels.h)
};
ActivationScratch& activation_scratch();

// Converts x [num_elems] to BF16 codes (bf16) and/or BF16-valued floats (f32) in parallel; either
// output may be null.
void round_activations(const ExecContext& ctx, const float* x, int64_t num_elems, uint16_t* bf16,
                       float* f32);

}  // namespace dz::kernels::detail
