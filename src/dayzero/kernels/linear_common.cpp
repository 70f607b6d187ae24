#include "dayzero/kernels/linear_common.h"

#include "dayzero/kernels/linear_kernels.h"

#include <unistd.h>

#include <algorithm>

namespace dz::kernels::detail {

Status check_matrix(const TensorView& view, std::string_view what) {
  if (view.rank() != 2)
    return make_error(StatusCode::kInvalidArgument, "{}: expected rank 2 [out, in], found shape {}",
                      what, view.shape().to_string());
  if (view.dim(0) <= 0 || view.dim(1) <= 0)
    return make_error(StatusCode::kInvalidArgument, "{}: expected a non-empty [out, in], found {}",
                      what, view.shape().to_string());
  if (view.strides()[1] != 1 || view.strides()[0] < view.dim(1))
    return make_error(StatusCode::kInvalidArgument,
                      "{}: expected rows with contiguous columns, found strides {} for shape {}",
                      what, view.strides().to_string(), view.shape().to_string());
  return {};
}

std::byte* ensure(AlignedBuffer& buffer, size_t size_bytes) {
  if (buffer.size_bytes() < size_bytes) buffer = AlignedBuffer(size_bytes + size_bytes / 4);
  return buffer.data();
}

ActivationScratch& activation_scratch() {
  thread_local ActivationScratch scratch;
  return scratch;
}

void round_activations(const ExecContext& ctx, const float* x, int64_t num_elems, uint16_t* bf16,
                       float* f32) {
  parallel_for(ctx, num_elems, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    round_to_bf16_avx512(x + begin, end - begin, bf16 ? bf16 + begin : nullptr,
                         f32 ? f32 + begin : nullptr);
  });
}

namespace {

// The L1 data cache of this CPU (glibc reads it from CPUID); 32 KiB, the smallest on x86-64 parts
// with AVX-512, where it does not say.
int64_t l1d_bytes() {
  static const int64_t bytes = [] {
    const long reported = sysconf(_SC_LEVEL1_DCACHE_SIZE);
    return reported > 0 ? static_cast<int64_t>(reported) : int64_t{32768};
  }();
  return bytes;
}

}  // namespace

int64_t gemv_tokens_per_pass(int64_t x_bytes_per_token, int64_t l1_prefetch_bytes,
                             int64_t max_tokens) {
  const int64_t budget = l1d_bytes() - l1_prefetch_bytes - 1024;
  return std::clamp<int64_t>(budget / std::max<int64_t>(x_bytes_per_token, 1), 1, max_tokens);
}

}  // namespace dz::kernels::detail
