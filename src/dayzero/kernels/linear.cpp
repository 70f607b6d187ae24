#include "dayzero/kernels/linear.h"

#include <utility>
#include <variant>

#include "dayzero/core/check.h"
#include "dayzero/kernels/linear_bf16.h"
#include "dayzero/kernels/linear_fp8_block.h"
#include "dayzero/kernels/linear_mxfp4.h"

namespace dz::kernels {

struct LinearWeight::Format {
  std::variant<Bf16Linear, Fp8BlockLinear, Mxfp4Linear> weight;
};

Result<LinearWeight> LinearWeight::from_float(const TensorView& weight) {
  DZ_ASSIGN_OR_RETURN(Bf16Linear bf16, Bf16Linear::create(weight));
  return LinearWeight(std::make_unique<const Format>(Format{std::move(bf16)}));
}

Result<LinearWeight> LinearWeight::from_fp8_block(const TensorView& codes,
                                                  const TensorView& scale_inv, int64_t block_rows,
                                                  int64_t block_cols) {
  DZ_ASSIGN_OR_RETURN(Fp8BlockLinear fp8,
                      Fp8BlockLinear::create(codes, scale_inv, block_rows, block_cols));
  return LinearWeight(std::make_unique<const Format>(Format{std::move(fp8)}));
}

Result<LinearWeight> LinearWeight::from_mxfp4(const TensorView& weight_packed,
                                              const TensorView& weight_scale,
                                              Mxfp4Activations activations) {
  DZ_ASSIGN_OR_RETURN(Mxfp4Linear mxfp4,
                      Mxfp4Linear::create(weight_packed, weight_scale, activations));
  return LinearWeight(std::make_unique<const Format>(Format{std::move(mxfp4)}));
}

LinearWeight LinearWeight::from_f32_as_bf16(const float* weight, int64_t out_features,
                                            int64_t in_features) {
  DZ_CHECK(out_features > 0 && in_features > 0, "empty linear weight [{}, {}]", out_features,
           in_features);
  TensorView view(const_cast<float*>(weight), DType::kF32, Shape{out_features, in_features});
  Result<LinearWeight> result = from_float(view);
  DZ_CHECK(result.ok(), "{}", result.status().to_string());
  return std::move(result).value();
}

LinearWeight::LinearWeight() = default;
LinearWeight::LinearWeight(std::unique_ptr<const Format> format) : format_(std::move(format)) {}
LinearWeight::~LinearWeight() = default;
LinearWeight::LinearWeight(LinearWeight&&) noexcept = default;
LinearWeight& LinearWeight::operator=(LinearWeight&&) noexcept = default;

int64_t LinearWeight::out_features() const {
  if (!format_) return 0;
  return std::visit([](const auto& w) { return w.out_features(); }, format_->weight);
}

int64_t LinearWeight::in_features() const {
  if (!format_) return 0;
  return std::visit([](const auto& w) { return w.in_features(); }, format_->weight);
}

bool LinearWeight::is_fp8_block() const {
  return format_ && std::holds_alternative<Fp8BlockLinear>(format_->weight);
}

bool LinearWeight::is_mxfp4() const {
  return format_ && std::holds_alternative<Mxfp4Linear>(format_->weight);
}

int64_t LinearWeight::stored_bytes() const {
  if (!format_) return 0;
  return std::visit([](const auto& w) { return w.stored_bytes(); }, format_->weight);
}

size_t LinearWeight::mxfp4_workspace_bytes_per_thread() {
  return Mxfp4Linear::workspace_bytes_per_thread();
}

void LinearWeight::forward(const ExecContext& ctx, const float* x, int64_t num_tokens,
                           float* y) const {
  DZ_CHECK(format_ != nullptr, "forward on an empty LinearWeight");
  if (num_tokens <= 0) return;
  std::visit([&](const auto& w) { w.forward(ctx, x, num_tokens, y); }, format_->weight);
}

void LinearWeight::dequantize(float* out) const {
  if (!format_) return;
  std::visit([&](const auto& w) { w.dequantize(out); }, format_->weight);
}

}  // namespace dz::kernels
