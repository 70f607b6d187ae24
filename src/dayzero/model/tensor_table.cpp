#include "dayzero/model/tensor_table.h"

#include "dayzero/core/check.h"

namespace dz::model {
namespace {

const std::vector<DType> kFloatDTypes = {DType::kBF16, DType::kF16, DType::kF32};

std::vector<DType> float_dtypes(DType published) {
  std::vector<DType> out = {published};
  for (DType d : kFloatDTypes)
    if (d != published) out.push_back(d);
  return out;
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

std::string_view component_name(Component component) {
  switch (component) {
    case Component::kEmbedding:
      return "embedding";
    case Component::kAttention:
      return "attention";
    case Component::kIndexer:
      return "indexer";
    case Component::kKda:
      return "kda";
    case Component::kDenseMlp:
      return "dense_mlp";
    case Component::kRouter:
      return "router";
    case Component::kRoutedExperts:
      return "routed_experts";
    case Component::kSharedExperts:
      return "shared_experts";
    case Component::kLatentMoe:
      return "latent_moe";
    case Component::kAttnRes:
      return "attn_res";
    case Component::kNorms:
      return "norms";
    case Component::kLmHead:
      return "lm_head";
    case Component::kHyperConnections:
      return "hyper_connections";
    case Component::kMtp:
      return "mtp";
    case Component::kVision:
      return "vision";
  }
  return "?";
}

std::string_view split_name(Split split) {
  switch (split) {
    case Split::kReplicated:
      return "replicated";
    case Split::kColumn:
      return "column";
    case Split::kRow:
      return "row";
    case Split::kByHead:
      return "by_head";
    case Split::kByExpert:
      return "by_expert";
    case Split::kByVocab:
      return "by_vocab";
  }
  return "?";
}

int64_t logical_params(const TensorSpec& spec, const Shape& stored_shape) {
  switch (spec.role) {
    case TensorRole::kFp8Scale:
    case TensorRole::kMxfp4Scale:
      return 0;
    case TensorRole::kMxfp4Packed:
      return stored_shape.num_elems() * 2;
    case TensorRole::kPlain:
    case TensorRole::kFp8Weight:
      return stored_shape.num_elems();
  }
  return 0;
}

TensorTable::TensorTable(int64_t fp8_block_rows, int64_t fp8_block_cols, int64_t mxfp4_group_elems)
    : fp8_block_rows_(fp8_block_rows),
      fp8_block_cols_(fp8_block_cols),
      mxfp4_group_elems_(mxfp4_group_elems) {}

void TensorTable::push(TensorSpec spec) {
  auto [it, inserted] = index_.emplace(spec.name, specs_.size());
  DZ_CHECK(inserted);  // a recipe listing one name twice is a bug in the recipe
  specs_.push_back(std::move(spec));
}

void TensorTable::add_float(std::string name, Shape shape, DType published, Split split,
                            const Scope& scope) {
  push(TensorSpec{.name = std::move(name),
                  .shape = shape,
                  .dtypes = float_dtypes(published),
                  .role = TensorRole::kPlain,
                  .component = scope.component,
                  .split = split,
                  .layer_id = scope.layer_id,
                  .is_mtp = scope.is_mtp,
                  .is_routed_expert = scope.component == Component::kRoutedExperts});
}

void TensorTable::add_linear(const std::string& module, int64_t out, int64_t in,
                             WeightFormat format, Split split, const Scope& scope) {
  TensorSpec base{.component = scope.component,
                  .split = split,
                  .layer_id = scope.layer_id,
                  .is_mtp = scope.is_mtp,
                  .is_routed_expert = scope.component == Component::kRoutedExperts};
  switch (format) {
    case WeightFormat::kPlain:
      add_float(module + ".weight", {out, in}, DType::kBF16, split, scope);
      return;
    case WeightFormat::kFp8Block:
    case WeightFormat::kFp8BlockOrPlain: {
      TensorSpec weight = base;
      weight.name = module + ".weight";
      weight.shape = {out, in};
      weight.dtypes = {DType::kF8E4M3};
      if (format == WeightFormat::kFp8BlockOrPlain)
        weight.dtypes.insert(weight.dtypes.end(), kFloatDTypes.begin(), kFloatDTypes.end());
      weight.role = TensorRole::kFp8Weight;
      push(std::move(weight));
      TensorSpec scale = base;
      scale.name = module + ".weight_scale_inv";
      scale.shape = {ceil_div(out, fp8_block_rows_), ceil_div(in, fp8_block_cols_)};
      scale.dtypes = {DType::kF32};
      scale.role = TensorRole::kFp8Scale;
      scale.only_if_weight_is_fp8 = format == WeightFormat::kFp8BlockOrPlain;
      push(std::move(scale));
      return;
    }
    case WeightFormat::kMxfp4: {
      DZ_CHECK(in % mxfp4_group_elems_ == 0);  // recipes check in-dims when parsing the config
      mxfp4_modules_.push_back(module);
      TensorSpec packed = base;
      packed.name = module + ".weight_packed";
      packed.shape = {out, in / 2};
      packed.dtypes = {DType::kU8};
      packed.role = TensorRole::kMxfp4Packed;
      push(std::move(packed));
      TensorSpec scale = base;
      scale.name = module + ".weight_scale";
      scale.shape = {out, in / mxfp4_group_elems_};
      scale.dtypes = {DType::kU8, DType::kF8E8M0};
      scale.role = TensorRole::kMxfp4Scale;
      push(std::move(scale));
      return;
    }
  }
}

const TensorSpec* TensorTable::find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &specs_[it->second];
}

bool TensorTable::in_published_layout(const TensorSpec& spec) const {
  return !spec.only_if_weight_is_fp8 ||
         find(weight_of_scale(spec.name))->dtypes[0] == DType::kF8E4M3;
}

std::string weight_of_scale(const std::string& scale_name) {
  return scale_name.substr(0, scale_name.size() - std::string_view("_scale_inv").size());
}

}  // namespace dz::model
