#pragma once
// A non-owning view of a strided tensor: dtype, shape, strides (in elements), pointer. Shapes are
// in PyTorch order, row-major, last axis contiguous (docs/style.md §14). Views never free.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "dayzero/core/check.h"
#include "dayzero/core/dtype.h"

namespace dz {

inline constexpr int kMaxRank = 6;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims);

  int rank() const { return rank_; }
  int64_t operator[](int axis) const { return dims_[static_cast<size_t>(axis)]; }
  int64_t& operator[](int axis) { return dims_[static_cast<size_t>(axis)]; }
  int64_t num_elems() const;
  void push_back(int64_t dim);
  bool operator==(const Shape& other) const;
  std::string to_string() const;  // "[2, 3]"

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

class TensorView {
 public:
  TensorView() = default;
  // A contiguous row-major view.
  TensorView(void* data, DType dtype, Shape shape);
  TensorView(void* data, DType dtype, Shape shape, Shape strides_elems);

  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int rank() const { return shape_.rank(); }
  int64_t dim(int axis) const { return shape_[axis]; }
  int64_t num_elems() const { return shape_.num_elems(); }
  // Bytes covered by a contiguous view (sub-byte dtypes round up).
  int64_t size_bytes() const;
  bool is_contiguous() const;

  // The view of index `i` along axis 0, rank reduced by one.
  TensorView slice0(int64_t i) const;

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::kF32;
  Shape shape_;
  Shape strides_;
};

// Row-major strides of a shape, in elements.
Shape contiguous_strides(const Shape& shape);

}  // namespace dz
