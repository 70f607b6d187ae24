#include "dayzero/kernels/linear.h"

#include <cmath>
#include <cstring>
#include <span>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/logging.h"
#include "dayzero/formats/code_checks.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/formats/fp8_block.h"
#include "dayzero/kernels/linear_ref.h"

namespace dz::kernels {

struct LinearWeight::Impl {
  int64_t out_features = 0;
  int64_t in_features = 0;
  bool fp8_block = false;
  AlignedBuffer bf16;       // [out, in] BF16 codes (plain weights)
  AlignedBuffer codes;      // [out, in] E4M3 codes (FP8 block weights)
  AlignedBuffer scale_inv;  // [num_scale_rows, num_scale_cols] FP32
  formats::Fp8BlockShape block;

  const uint16_t* bf16_data() const { return reinterpret_cast<const uint16_t*>(bf16.data()); }
  const uint8_t* code_data() const { return reinterpret_cast<const uint8_t*>(codes.data()); }
  const float* scale_data() const { return reinterpret_cast<const float*>(scale_inv.data()); }
};

namespace {

Status check_matrix(const TensorView& view, std::string_view what) {
  if (view.rank() != 2)
    return make_error(StatusCode::kInvalidArgument, "{}: expected rank 2 [out, in], found shape {}",
                      what, view.shape().to_string());
  if (view.dim(0) <= 0 || view.dim(1) <= 0)
    return make_error(StatusCode::kInvalidArgument, "{}: expected a non-empty [out, in], found {}",
                      what, view.shape().to_string());
  if (view.strides()[1] != 1 || view.strides()[0] < view.dim(1))
    return make_error(StatusCode::kInvalidArgument,
                      "{}: expected rows with contiguous columns, found strides {} for shape {}",
                      what, view.strides().to_string(), view.shape().to_string());
  return {};
}

}  // namespace

Result<LinearWeight> LinearWeight::from_float(const TensorView& weight) {
  DZ_RETURN_IF_ERROR(check_matrix(weight, "linear weight"));
  const DType dtype = weight.dtype();
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32)
    return make_error(StatusCode::kUnsupported,
                      "linear weight: expected dtype BF16, F16 or F32, found {}",
                      dtype_name(dtype));
  const int64_t out_features = weight.dim(0), in_features = weight.dim(1);
  const int64_t row_stride = weight.strides()[0];
  LinearWeight result;
  Impl& impl = *result.impl_;
  impl.out_features = out_features;
  impl.in_features = in_features;
  impl.bf16 = AlignedBuffer(static_cast<size_t>(out_features * in_features) * sizeof(uint16_t));
  auto* dst = reinterpret_cast<uint16_t*>(impl.bf16.data());
  for (int64_t i = 0; i < out_features; ++i) {
    uint16_t* dst_row = dst + i * in_features;
    if (dtype == DType::kBF16) {
      const uint16_t* src = weight.data_as<const uint16_t>() + i * row_stride;
      std::memcpy(dst_row, src, static_cast<size_t>(in_features) * sizeof(uint16_t));
    } else if (dtype == DType::kF16) {
      const uint16_t* src = weight.data_as<const uint16_t>() + i * row_stride;
      for (int64_t j = 0; j < in_features; ++j)
        dst_row[j] = formats::encode_bf16(formats::decode_fp16(src[j]));
    } else {
      const float* src = weight.data_as<const float>() + i * row_stride;
      for (int64_t j = 0; j < in_features; ++j) dst_row[j] = formats::encode_bf16(src[j]);
    }
  }
  if (dtype != DType::kBF16)
    spdlog::debug("linear weight [{}, {}]: {} rounded to BF16 (RNE)", out_features, in_features,
                  dtype_name(dtype));
  return result;
}

Result<LinearWeight> LinearWeight::from_fp8_block(const TensorView& codes,
                                                  const TensorView& scale_inv, int64_t block_rows,
                                                  int64_t block_cols) {
  DZ_RETURN_IF_ERROR(check_matrix(codes, "FP8 weight"));
  if (codes.dtype() != DType::kF8E4M3)
    return make_error(StatusCode::kUnsupported, "FP8 weight: expected dtype F8_E4M3, found {}",
                      dtype_name(codes.dtype()));
  if (block_rows <= 0 || block_cols <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "FP8 weight: expected a positive block size, found [{}, {}]", block_rows,
                      block_cols);
  formats::Fp8BlockShape block{codes.dim(0), codes.dim(1), block_rows, block_cols};
  const Shape expected_scale_shape{block.num_scale_rows(), block.num_scale_cols()};
  if (!(scale_inv.shape() == expected_scale_shape))
    return make_error(StatusCode::kInvalidArgument,
                      "FP8 weight scale_inv: expected shape {} for weight {} in [{}, {}] blocks, "
                      "found {}",
                      expected_scale_shape.to_string(), codes.shape().to_string(), block_rows,
                      block_cols, scale_inv.shape().to_string());
  if (scale_inv.dtype() != DType::kF32)
    return make_error(StatusCode::kUnsupported,
                      "FP8 weight scale_inv: expected dtype F32, found {}",
                      dtype_name(scale_inv.dtype()));
  if (!scale_inv.is_contiguous())
    return make_error(StatusCode::kInvalidArgument,
                      "FP8 weight scale_inv: expected a contiguous tensor, found strides {}",
                      scale_inv.strides().to_string());

  LinearWeight result;
  Impl& impl = *result.impl_;
  impl.out_features = block.num_rows;
  impl.in_features = block.num_cols;
  impl.fp8_block = true;
  impl.block = block;
  const int64_t row_stride = codes.strides()[0];
  impl.codes = AlignedBuffer(static_cast<size_t>(block.num_rows * block.num_cols));
  auto* dst = reinterpret_cast<uint8_t*>(impl.codes.data());
  for (int64_t i = 0; i < block.num_rows; ++i)
    std::memcpy(dst + i * block.num_cols, codes.data_as<const uint8_t>() + i * row_stride,
                static_cast<size_t>(block.num_cols));
  DZ_RETURN_IF_ERROR(formats::check_e4m3_codes(
      std::span<const uint8_t>(dst, static_cast<size_t>(block.num_rows * block.num_cols)),
      codes.shape()));

  const int64_t num_scales = expected_scale_shape.num_elems();
  impl.scale_inv = AlignedBuffer(static_cast<size_t>(num_scales) * sizeof(float));
  auto* scales = reinterpret_cast<float*>(impl.scale_inv.data());
  std::memcpy(scales, scale_inv.data(), static_cast<size_t>(num_scales) * sizeof(float));
  for (int64_t s = 0; s < num_scales; ++s) {
    if (!std::isfinite(scales[s]))
      return make_error(StatusCode::kCorrupt,
                        "FP8 weight scale_inv: non-finite value {} at index {} of {}", scales[s],
                        formats::unravel_index(s, expected_scale_shape),
                        expected_scale_shape.to_string());
  }
  return result;
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

LinearWeight::LinearWeight() : impl_(std::make_unique<Impl>()) {}
LinearWeight::~LinearWeight() = default;
LinearWeight::LinearWeight(LinearWeight&&) noexcept = default;
LinearWeight& LinearWeight::operator=(LinearWeight&&) noexcept = default;

int64_t LinearWeight::out_features() const {
  return impl_->out_features;
}
int64_t LinearWeight::in_features() const {
  return impl_->in_features;
}
bool LinearWeight::is_fp8_block() const {
  return impl_->fp8_block;
}

void LinearWeight::forward(const ExecContext& ctx, const float* x, int64_t num_tokens,
                           float* y) const {
  (void)ctx;
  const Impl& impl = *impl_;
  DZ_CHECK(impl.out_features > 0, "forward on an empty LinearWeight");
  if (num_tokens <= 0) return;
  if (impl.fp8_block) {
    linear_fp8_block_ref(impl.code_data(), impl.scale_data(), impl.block, x, num_tokens, y);
  } else {
    linear_bf16_ref(impl.bf16_data(), impl.out_features, impl.in_features, x, num_tokens, y);
  }
}

void LinearWeight::dequantize(float* out) const {
  const Impl& impl = *impl_;
  const int64_t num_elems = impl.out_features * impl.in_features;
  if (impl.fp8_block) {
    formats::dequantize_fp8_block(
        std::span<const uint8_t>(impl.code_data(), static_cast<size_t>(num_elems)),
        std::span<const float>(impl.scale_data(), static_cast<size_t>(impl.block.num_scale_rows() *
                                                                      impl.block.num_scale_cols())),
        impl.block, std::span<float>(out, static_cast<size_t>(num_elems)));
    return;
  }
  for (int64_t e = 0; e < num_elems; ++e) out[e] = formats::decode_bf16(impl.bf16_data()[e]);
}

}  // namespace dz::kernels
