#include "dayzero/kernels/linear_fp8_block.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "dayzero/formats/code_checks.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/linear_common.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/linear_ref.h"

namespace dz::kernels {

namespace {

// GEMV below this many tokens (at most detail::kFp8GemvMaxTokens per pass, fewer where their
// activations would not fit L1: detail::gemv_tokens_per_pass; each pass reads the weights): its
// cost grows by ≈ 2 VDPBF16PS per 64 codes per token, while the tile path pays a fixed
// dequantization (byte tables, ≈ DRAM-bound) and per-tile oneDNN calls, then runs on AMX.
// Measured on [2048, 7168], 1 thread, CPU time, loaded machine (±30 % between runs), two
// alternating rounds: GEMV 6.0–8.0 / 10.2–11.3 / 11.9–13.3 ms at 8 / 12 / 16 tokens, tiles
// 6.8–7.1 / 5.5–8.0 / 7.5–9.0 ms: even at 8, so a second GEMV pass (9+) never pays.
constexpr int64_t kFp8GemmMinTokens = 9;
// Output rows per dequantized tile: 64 × 7168 BF16 is 0.9 MiB, half the L2, leaving room for
// oneDNN's packed copy of it.
constexpr int64_t kTileRows = 64;

}  // namespace

bool fp8_block_amx_available() {
  const CpuFeatures& cpu = cpu_features();
  return cpu.amx_bf16 && cpu.avx512_vbmi && cpu.avx512_bf16;
}

Result<Fp8BlockLinear> Fp8BlockLinear::create(const TensorView& codes, const TensorView& scale_inv,
                                              int64_t block_rows, int64_t block_cols) {
  DZ_RETURN_IF_ERROR(detail::check_matrix(codes, "FP8 weight"));
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

  Fp8BlockLinear result;
  result.block_ = block;
  const int64_t row_stride = codes.strides()[0];
  result.codes_ = AlignedBuffer::for_weights(static_cast<size_t>(block.num_rows * block.num_cols));
  auto* dst = reinterpret_cast<uint8_t*>(result.codes_.data());
  for (int64_t i = 0; i < block.num_rows; ++i)
    std::memcpy(dst + i * block.num_cols, codes.data_as<const uint8_t>() + i * row_stride,
                static_cast<size_t>(block.num_cols));
  DZ_RETURN_IF_ERROR(formats::check_e4m3_codes(
      std::span<const uint8_t>(dst, static_cast<size_t>(block.num_rows * block.num_cols)),
      codes.shape()));

  const int64_t num_scales = expected_scale_shape.num_elems();
  result.scale_inv_ = AlignedBuffer::for_weights(static_cast<size_t>(num_scales) * sizeof(float));
  auto* scales = reinterpret_cast<float*>(result.scale_inv_.data());
  std::memcpy(scales, scale_inv.data(), static_cast<size_t>(num_scales) * sizeof(float));
  for (int64_t s = 0; s < num_scales; ++s) {
    if (!std::isfinite(scales[s]))
      return make_error(StatusCode::kCorrupt,
                        "FP8 weight scale_inv: non-finite value {} at index {} of {}", scales[s],
                        formats::unravel_index(s, expected_scale_shape),
                        expected_scale_shape.to_string());
  }
  // Power-of-two scales in [2^-100, 2^100] keep every decoded product a BF16 value (4 significant
  // bits, normal exponent) and every scale · 2^8 finite; the fast paths rely on both.
  bool pow2 = true, foldable = true;
  for (int64_t s = 0; s < num_scales; ++s) {
    int exponent = 0;
    const float mantissa = std::frexp(std::fabs(scales[s]), &exponent);
    if (scales[s] != 0.0f && (exponent < -100 || exponent > 100)) foldable = false;
    if (scales[s] != 0.0f && mantissa != 0.5f) pow2 = false;
  }
  result.scales_pow2_ = pow2 && foldable;
  const CpuFeatures& cpu = cpu_features();
  if (!foldable || !cpu.avx512)
    result.kernels_ = Kernels::kReference;
  else if (cpu.avx512_vbmi && cpu.avx512_bf16 && detail::fp8_bf16_gemv_takes(block))
    result.kernels_ = Kernels::kVbmiBf16;
  else
    result.kernels_ = Kernels::kAvx512;
  result.amx_ = result.kernels_ == Kernels::kVbmiBf16 && fp8_block_amx_available();
  return result;
}

int64_t Fp8BlockLinear::stored_bytes() const {
  return static_cast<int64_t>(codes_.size_bytes() + scale_inv_.size_bytes());
}

void Fp8BlockLinear::forward(const ExecContext& ctx, const float* x, int64_t num_tokens,
                             float* y) const {
  detail::OmpThreads threads(ctx.num_threads);
  if (kernels_ == Kernels::kReference)
    linear_fp8_block_ref(code_data(), scale_data(), block_, x, num_tokens, y);
  else if (num_tokens < kFp8GemmMinTokens)
    forward_gemv(ctx, x, num_tokens, y);
  else if (kernels_ == Kernels::kVbmiBf16)
    forward_token_tiles(ctx, x, num_tokens, y);
  else
    forward_tiles(ctx, x, num_tokens, y);
}

void Fp8BlockLinear::forward_gemv(const ExecContext& ctx, const float* x, int64_t num_tokens,
                                  float* y) const {
  const int64_t out_features = block_.num_rows, in_features = block_.num_cols;
  detail::ActivationScratch& scratch = detail::activation_scratch();
  if (kernels_ == Kernels::kVbmiBf16) {
    // BF16 activations in the kernel's order; one contiguous range of rows per thread (one
    // sequential DRAM stream each, as the MXFP4 GEMV).
    const int64_t x_elems = detail::fp8_gemv_x_elems(in_features);
    auto* x_packed = reinterpret_cast<uint16_t*>(
        detail::ensure(scratch.bf16, static_cast<size_t>(num_tokens * x_elems) * sizeof(uint16_t)));
    for (int64_t t = 0; t < num_tokens; ++t)
      detail::fp8_pack_x_avx512(x + t * in_features, in_features, x_packed + t * x_elems);
    const int64_t threads = std::max(ctx.num_threads, 1);
    const int64_t grain = std::max<int64_t>(4, (out_features + threads - 1) / threads);
    const int64_t tokens_per_pass =
        detail::gemv_tokens_per_pass(x_elems * static_cast<int64_t>(sizeof(uint16_t)),
                                     detail::kFp8GemvPrefetchL1Bytes, detail::kFp8GemvMaxTokens);
    parallel_for(ctx, out_features, grain, [&](int64_t row_begin, int64_t row_end) {
      detail::for_each_token_pass(num_tokens, tokens_per_pass, [&](int64_t t, int64_t count) {
        detail::fp8_gemv_bf16_rows_avx512(code_data(), scale_data(), block_, x_packed + t * x_elems,
                                          count, y + t * out_features, row_begin, row_end);
      });
    });
    return;
  }
  const int64_t num_elems = num_tokens * in_features;
  auto* x_f32 = reinterpret_cast<float*>(
      detail::ensure(scratch.f32, static_cast<size_t>(num_elems) * sizeof(float)));
  detail::round_activations(ctx, x, num_elems, nullptr, x_f32);
  // Rows in chunks that keep every thread busy without splitting below a few KiB of codes.
  const int64_t grain = std::max<int64_t>(
      4, std::min<int64_t>(64, out_features / (4 * std::max(ctx.num_threads, 1))));
  parallel_for(ctx, out_features, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t t = 0; t < num_tokens; t += detail::kFp8GemvMaxTokens) {
      const int64_t count = std::min(detail::kFp8GemvMaxTokens, num_tokens - t);
      detail::fp8_gemv_rows_avx512(code_data(), scale_data(), block_, x_f32 + t * in_features,
                                   count, y + t * out_features, row_begin, row_end);
    }
  });
}

void Fp8BlockLinear::forward_token_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens,
                                         float* y) const {
  const int64_t in_features = block_.num_cols;
  auto* xb = reinterpret_cast<uint16_t*>(detail::ensure(
      detail::activation_scratch().bf16,
      static_cast<size_t>(detail::fp8_x_tile_words(in_features, num_tokens)) * sizeof(uint16_t)));
  const int64_t token_tiles = (num_tokens + 15) / 16;
  parallel_for(ctx, token_tiles, 1, [&](int64_t begin, int64_t end) {
    detail::fp8_pack_x_tiles(x, in_features, num_tokens, begin, end, xb);
  });
  const int64_t groups = (block_.num_rows + 15) / 16;
  const int64_t threads = std::max(ctx.num_threads, 1);
  // One contiguous range of row groups per thread: one sequential DRAM stream each.
  parallel_for(ctx, groups, (groups + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    (amx_ ? detail::fp8_amx_gemm_groups : detail::fp8_bf16_gemm_groups)(
        code_data(), scale_data(), block_, xb, num_tokens, y, begin, end);
  });
}

void Fp8BlockLinear::forward_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens,
                                   float* y) const {
  const int64_t out_features = block_.num_rows, in_features = block_.num_cols;
  const bool f32 = !scales_pow2_;
  const int64_t num_elems = num_tokens * in_features;
  detail::ActivationScratch& scratch = detail::activation_scratch();
  const void* src = nullptr;
  if (f32) {
    auto* x_f32 = reinterpret_cast<float*>(
        detail::ensure(scratch.f32, static_cast<size_t>(num_elems) * sizeof(float)));
    detail::round_activations(ctx, x, num_elems, nullptr, x_f32);
    src = x_f32;
  } else {
    auto* x_bf16 = reinterpret_cast<uint16_t*>(
        detail::ensure(scratch.bf16, static_cast<size_t>(num_elems) * sizeof(uint16_t)));
    detail::round_activations(ctx, x, num_elems, x_bf16, nullptr);
    src = x_bf16;
  }
  const size_t elem_bytes = f32 ? sizeof(float) : sizeof(uint16_t);
  const int64_t num_row_tiles = (out_features + kTileRows - 1) / kTileRows;
  const int64_t num_token_tiles = (num_tokens + detail::kTileTokens - 1) / detail::kTileTokens;
  // Task = (row tile, token tile), token tiles innermost so a thread's consecutive tasks tend to
  // share a row tile (it still dequantizes it once per task: cheap next to the GEMM).
  parallel_for(ctx, num_row_tiles * num_token_tiles, 1, [&](int64_t task_begin, int64_t task_end) {
    // The calling thread's tile workspace (each task's contents are its own).
    thread_local AlignedBuffer tile_buffer;
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t row_begin = (task / num_token_tiles) * kTileRows;
      const int64_t rows = std::min(kTileRows, out_features - row_begin);
      const int64_t token_begin = (task % num_token_tiles) * detail::kTileTokens;
      const int64_t tokens = std::min(detail::kTileTokens, num_tokens - token_begin);
      std::byte* tile =
          detail::ensure(tile_buffer, static_cast<size_t>(rows * in_features) * elem_bytes);
      if (f32)
        detail::fp8_dequantize_rows_f32_avx512(code_data(), scale_data(), block_, row_begin,
                                               row_begin + rows, reinterpret_cast<float*>(tile));
      else
        detail::fp8_dequantize_rows_bf16_avx512(code_data(), scale_data(), block_, row_begin,
                                                row_begin + rows,
                                                reinterpret_cast<uint16_t*>(tile));
      matmuls_.run({.num_tokens = tokens,
                    .in_features = in_features,
                    .cols = rows,
                    .y_stride = out_features,
                    .f32 = f32,
                    .x = static_cast<const std::byte*>(src) +
                         static_cast<size_t>(token_begin * in_features) * elem_bytes,
                    .weights_desc = detail::tile_weights_desc(in_features, rows, f32),
                    .weights = tile,
                    .y = y + token_begin * out_features + row_begin});
    }
  });
}

void Fp8BlockLinear::dequantize(float* out) const {
  const int64_t num_elems = block_.num_rows * block_.num_cols;
  formats::dequantize_fp8_block(
      std::span<const uint8_t>(code_data(), static_cast<size_t>(num_elems)),
      std::span<const float>(
          scale_data(), static_cast<size_t>(block_.num_scale_rows() * block_.num_scale_cols())),
      block_, std::span<float>(out, static_cast<size_t>(num_elems)));
}

}  // namespace dz::kernels
