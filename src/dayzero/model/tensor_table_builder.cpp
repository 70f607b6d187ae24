#include "dayzero/model/tensor_table_builder.h"

namespace dz::model {

TensorTableBuilder::TensorTableBuilder(TensorTable table,
                                       std::function<WeightFormat(Component)> quantized_format)
    : table_(std::move(table)), quantized_format_(std::move(quantized_format)) {}

void TensorTableBuilder::linear(std::string_view name, int64_t out, int64_t in, Split split,
                                Quantizable quantizable, kernels::LinearWeight& /*weight*/) {
  const WeightFormat format = quantizable == Quantizable::kYes
                                  ? quantized_format_(scope().component)
                                  : WeightFormat::kPlain;
  table_.add_linear(full_name(name), out, in, format, split, scope());
}

void TensorTableBuilder::floats(std::string_view name, const Shape& shape, DType published,
                                Split split, std::vector<float>& /*values*/) {
  table_.add_float(full_name(name), shape, published, split, scope());
}

void TensorTableBuilder::embedding(std::string_view name, int64_t rows, int64_t dim,
                                   Embedding& /*table*/) {
  table_.add_float(full_name(name), {rows, dim}, DType::kBF16, Split::kByVocab, scope());
}

void TensorTableBuilder::tied_linear(std::string_view /*table_module*/,
                                     kernels::LinearWeight& /*weight*/) {}

void TensorTableBuilder::embedding_copy(std::string_view name, int64_t rows, int64_t dim,
                                        const std::string& /*original*/,
                                        std::optional<Embedding>& /*copy*/) {
  table_.add_float(full_name(name), {rows, dim}, DType::kBF16, Split::kByVocab, scope());
}

void TensorTableBuilder::linear_copy(std::string_view name, int64_t out, int64_t in,
                                     const std::string& /*original*/,
                                     std::optional<kernels::LinearWeight>& /*copy*/) {
  // The copies are of BF16 tables (the MTP head): plain, whatever the quantization.
  table_.add_linear(full_name(name), out, in, WeightFormat::kPlain, Split::kByVocab, scope());
}

}  // namespace dz::model
