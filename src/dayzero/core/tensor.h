#pragma once
// An owning contiguous tensor: an AlignedBuffer plus the view of it. Move-only; copies are explicit.

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/tensor_view.h"

namespace dz {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, Shape shape);  // zero-filled

  const TensorView& view() const { return view_; }
  void* data() const { return view_.data(); }
  template <typename T>
  T* data_as() const {
    return view_.data_as<T>();
  }
  DType dtype() const { return view_.dtype(); }
  const Shape& shape() const { return view_.shape(); }
  int64_t num_elems() const { return view_.num_elems(); }
  int64_t size_bytes() const { return view_.size_bytes(); }

  // A deep copy of a contiguous view.
  static Tensor copy_of(const TensorView& source);

 private:
  AlignedBuffer buffer_;
  TensorView view_;
};

}  // namespace dz
