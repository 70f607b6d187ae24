#pragma once
// The tensors a recipe expects in a checkpoint: full names as published, stored shapes, accepted
// dtypes and the component each belongs to (docs/style.md §4). A quantized linear expands into its
// stored tensors: FP8 block → `weight` F8_E4M3 [out, in] + `weight_scale_inv` F32
// [ceil(out/128), ceil(in/128)]; MXFP4 → `weight_packed` U8 [out, in/2] + `weight_scale` U8
// [out, in/32] (docs/formats.md §3.3–3.4).

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dayzero/core/dtype.h"
#include "dayzero/core/tensor_view.h"

namespace dz::model {

enum class Component : unsigned char {
  kEmbedding,
  kAttention,  // MLA projections and norms
  kIndexer,    // DSA lightning indexer
  kKda,
  kDenseMlp,
  kRouter,  // gate weight and e_score_correction_bias
  kRoutedExperts,
  kSharedExperts,
  kLatentMoe,  // latent down/up projections and latent norm
  kAttnRes,
  kNorms,  // input/post-attention/final norms
  kLmHead,
  kMtp,  // MTP-only tensors (enorm, hnorm, eh_proj, shared_head); MTP decoder layers keep
         // their own components and carry is_mtp
  kVision,
  kHyperConnections,  // mHC stream mixing (GLM-5.3-Flash; analysis only so far)
};
std::string_view component_name(Component component);  // "routed_experts", ...

enum class TensorRole : unsigned char {
  kPlain,        // float tensor used as is
  kFp8Weight,    // F8_E4M3 codes of a block-scaled linear
  kFp8Scale,     // its F32 weight_scale_inv
  kMxfp4Packed,  // two E2M1 codes per byte
  kMxfp4Scale,   // E8M0 codes, one per group of 32
};

// How a tensor splits across tensor- and expert-parallel ranks. A weight [out, in] splits by
// column along out (each rank computes its slice of the outputs) or by row along in (each rank
// a partial sum, all-reduced); per-head vectors follow their heads.
enum class Split : unsigned char {
  kReplicated,  // every rank holds all of it
  kColumn,      // along dim 0: output features, or heads
  kRow,         // along the last dim: input features; the output is all-reduced
  kByHead,      // a per-head parameter whose head axis is not dim 0 (KDA's A_log)
  kByExpert,    // routed experts: whole experts per rank
  kByVocab,     // embedding and head rows
};
std::string_view split_name(Split split);  // "column", ...

// How one linear layer's weight is stored.
enum class WeightFormat : unsigned char {
  kPlain,            // `.weight`, any float dtype (published BF16)
  kFp8Block,         // `.weight` + `.weight_scale_inv`
  kMxfp4,            // `.weight_packed` + `.weight_scale`
  kFp8BlockOrPlain,  // either of the first two, decided by the stored dtype (DeepSeek eh_proj)
};

struct TensorSpec {
  std::string name = {};
  Shape shape = {};                // as stored, PyTorch order
  std::vector<DType> dtypes = {};  // accepted; dtypes[0] is the published one
  TensorRole role = TensorRole::kPlain;
  Component component = Component::kNorms;
  Split split = Split::kReplicated;  // scales split as their weight
  int layer_id = -1;                 // -1 for globals
  bool is_mtp = false;
  bool is_routed_expert = false;
  // Set on the weight_scale_inv of a kFp8BlockOrPlain linear: expected iff the weight is FP8.
  bool only_if_weight_is_fp8 = false;
};

// Companion weight of a scale name: "x.weight_scale_inv" → "x.weight".
std::string weight_of_scale(const std::string& scale_name);

// Logical parameters a stored tensor holds: elements, ×2 for packed MXFP4, 0 for scales.
int64_t logical_params(const TensorSpec& spec, const Shape& stored_shape);

class TensorTable {
 public:
  // Where the next tensors belong (TensorVisitor::Scope sets it).
  struct Scope {
    Component component = Component::kNorms;
    int layer_id = -1;
    bool is_mtp = false;
  };

  TensorTable(int64_t fp8_block_rows, int64_t fp8_block_cols, int64_t mxfp4_group_elems);

  // A float tensor stored as is; the loader accepts BF16, F16 or F32 (docs/formats.md §3.2).
  void add_float(std::string name, Shape shape, DType published, Split split, const Scope& scope);
  // A linear layer `module` with logical weight [out, in] (`module` has no ".weight").
  void add_linear(const std::string& module, int64_t out, int64_t in, WeightFormat format,
                  Split split, const Scope& scope);

  const std::vector<TensorSpec>& specs() const { return specs_; }
  const TensorSpec* find(std::string_view name) const;
  // False for the scale of a kFp8BlockOrPlain linear published plain: the layout has no such
  // tensor.
  bool in_published_layout(const TensorSpec& spec) const;
  // Module names of the linears stored as MXFP4 (for the ignore-list check).
  const std::vector<std::string>& mxfp4_modules() const { return mxfp4_modules_; }

 private:
  void push(TensorSpec spec);

  int64_t fp8_block_rows_;
  int64_t fp8_block_cols_;
  int64_t mxfp4_group_elems_;
  std::vector<TensorSpec> specs_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::string> mxfp4_modules_;
};

}  // namespace dz::model
