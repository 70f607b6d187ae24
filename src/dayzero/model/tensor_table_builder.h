#pragma once
// The TensorVisitor that declares: a recipe's walk over its blocks becomes the TensorTable that
// `inspect` and the loader check a checkpoint against.

#include <functional>

#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

class TensorTableBuilder final : public TensorVisitor {
 public:
  // `quantized_format` says how the checkpoint stores the quantizable linears of a component
  // (kPlain when the component is not quantized).
  TensorTableBuilder(TensorTable table, std::function<WeightFormat(Component)> quantized_format);

  void linear(std::string_view name, int64_t out, int64_t in, Split split, Quantizable quantizable,
              kernels::LinearWeight& weight) override;
  void floats(std::string_view name, const Shape& shape, DType published, Split split,
              std::vector<float>& values) override;
  void embedding(std::string_view name, int64_t rows, int64_t dim, Embedding& table) override;
  void tied_linear(std::string_view table_module, kernels::LinearWeight& weight) override;
  void embedding_copy(std::string_view name, int64_t rows, int64_t dim, const std::string& original,
                      std::optional<Embedding>& copy) override;
  void linear_copy(std::string_view name, int64_t out, int64_t in, const std::string& original,
                   std::optional<kernels::LinearWeight>& copy) override;

  TensorTable take() && { return std::move(table_); }

 private:
  TensorTable table_;
  std::function<WeightFormat(Component)> quantized_format_;
};

}  // namespace dz::model
