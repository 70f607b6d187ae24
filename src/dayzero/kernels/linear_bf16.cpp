#include "dayzero/kernels/linear_bf16.h"

#include <cstring>

#include "dayzero/core/logging.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/linear_common.h"
#include "dayzero/kernels/linear_ref.h"

namespace dz::kernels {

namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

}  // namespace

Result<Bf16Linear> Bf16Linear::create(const TensorView& weight) {
  DZ_RETURN_IF_ERROR(detail::check_matrix(weight, "linear weight"));
  const DType dtype = weight.dtype();
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32)
    return make_error(StatusCode::kUnsupported,
                      "linear weight: expected dtype BF16, F16 or F32, found {}",
                      dtype_name(dtype));
  const int64_t out_features = weight.dim(0), in_features = weight.dim(1);
  const int64_t row_stride = weight.strides()[0];
  Bf16Linear result;
  result.out_features_ = out_features;
  result.in_features_ = in_features;
  result.plain_codes_ =
      AlignedBuffer(static_cast<size_t>(out_features * in_features) * sizeof(uint16_t));
  auto* dst = reinterpret_cast<uint16_t*>(result.plain_codes_.data());
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
  result.reorder_for_onednn();
  return result;
}

void Bf16Linear::reorder_for_onednn() {
  if (!cpu_features().avx512) return;
  const int64_t out = out_features_, in = in_features_;
  try {
    const dnnl::engine& engine = detail::cpu_engine();
    const memory::desc plain({in, out}, Dt::bf16, Tag::ba);
    // The blocked layout oneDNN picks does not depend on the token count (checked for 1..1000);
    // forward_onednn() asks for exactly this layout for every count and fails loudly otherwise.
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(memory::desc({64, in}, Dt::bf16, Tag::ab),
                           memory::desc({in, out}, Dt::bf16, Tag::any),
                           memory::desc({64, out}, Dt::f32, Tag::ab)),
        detail::user_scratchpad_attr(), engine);
    weights_desc_ = pd.weights_desc();
    weights_buffer_ = AlignedBuffer::for_weights(weights_desc_.get_size());
    weights_mem_ = memory(weights_desc_, engine, weights_buffer_.data());
    memory plain_mem(plain, engine, plain_codes_.data());
    dnnl::stream stream(engine);
    dnnl::reorder(plain_mem, weights_mem_).execute(stream, plain_mem, weights_mem_);
    stream.wait();
    plain_codes_ = AlignedBuffer();
    panels_ = bf16_panel_weight(weights_desc_, weights_mem_.get_data_handle(), in, out);
  } catch (const dnnl::error& e) {
    spdlog::warn("linear weight [{}, {}]: no oneDNN BF16 matmul ({}); using the reference", out, in,
                 e.what());
    weights_mem_ = memory();
    weights_buffer_ = AlignedBuffer();
  }
}

int64_t Bf16Linear::stored_bytes() const {
  size_t bytes = plain_codes_.size_bytes();
  if (weights_mem_) bytes += weights_desc_.get_size();
  return static_cast<int64_t>(bytes);
}

void Bf16Linear::forward(const ExecContext& ctx, const float* x, int64_t num_tokens,
                         float* y) const {
  detail::OmpThreads threads(ctx.num_threads);
  if (!weights_mem_)
    linear_bf16_ref(reinterpret_cast<const uint16_t*>(plain_codes_.data()), out_features_,
                    in_features_, x, num_tokens, y);
  else if (panels_ && gemm_small_bf16_takes(num_tokens))
    gemm_small_bf16(ctx, *panels_, x, num_tokens, y);
  else
    forward_onednn(ctx, x, num_tokens, y);
}

void Bf16Linear::forward_onednn(const ExecContext& ctx, const float* x, int64_t num_tokens,
                                float* y) const {
  const int64_t num_elems = num_tokens * in_features_;
  auto* x_bf16 = reinterpret_cast<uint16_t*>(detail::ensure(
      detail::activation_scratch().bf16, static_cast<size_t>(num_elems) * sizeof(uint16_t)));
  detail::round_activations(ctx, x, num_elems, x_bf16, nullptr);
  matmuls_.run({.num_tokens = num_tokens,
                .in_features = in_features_,
                .cols = out_features_,
                .y_stride = out_features_,
                .f32 = false,
                .x = x_bf16,
                .weights_desc = weights_desc_,
                .weights = weights_mem_.get_data_handle(),
                .y = y});
}

void Bf16Linear::dequantize(float* out) const {
  const int64_t num_elems = out_features_ * in_features_;
  AlignedBuffer from_onednn;
  const auto* codes = reinterpret_cast<const uint16_t*>(plain_codes_.data());
  if (weights_mem_) {
    // Back from oneDNN's layout: Wᵀ [in, out] in "ba" is W [out, in] row-major.
    const dnnl::engine& engine = detail::cpu_engine();
    from_onednn = AlignedBuffer(static_cast<size_t>(num_elems) * sizeof(uint16_t));
    memory plain(memory::desc({in_features_, out_features_}, Dt::bf16, Tag::ba), engine,
                 from_onednn.data());
    dnnl::stream stream(engine);
    memory weights = weights_mem_;
    dnnl::reorder(weights, plain).execute(stream, weights, plain);
    stream.wait();
    codes = reinterpret_cast<const uint16_t*>(from_onednn.data());
  }
  for (int64_t e = 0; e < num_elems; ++e) out[e] = formats::decode_bf16(codes[e]);
}

}  // namespace dz::kernels
