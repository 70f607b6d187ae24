#include "dayzero/core/tensor_view.h"

#include <fmt/format.h>

namespace dz {

Shape::Shape(std::initializer_list<int64_t> dims) {
  DZ_CHECK(dims.size() <= kMaxRank, "rank {} > {}", dims.size(), kMaxRank);
  for (int64_t dim : dims) push_back(dim);
}

int64_t Shape::num_elems() const {
  int64_t count = 1;
  for (int axis = 0; axis < rank_; ++axis) count *= dims_[static_cast<size_t>(axis)];
  return count;
}

void Shape::push_back(int64_t dim) {
  DZ_CHECK(rank_ < kMaxRank, "rank exceeds {}", kMaxRank);
  dims_[static_cast<size_t>(rank_++)] = dim;
}

bool Shape::operator==(const Shape& other) const {
  if (rank_ != other.rank_) return false;
  for (int axis = 0; axis < rank_; ++axis)
    if ((*this)[axis] != other[axis]) return false;
  return true;
}

std::string Shape::to_string() const {
  std::string text = "[";
  for (int axis = 0; axis < rank_; ++axis)
    text += fmt::format("{}{}", axis ? ", " : "", (*this)[axis]);
  return text + "]";
}

Shape contiguous_strides(const Shape& shape) {
  Shape strides;
  for (int axis = 0; axis < shape.rank(); ++axis) strides.push_back(1);
  for (int axis = shape.rank() - 2; axis >= 0; --axis)
    strides[axis] = strides[axis + 1] * shape[axis + 1];
  return strides;
}

TensorView::TensorView(void* data, DType dtype, Shape shape)
    : TensorView(data, dtype, shape, contiguous_strides(shape)) {}

TensorView::TensorView(void* data, DType dtype, Shape shape, Shape strides_elems)
    : data_(data), dtype_(dtype), shape_(shape), strides_(strides_elems) {
  DZ_CHECK(shape.rank() == strides_elems.rank(), "shape {} vs strides {}", shape.to_string(),
           strides_elems.to_string());
}

int64_t TensorView::size_bytes() const { return (num_elems() * dtype_bits(dtype_) + 7) / 8; }

bool TensorView::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

TensorView TensorView::slice0(int64_t i) const {
  DZ_CHECK(rank() >= 1 && i >= 0 && i < dim(0), "slice0({}) of {}", i, shape_.to_string());
  DZ_CHECK(dtype_bits(dtype_) % 8 == 0, "slice0 of a sub-byte tensor");
  Shape shape, strides;
  for (int axis = 1; axis < rank(); ++axis) {
    shape.push_back(shape_[axis]);
    strides.push_back(strides_[axis]);
  }
  auto* base = static_cast<std::byte*>(data_) + i * strides_[0] * (dtype_bits(dtype_) / 8);
  return TensorView(base, dtype_, shape, strides);
}

}  // namespace dz
