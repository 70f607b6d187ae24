#pragma once
// One walk over the tensors of a block, written once per block (model/blocks/*) and composed by
// the recipes (model/arch/*). The same walk declares the tensors (TensorTableBuilder: the table
// `inspect` validates against and the loader trusts) and loads them (WeightReader), so a tensor's
// name, shape, accepted formats and split across ranks are one fact
// (docs/adding_an_architecture.md).
//
// A block names its tensors relative to the prefix of the enclosing Scope ("model.layers.3." +
// "self_attn." + "q_a_proj"); the visitor supplies the rest.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/dtype.h"
#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/tensor_table.h"

namespace dz::model {

class Embedding;

// Whether a linear follows the checkpoint's quantization or is always stored as plain floats
// (routers, the indexer's head weights and AttnRes projections are BF16 in every release).
enum class Quantizable : unsigned char { kYes, kNo };

class TensorVisitor {
 public:
  virtual ~TensorVisitor() = default;

  // Where the tensors visited while a Scope lives belong: its prefix is appended to the
  // enclosing one; component, layer and MTP flag replace the enclosing ones when given.
  struct Place {
    std::string_view prefix = {};
    std::optional<Component> component = {};
    std::optional<int> layer_id = {};
    std::optional<bool> is_mtp = {};
  };
  class [[nodiscard]] Scope {
   public:
    Scope(TensorVisitor& visitor, const Place& place);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    TensorVisitor& visitor_;
    std::string saved_prefix_;
    TensorTable::Scope saved_scope_;
  };

  // A linear layer `name` with logical weight [out, in].
  virtual void linear(std::string_view name, int64_t out, int64_t in, Split split,
                      Quantizable quantizable, kernels::LinearWeight& weight) = 0;
  // A float tensor stored as `shape` (any float dtype; `published` is what releases store),
  // widened to FP32 and flattened.
  virtual void floats(std::string_view name, const Shape& shape, DType published, Split split,
                      std::vector<float>& values) = 0;
  // A token embedding table [rows, dim], read in place from the mapping.
  virtual void embedding(std::string_view name, int64_t rows, int64_t dim, Embedding& table) = 0;
  // The output head tied to an embedding table declared elsewhere (`table_module`, relative to
  // the current prefix, without ".weight"): nothing new is declared; the table loads as a linear.
  virtual void tied_linear(std::string_view table_module, kernels::LinearWeight& weight) = 0;
  // A table [rows, dim] published as a copy of `original` (a full name already visited): loaded
  // only when its bytes differ, otherwise `copy` stays empty and the original serves.
  virtual void embedding_copy(std::string_view name, int64_t rows, int64_t dim,
                              const std::string& original, std::optional<Embedding>& copy) = 0;
  virtual void linear_copy(std::string_view name, int64_t out, int64_t in,
                           const std::string& original,
                           std::optional<kernels::LinearWeight>& copy) = 0;

  // Whether routed expert `expert` of `num_experts` is visited on this rank: all of them, except
  // when a WeightReader loads one rank's share (docs/parallel.md §1).
  virtual bool holds_expert(int64_t /*expert*/, int64_t /*num_experts*/) const { return true; }

  // The full name of `name` under the current prefix.
  std::string full_name(std::string_view name) const;

 protected:
  const TensorTable::Scope& scope() const { return scope_; }

 private:
  std::string prefix_;
  TensorTable::Scope scope_;
};

}  // namespace dz::model
