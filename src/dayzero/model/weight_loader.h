#pragma once
// Reads a checkpoint's tensors by full name into the forms blocks take (docs/style.md §4): a
// kernels::LinearWeight per linear module, FP32 vectors for norms and biases, and the embedding
// table read in place from the mapping. Names, shapes and dtypes are checked against the recipe's
// TensorTable before loading (model/inspect.h); the loader still checks what it relies on and
// every error names the tensor.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"
#include "dayzero/formats/checkpoint.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/parallel_plan.h"
#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

// The part of a tensor one rank reads: the `index`-th of `ways` equal ranges along `axis` (the
// whole tensor when ways is 1). Tensor parallelism cuts a linear's rows (column-parallel) or
// columns (row-parallel), an embedding's vocabulary rows, a per-channel vector's channels.
struct TensorSlice {
  int axis = 0;
  int index = 0;
  int ways = 1;

  bool whole() const { return ways == 1; }
  int64_t begin(int64_t size) const { return size / ways * index; }
  int64_t end(int64_t size) const { return size / ways * (index + 1); }
};

// A token embedding table [vocab, d] left in the checkpoint's mapping (BF16, F16 or F32). Under a
// vocabulary split it holds rows [row_begin, row_begin + num_local_rows) and looks up only those:
// other ids give zero rows, which the ranks' all-reduce fills in.
class Embedding {
 public:
  static Result<Embedding> from_view(const TensorView& table, const std::string& name,
                                     const TensorSlice& rows = {});
  Embedding() = default;

  int64_t num_rows() const { return num_rows_; }  // the whole vocabulary
  int64_t dim() const { return dim_; }
  // out [token_ids.size(), dim] = rows as FP32 (exact: every stored dtype widens exactly); zeros
  // for ids outside this rank's rows. The caller checks ids against num_rows().
  void lookup(std::span<const int32_t> token_ids, float* out) const;
  // Whether both tables hold the same bytes (MTP copies of the main embedding and head).
  bool same_bytes(const Embedding& other) const;

 private:
  const std::byte* data_ = nullptr;  // borrowed from the mapping
  DType dtype_ = DType::kBF16;
  int64_t num_rows_ = 0;
  int64_t dim_ = 0;
  int64_t row_begin_ = 0;
  int64_t row_end_ = 0;
};

class WeightLoader {
 public:
  // `checkpoint` must outlive the loader and every Embedding it returns.
  // MXFP4 weights multiply `mxfp4_activations` (kernels/linear.h).
  WeightLoader(const formats::Checkpoint& checkpoint, const formats::QuantizationConfig& quant,
               kernels::Mxfp4Activations mxfp4_activations = kernels::Mxfp4Activations::kBf16);

  // `<module>.weight`: FP8 block-scaled when it is F8_E4M3 and `<module>.weight_scale_inv` exists
  // (block size from quantization_config, 128×128 when the config has none), plain float otherwise.
  // compressed-tensors MXFP4 (docs/formats.md §3.4) when `<module>.weight_packed` exists: with
  // `<module>.weight_scale`, under a kMxfp4CompressedTensors config, and without a global scale or
  // zero point (other schemes).
  // With a slice, only its rows (axis 0) or columns (axis 1) are read; an FP8 slice must not cut
  // a scale block that continues past it, an MXFP4 column slice must keep whole groups of 32.
  Result<kernels::LinearWeight> linear(const std::string& module,
                                       const TensorSlice& slice = {}) const;
  // Any float dtype, widened to FP32 and flattened; `num_elems` is what the caller expects.
  Result<std::vector<float>> floats(const std::string& name, int64_t num_elems) const;
  // The same, of a tensor stored as `shape`, cut by `slice` along its axis.
  Result<std::vector<float>> floats(const std::string& name, const Shape& shape,
                                    const TensorSlice& slice) const;
  Result<Embedding> embedding(const std::string& name, const TensorSlice& rows = {}) const;
  // Whether two tensors are stored with the same dtype, shape and bytes.
  bool same_bytes(const std::string& a, const std::string& b) const;

 private:
  Result<formats::CheckpointTensor> find(const std::string& name) const;
  Result<kernels::LinearWeight> mxfp4_linear(const std::string& module,
                                             const TensorSlice& slice) const;
  // A view that is aligned for its dtype: the mapping when it is, else a copy kept in `copy`.
  TensorView aligned_view(const formats::CheckpointTensor& tensor,
                          std::vector<std::byte>& copy) const;

  const formats::Checkpoint& checkpoint_;
  int64_t fp8_block_rows_ = 128;
  int64_t fp8_block_cols_ = 128;
  bool mxfp4_packed_ = false;  // the config is compressed-tensors MXFP4
  kernels::Mxfp4Activations mxfp4_activations_ = kernels::Mxfp4Activations::kBf16;
};

// The TensorVisitor that loads: a recipe's walk over its blocks fills their weights from the
// checkpoint. The first error is kept (naming the tensor) and the rest of the walk is skipped.
class WeightReader final : public TensorVisitor {
 public:
  // `shard`: which slice of each split tensor this rank reads (docs/parallel.md §1); the default
  // reads everything.
  explicit WeightReader(const WeightLoader& loader, RankShard shard = {})
      : loader_(loader), shard_(shard) {}

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

  bool holds_expert(int64_t expert, int64_t num_experts) const override;

  const Status& status() const { return status_; }

 private:
  template <typename T>
  void keep(Result<T> result, T& into);
  // The slice of a tensor of this split, `shape` as stored.
  TensorSlice slice_of(Split split, const Shape& shape) const;

  const WeightLoader& loader_;
  RankShard shard_;
  Status status_;
};

}  // namespace dz::model
