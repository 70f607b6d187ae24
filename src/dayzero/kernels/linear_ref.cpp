#include "dayzero/kernels/linear_ref.h"

#include <array>
#include <cmath>
#include <span>
#include <vector>

#include "dayzero/formats/codecs.h"
#include "dayzero/formats/mxint8.h"

namespace dz::kernels {
namespace {

std::vector<float> rounded_row(const float* x, int64_t in_features) {
  std::vector<float> row(static_cast<size_t>(in_features));
  for (int64_t j = 0; j < in_features; ++j) row[j] = formats::round_to_bf16(x[j]);
  return row;
}

}  // namespace

void linear_bf16_ref(const uint16_t* weight_bf16, int64_t out_features, int64_t in_features,
                     const float* x, int64_t num_tokens, float* y) {
  for (int64_t t = 0; t < num_tokens; ++t) {
    const std::vector<float> xt = rounded_row(x + t * in_features, in_features);
    for (int64_t i = 0; i < out_features; ++i) {
      const uint16_t* w = weight_bf16 + i * in_features;
      float acc = 0.0f;
      for (int64_t j = 0; j < in_features; ++j) acc += xt[j] * formats::decode_bf16(w[j]);
      y[t * out_features + i] = acc;
    }
  }
}

void linear_fp8_block_ref(const uint8_t* codes, const float* scale_inv,
                          const formats::Fp8BlockShape& shape, const float* x, int64_t num_tokens,
                          float* y) {
  const int64_t num_scale_cols = shape.num_scale_cols();
  for (int64_t t = 0; t < num_tokens; ++t) {
    const std::vector<float> xt = rounded_row(x + t * shape.num_cols, shape.num_cols);
    for (int64_t i = 0; i < shape.num_rows; ++i) {
      const uint8_t* w = codes + i * shape.num_cols;
      const float* scale_row = scale_inv + (i / shape.block_rows) * num_scale_cols;
      float acc = 0.0f;
      for (int64_t j = 0; j < shape.num_cols; ++j)
        acc += xt[j] * (formats::decode_e4m3(w[j]) * scale_row[j / shape.block_cols]);
      y[t * shape.num_rows + i] = acc;
    }
  }
}

void linear_mxfp4_ref(const uint8_t* packed, const uint8_t* scales, int64_t out_features,
                      int64_t in_features, const float* x, int64_t num_tokens, float* y) {
  const int64_t row_bytes = in_features / 2, num_blocks = in_features / 32;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const std::vector<float> xt = rounded_row(x + t * in_features, in_features);
    for (int64_t i = 0; i < out_features; ++i) {
      const uint8_t* w = packed + i * row_bytes;
      const uint8_t* s = scales + i * num_blocks;
      float acc = 0.0f;
      for (int64_t j = 0; j < in_features; ++j) {
        const auto nibble = static_cast<uint8_t>(j % 2 == 0 ? w[j / 2] & 0xF : w[j / 2] >> 4);
        acc += xt[j] * (formats::decode_e2m1(nibble) * formats::decode_e8m0(s[j / 32]));
      }
      y[t * out_features + i] = acc;
    }
  }
}

void linear_mxfp4_mxint8_ref(const uint8_t* packed, const uint8_t* scales, int64_t out_features,
                             int64_t in_features, const float* x, int64_t num_tokens, float* y) {
  constexpr int kLanes = 16;
  const int64_t row_bytes = in_features / 2, num_blocks = in_features / 32;
  std::vector<int8_t> q(static_cast<size_t>(in_features));
  std::vector<float> half_scale(static_cast<size_t>(num_blocks));
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t b = 0; b < num_blocks; ++b)
      half_scale[b] = 0.5f * formats::quantize_mxint8_block(
                                 std::span<const float, 32>(x + t * in_features + 32 * b, 32),
                                 std::span<int8_t, 32>(q.data() + 32 * b, 32));
    for (int64_t i = 0; i < out_features; ++i) {
      const uint8_t* w = packed + i * row_bytes;
      const uint8_t* s = scales + i * num_blocks;
      std::array<float, kLanes> lanes{};
      for (int64_t b = 0; b < num_blocks; ++b) {
        int32_t dot = 0;
        for (int64_t j = 32 * b; j < 32 * b + 32; ++j) {
          const auto nibble = static_cast<uint8_t>(j % 2 == 0 ? w[j / 2] & 0xF : w[j / 2] >> 4);
          dot += static_cast<int32_t>(2.0f * formats::decode_e2m1(nibble)) * q[j];
        }
        const float scale = formats::decode_e8m0(s[b]) * half_scale[b];
        lanes[b % kLanes] = std::fma(static_cast<float>(dot), scale, lanes[b % kLanes]);
      }
      for (int width = kLanes / 2; width >= 1; width /= 2)
        for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
      y[t * out_features + i] = lanes[0];
    }
  }
}

}  // namespace dz::kernels
