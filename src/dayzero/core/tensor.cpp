#include "dayzero/core/tensor.h"

#include <cstring>

namespace dz {

Tensor::Tensor(DType dtype, Shape shape) {
  TensorView probe(nullptr, dtype, shape);
  buffer_ = AlignedBuffer(static_cast<size_t>(probe.size_bytes()));
  view_ = TensorView(buffer_.data(), dtype, shape);
}

Tensor Tensor::copy_of(const TensorView& source) {
  DZ_CHECK(source.is_contiguous(), "copy_of needs a contiguous view");
  Tensor copy(source.dtype(), source.shape());
  if (copy.size_bytes() > 0)
    std::memcpy(copy.data(), source.data(), static_cast<size_t>(copy.size_bytes()));
  return copy;
}

}  // namespace dz
