#include "dayzero/kernels/linear_mxfp4.h"

#include <algorithm>
#include <cstring>
#include <span>
#include <utility>

#include "dayzero/core/logging.h"
#include "dayzero/formats/code_checks.h"
#include "dayzero/formats/decode_tables.h"
#include "dayzero/formats/mxfp4_layouts.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/linear_common.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/linear_ref.h"
#include "dayzero/kernels/mxfp4_amx_layout.h"

namespace dz::kernels {

namespace {

// The GEMV costs about 0.3 ms per token per [3072, 3584] expert matrix (4 VDPBF16PS per 128
// weights per token), the tiles a fixed ~2.4 ms (a DRAM-bound dequantization, then AMX); at 8
// tokens (one GEMV pass) they measured 2.3 vs 2.5 ms, 9 tokens need a second GEMV pass.
constexpr int64_t kMxfp4GemmMinTokens = 9;
// The fixed per-thread tile buffer: 1 MiB holds 64 BF16 rows of 7168 (as the FP8 tiles) or 170 of
// the K3 experts' 3072, and fits in the 2 MiB L2 next to oneDNN's packed copy.
constexpr size_t kWorkspaceBytes = size_t{1} << 20;
constexpr int64_t kMaxTileRows = 256;
// The MXINT8 GEMV: weights requested this far ahead (its own kernel's distance), and rows taken in
// tiles of this many bytes, which stay in L2 while passes of tokens read them.
constexpr int64_t kMxint8PrefetchBytes = 16384;
constexpr int64_t kMxint8TileBytes = 256 * 1024;

}  // namespace

bool mxfp4_amx_available() {
  return cpu_features().amx_bf16;
}

bool mxfp4_mxint8_vnni_available() {
  return cpu_features().avx512 && cpu_features().avx512_vnni;
}

Result<Mxfp4Linear> Mxfp4Linear::create(const TensorView& weight_packed,
                                        const TensorView& weight_scale,
                                        Mxfp4Activations activations) {
  DZ_RETURN_IF_ERROR(detail::check_matrix(weight_packed, "MXFP4 weight_packed"));
  DZ_RETURN_IF_ERROR(detail::check_matrix(weight_scale, "MXFP4 weight_scale"));
  if (weight_packed.dtype() != DType::kU8)
    return make_error(StatusCode::kUnsupported, "MXFP4 weight_packed: expected dtype U8, found {}",
                      dtype_name(weight_packed.dtype()));
  if (weight_scale.dtype() != DType::kU8 && weight_scale.dtype() != DType::kF8E8M0)
    return make_error(StatusCode::kUnsupported,
                      "MXFP4 weight_scale: expected dtype U8 or F8_E8M0, found {}",
                      dtype_name(weight_scale.dtype()));
  const int64_t out = weight_packed.dim(0), in = 2 * weight_packed.dim(1);
  if (in % 32 != 0)
    return make_error(StatusCode::kInvalidArgument,
                      "MXFP4 weight_packed: expected [out, in/2] with in a multiple of 32, found "
                      "shape {} (in = {})",
                      weight_packed.shape().to_string(), in);
  const Shape expected_scale_shape{out, in / 32};
  if (!(weight_scale.shape() == expected_scale_shape))
    return make_error(StatusCode::kInvalidArgument,
                      "MXFP4 weight_scale: expected shape {} (one code per 32 inputs) for "
                      "weight_packed {}, found {}",
                      expected_scale_shape.to_string(), weight_packed.shape().to_string(),
                      weight_scale.shape().to_string());

  Mxfp4Linear result;
  result.out_features_ = out;
  result.in_features_ = in;
  const int64_t row_bytes = in / 2, num_blocks = in / 32;
  const auto codes_of_row = [&](int64_t i) {
    return weight_packed.data_as<const uint8_t>() + i * weight_packed.strides()[0];
  };
  std::vector<uint8_t> scales(static_cast<size_t>(out * num_blocks));
  for (int64_t i = 0; i < out; ++i)
    std::memcpy(scales.data() + i * num_blocks,
                weight_scale.data_as<const uint8_t>() + i * weight_scale.strides()[0],
                static_cast<size_t>(num_blocks));
  Status scale_status = formats::check_e8m0_scales(scales, expected_scale_shape);
  if (!scale_status.ok()) return std::move(scale_status).with_context("MXFP4 weight_scale");

  result.row_subnormal_.assign(static_cast<size_t>(out), 0);
  int64_t num_low_blocks = 0;
  for (int64_t i = 0; i < out; ++i)
    for (int64_t b = 0; b < num_blocks; ++b) {
      const uint8_t scale = scales[static_cast<size_t>(i * num_blocks + b)];
      const uint8_t* block = codes_of_row(i) + b * 16;
      bool nonzero = false;
      for (int k = 0; k < 16; ++k) nonzero = nonzero || (block[k] & 0x77) != 0;
      if (nonzero && (scale < 2 || scale > 252)) result.scales_fold_ = false;
      if (scale >= 2) continue;
      ++num_low_blocks;
      if (nonzero) result.row_subnormal_[static_cast<size_t>(i)] = 1;
    }
  for (uint8_t flag : result.row_subnormal_) result.any_subnormal_ = result.any_subnormal_ || flag;
  if (num_low_blocks > 0)
    spdlog::debug("MXFP4 weight [{}, {}]: {} blocks with scale code 0 or 1", out, in,
                  num_low_blocks);

  const CpuFeatures& cpu = cpu_features();
  if (activations == Mxfp4Activations::kMxint8)
    result.kernels_ =
        mxfp4_mxint8_vnni_available() ? Kernels::kMxint8Vnni : Kernels::kMxint8Reference;
  else
    result.kernels_ = mxfp4_amx_available()           ? Kernels::kAmx
                      : cpu.avx512 && cpu.avx512_bf16 ? Kernels::kAvx512Bf16
                                                      : Kernels::kReference;
  if (result.kernels_ == Kernels::kMxint8Vnni) {
    const int64_t vnni_row_bytes = detail::mxint8_num_groups(in) * detail::kMxint8GroupWeightBytes;
    result.packed_ = AlignedBuffer::for_weights(static_cast<size_t>(out * vnni_row_bytes));
    result.scales_ = AlignedBuffer::for_weights(scales.size());
    auto* to = reinterpret_cast<uint8_t*>(result.packed_.data());
    for (int64_t i = 0; i < out; ++i)
      detail::mxfp4_vnni_repack_row(codes_of_row(i), in, to + i * vnni_row_bytes);
    std::memcpy(result.scales_.data(), scales.data(), scales.size());
    return result;
  }
  if (result.kernels_ != Kernels::kAmx) {
    result.packed_ = AlignedBuffer::for_weights(static_cast<size_t>(out * row_bytes));
    result.scales_ = AlignedBuffer::for_weights(scales.size());
    for (int64_t i = 0; i < out; ++i)
      std::memcpy(result.packed_.data() + i * row_bytes, codes_of_row(i),
                  static_cast<size_t>(row_bytes));
    std::memcpy(result.scales_.data(), scales.data(), scales.size());
    return result;
  }
  // The tile layout, written straight from the source rows; padding rows get zero codes and scale
  // code 127.
  const int64_t padded_rows = detail::mxfp4_amx_num_groups(out) * detail::kMxfp4AmxGroupRows;
  result.packed_ = AlignedBuffer::for_weights(static_cast<size_t>(padded_rows * row_bytes));
  result.scales_ = AlignedBuffer::for_weights(static_cast<size_t>(padded_rows * num_blocks));
  auto* to_packed = reinterpret_cast<uint8_t*>(result.packed_.data());
  auto* to_scales = reinterpret_cast<uint8_t*>(result.scales_.data());
  std::memset(to_packed, 0, result.packed_.size_bytes());
  std::memset(to_scales, 127, result.scales_.size_bytes());
  // Byte 64c + 4n + 2h + p of a block takes nibble h of input bytes 4c + 2p and 4c + 2p + 1 of row
  // n (mxfp4_amx_nibble written out per byte pair).
  for (int64_t i = 0; i < out; ++i) {
    const int64_t n = i % detail::kMxfp4AmxGroupRows;
    for (int64_t b = 0; b < num_blocks; ++b) {
      const uint8_t* from = codes_of_row(i) + 16 * b;
      uint8_t* to = to_packed + detail::mxfp4_amx_nibble(in, i, 32 * b).byte - 4 * n;
      for (int c = 0; c < 4; ++c)
        for (int p = 0; p < 2; ++p) {
          const uint8_t lo = from[4 * c + 2 * p], hi = from[4 * c + 2 * p + 1];
          to[64 * c + 4 * n + p] = static_cast<uint8_t>((lo & 0xF) | (hi << 4));
          to[64 * c + 4 * n + 2 + p] = static_cast<uint8_t>((lo >> 4) | (hi & 0xF0));
        }
      to_scales[detail::mxfp4_amx_scale_index(in, i, b)] =
          scales[static_cast<size_t>(i * num_blocks + b)];
    }
  }
  return result;
}

size_t Mxfp4Linear::workspace_bytes_per_thread() {
  return kWorkspaceBytes;
}

int64_t Mxfp4Linear::stored_bytes() const {
  return static_cast<int64_t>(packed_.size_bytes() + scales_.size_bytes() + row_subnormal_.size());
}

int64_t Mxfp4Linear::tile_rows() const {
  const size_t row_bytes =
      static_cast<size_t>(in_features_) * (any_subnormal_ ? sizeof(float) : sizeof(uint16_t));
  int64_t rows = std::min<int64_t>(
      {static_cast<int64_t>(kWorkspaceBytes / row_bytes), kMaxTileRows, out_features_});
  if (rows >= 16) rows -= rows % 16;
  return rows;
}

void Mxfp4Linear::forward(const ExecContext& ctx, const float* x, int64_t num_tokens,
                          float* y) const {
  detail::OmpThreads threads(ctx.num_threads);
  if (kernels_ == Kernels::kMxint8Vnni)
    forward_mxint8(ctx, x, num_tokens, y);
  else if (kernels_ == Kernels::kMxint8Reference)
    linear_mxfp4_mxint8_ref(packed_data(), scale_data(), out_features_, in_features_, x, num_tokens,
                            y);
  else if (kernels_ == Kernels::kAmx)
    forward_amx(ctx, x, num_tokens, y);
  else if (kernels_ == Kernels::kReference)
    linear_mxfp4_ref(packed_data(), scale_data(), out_features_, in_features_, x, num_tokens, y);
  else if (num_tokens < kMxfp4GemmMinTokens || tile_rows() == 0)
    forward_gemv(ctx, x, num_tokens, y);
  else
    forward_tiles(ctx, x, num_tokens, y);
}

void Mxfp4Linear::forward_gemv(const ExecContext& ctx, const float* x, int64_t num_tokens,
                               float* y) const {
  const int64_t x_elems = detail::mxfp4_gemv_x_elems(in_features_);
  auto* x_packed = reinterpret_cast<uint16_t*>(
      detail::ensure(detail::activation_scratch().bf16,
                     static_cast<size_t>(num_tokens * x_elems) * sizeof(uint16_t)));
  for (int64_t t = 0; t < num_tokens; ++t)
    detail::mxfp4_pack_x_avx512(x + t * in_features_, in_features_, x_packed + t * x_elems);
  // One contiguous range of rows per thread: one sequential DRAM stream each.
  const int64_t threads = std::max(ctx.num_threads, 1);
  const int64_t grain = std::max<int64_t>(4, (out_features_ + threads - 1) / threads);
  const int64_t tokens_per_pass =
      detail::gemv_tokens_per_pass(x_elems * static_cast<int64_t>(sizeof(uint16_t)),
                                   detail::kMxfp4GemvPrefetchBytes, detail::kMxfp4GemvMaxTokens);
  parallel_for(ctx, out_features_, grain, [&](int64_t row_begin, int64_t row_end) {
    detail::for_each_token_pass(num_tokens, tokens_per_pass, [&](int64_t t, int64_t count) {
      detail::mxfp4_gemv_rows_avx512(packed_data(), scale_data(), in_features_,
                                     x_packed + t * x_elems, count, y + t * out_features_,
                                     out_features_, row_begin, row_end);
    });
  });
}

void Mxfp4Linear::forward_mxint8(const ExecContext& ctx, const float* x, int64_t num_tokens,
                                 float* y) const {
  const int64_t x_bytes = detail::mxint8_x_bytes(in_features_);
  std::byte* x_packed = detail::ensure(detail::activation_scratch().mxint8,
                                       static_cast<size_t>(num_tokens * x_bytes));
  // Packing a token costs about as much as a few rows of one token's products.
  parallel_for(ctx, num_tokens, grain_for_work(4 * in_features_, kMinParallelFlops),
               [&](int64_t begin, int64_t end) {
                 for (int64_t t = begin; t < end; ++t)
                   detail::mxint8_pack_x_avx512(x + t * in_features_, in_features_,
                                                x_packed + t * x_bytes);
               });
  const int64_t row_bytes =
      detail::mxint8_num_groups(in_features_) * detail::kMxint8GroupWeightBytes;
  const int64_t tokens_per_pass =
      detail::gemv_tokens_per_pass(x_bytes, kMxint8PrefetchBytes, detail::kMxint8GemvMaxTokens);
  // Rows of a tile stay in L2 while every token pass reads them.
  const int64_t tile_rows = std::max<int64_t>(1, kMxint8TileBytes / row_bytes);
  const int64_t threads = std::max(ctx.num_threads, 1);
  const int64_t grain = std::max<int64_t>(4, (out_features_ + threads - 1) / threads);
  parallel_for(ctx, out_features_, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t tile = row_begin; tile < row_end; tile += tile_rows)
      detail::for_each_token_pass(num_tokens, tokens_per_pass, [&](int64_t t, int64_t count) {
        detail::mxfp4_mxint8_gemv_rows_avx512(
            packed_data(), scale_data(), in_features_, x_packed + t * x_bytes, count,
            y + t * out_features_, out_features_, tile, std::min(row_end, tile + tile_rows));
      });
  });
}

void Mxfp4Linear::forward_amx(const ExecContext& ctx, const float* x, int64_t num_tokens,
                              float* y) const {
  const bool gemm = num_tokens > detail::kMxfp4AmxGemvMaxTokens && scales_fold_;
  // The GEMM reads whole tiles of 16 tokens: zero rows up to the next multiple.
  const int64_t rows = gemm ? (num_tokens + 15) / 16 * 16 : num_tokens;
  auto* x_bf16 = reinterpret_cast<uint16_t*>(
      detail::ensure(detail::activation_scratch().bf16,
                     static_cast<size_t>(rows * in_features_) * sizeof(uint16_t)));
  detail::round_activations(ctx, x, num_tokens * in_features_, x_bf16, nullptr);
  std::memset(x_bf16 + num_tokens * in_features_, 0,
              static_cast<size_t>((rows - num_tokens) * in_features_) * sizeof(uint16_t));
  const int64_t groups = detail::mxfp4_amx_num_groups(out_features_);
  const int64_t threads = std::max(ctx.num_threads, 1);
  // One contiguous range of row groups per thread: one sequential DRAM stream each.
  parallel_for(ctx, groups, (groups + threads - 1) / threads, [&](int64_t begin, int64_t end) {
    if (gemm) {
      detail::mxfp4_amx_gemm_groups(packed_data(), scale_data(), in_features_, out_features_,
                                    x_bf16, num_tokens, y, out_features_, begin, end);
      return;
    }
    for (int64_t t = 0; t < num_tokens; t += detail::kMxfp4AmxGemvMaxTokens)
      (scales_fold_ ? detail::mxfp4_amx_gemv_folded_groups : detail::mxfp4_amx_gemv_groups)(
          packed_data(), scale_data(), in_features_, out_features_, x_bf16 + t * in_features_,
          std::min(detail::kMxfp4AmxGemvMaxTokens, num_tokens - t), y + t * out_features_,
          out_features_, begin, end);
  });
}

void Mxfp4Linear::forward_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens,
                                float* y) const {
  const int64_t num_elems = num_tokens * in_features_;
  detail::ActivationScratch& scratch = detail::activation_scratch();
  auto* x_bf16 = reinterpret_cast<uint16_t*>(
      detail::ensure(scratch.bf16, static_cast<size_t>(num_elems) * sizeof(uint16_t)));
  float* x_f32 = nullptr;
  if (any_subnormal_)
    x_f32 = reinterpret_cast<float*>(
        detail::ensure(scratch.f32, static_cast<size_t>(num_elems) * sizeof(float)));
  detail::round_activations(ctx, x, num_elems, x_bf16, x_f32);
  const int64_t rows_per_tile = tile_rows();
  const int64_t num_row_tiles = (out_features_ + rows_per_tile - 1) / rows_per_tile;
  const int64_t num_token_tiles = (num_tokens + detail::kTileTokens - 1) / detail::kTileTokens;
  parallel_for(ctx, num_row_tiles * num_token_tiles, 1, [&](int64_t task_begin, int64_t task_end) {
    thread_local AlignedBuffer workspace;
    std::byte* tile = detail::ensure(workspace, kWorkspaceBytes);
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t row_begin = (task / num_token_tiles) * rows_per_tile;
      const int64_t rows = std::min(rows_per_tile, out_features_ - row_begin);
      const int64_t token_begin = (task % num_token_tiles) * detail::kTileTokens;
      const int64_t tokens = std::min(detail::kTileTokens, num_tokens - token_begin);
      bool f32 = false;
      for (int64_t i = row_begin; i < row_begin + rows; ++i)
        f32 = f32 || row_subnormal_[static_cast<size_t>(i)] != 0;
      detail::mxfp4_dequantize_rows_avx512(packed_data(), scale_data(), in_features_, row_begin,
                                           row_begin + rows,
                                           f32 ? nullptr : reinterpret_cast<uint16_t*>(tile),
                                           f32 ? reinterpret_cast<float*>(tile) : nullptr);
      matmuls_.run({.num_tokens = tokens,
                    .in_features = in_features_,
                    .cols = rows,
                    .y_stride = out_features_,
                    .f32 = f32,
                    .x = f32 ? static_cast<const void*>(x_f32 + token_begin * in_features_)
                             : static_cast<const void*>(x_bf16 + token_begin * in_features_),
                    .weights_desc = detail::tile_weights_desc(in_features_, rows, f32),
                    .weights = tile,
                    .y = y + token_begin * out_features_ + row_begin});
    }
  });
}

void Mxfp4Linear::dequantize(float* out) const {
  const int64_t num_elems = out_features_ * in_features_;
  if (kernels_ == Kernels::kMxint8Vnni) {
    const int64_t row_bytes =
        detail::mxint8_num_groups(in_features_) * detail::kMxint8GroupWeightBytes;
    for (int64_t i = 0; i < out_features_; ++i)
      for (int64_t j = 0; j < in_features_; ++j) {
        const detail::Mxfp4VnniNibble at = detail::mxfp4_vnni_nibble(j);
        const int code = (packed_data()[i * row_bytes + at.byte] >> at.shift) & 0xF;
        out[i * in_features_ + j] =
            formats::kE2m1Values[static_cast<size_t>(code)] *
            formats::kE8m0Values[scale_data()[i * (in_features_ / 32) + j / 32]];
      }
    return;
  }
  if (kernels_ == Kernels::kAmx) {
    for (int64_t i = 0; i < out_features_; ++i)
      for (int64_t j = 0; j < in_features_; ++j) {
        const detail::Mxfp4AmxNibble at = detail::mxfp4_amx_nibble(in_features_, i, j);
        const int code = (packed_data()[at.byte] >> at.shift) & 0xF;
        out[i * in_features_ + j] = formats::kE2m1Values[static_cast<size_t>(code)] *
                                    formats::kE8m0Values[scale_data()[detail::mxfp4_amx_scale_index(
                                        in_features_, i, j / 32)]];
      }
    return;
  }
  formats::dequantize_mxfp4_packed(
      std::span<const uint8_t>(packed_data(), static_cast<size_t>(num_elems / 2)),
      std::span<const uint8_t>(scale_data(), static_cast<size_t>(num_elems / 32)), out_features_,
      in_features_, std::span<float>(out, static_cast<size_t>(num_elems)));
}

namespace detail {

void mxfp4_vnni_repack_row(const uint8_t* packed_row, int64_t in, uint8_t* out) {
  const int64_t groups = mxint8_num_groups(in);
  std::memset(out, 0, static_cast<size_t>(groups * kMxint8GroupWeightBytes));
  for (int64_t j = 0; j < in; ++j) {
    const int code = j % 2 == 0 ? packed_row[j / 2] & 0xF : packed_row[j / 2] >> 4;
    const Mxfp4VnniNibble at = mxfp4_vnni_nibble(j);
    out[at.byte] = static_cast<uint8_t>(out[at.byte] | code << at.shift);
  }
}

}  // namespace detail

}  // namespace dz::kernels
