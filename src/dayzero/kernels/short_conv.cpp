#include "dayzero/kernels/short_conv.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/fast_math.h"

namespace dz::kernels {
namespace {

// Channels per work item: one history tile [width−1, kBlock] and transposed taps stay in L1.
constexpr int64_t kBlock = 64;

void check_args(int64_t num_tokens, int64_t channels, int64_t width) {
  DZ_CHECK(num_tokens >= 0 && channels > 0, "short conv T = {}, channels = {}", num_tokens,
           channels);
  DZ_CHECK(width >= 1 && width <= kMaxShortConvWidth, "short conv width {} not in [1, {}]", width,
           kMaxShortConvWidth);
}

// xp row i of channel c: the state for i < width − 1, then x.
float xp_at(const float* x, const uint16_t* conv_state, int64_t channels, int64_t width, int64_t i,
            int64_t c) {
  return i < width - 1 ? formats::decode_bf16(conv_state[i * channels + c])
                       : x[(i - (width - 1)) * channels + c];
}

}  // namespace

void short_conv_silu(const ExecContext& ctx, const float* x, int64_t num_tokens, int64_t channels,
                     const float* w, int64_t width, uint16_t* conv_state, float* y) {
  check_args(num_tokens, channels, width);
  const int64_t num_blocks = (channels + kBlock - 1) / kBlock;
  const int64_t hist_rows = width - 1;
  // Per block: width multiply-adds and a SiLU (≈ 10 FLOPs) per channel and token.
  const int64_t block_flops = num_tokens * kBlock * (2 * width + 10);
  const int64_t grain = grain_for_work(block_flops, kMinParallelFlops);
  parallel_for(ctx, num_blocks, grain, [&](int64_t blk_begin, int64_t blk_end) {
    if (cpu_features().avx512) {
      const int64_t c_end = std::min(channels, blk_end * kBlock);
      detail::short_conv_silu_avx512(x, num_tokens, channels, w, width, conv_state, y,
                                     blk_begin * kBlock, c_end);
      return;
    }
    float hist[kMaxShortConvWidth][kBlock];  // rows 0 … width−2: the window before token t
    float taps[kMaxShortConvWidth][kBlock];  // w transposed to [width, block]
    for (int64_t blk = blk_begin; blk < blk_end; ++blk) {
      const int64_t c0 = blk * kBlock;
      const int64_t nc = std::min(kBlock, channels - c0);
      for (int64_t j = 0; j < width; ++j) {
        for (int64_t c = 0; c < nc; ++c) taps[j][c] = w[(c0 + c) * width + j];
      }
      for (int64_t j = 0; j < hist_rows; ++j) {
        for (int64_t c = 0; c < nc; ++c) {
          hist[j][c] = formats::decode_bf16(conv_state[j * channels + c0 + c]);
        }
      }
      for (int64_t t = 0; t < num_tokens; ++t) {
        const float* xt = x + t * channels + c0;
        float* yt = y + t * channels + c0;
        for (int64_t c = 0; c < nc; ++c) {
          float acc = 0;
          for (int64_t j = 0; j < hist_rows; ++j) acc += taps[j][c] * hist[j][c];
          acc += taps[width - 1][c] * xt[c];
          yt[c] = silu_fast(acc);
        }
        for (int64_t j = 0; j + 1 < hist_rows; ++j) {
          for (int64_t c = 0; c < nc; ++c) hist[j][c] = hist[j + 1][c];
        }
        if (hist_rows > 0) {
          for (int64_t c = 0; c < nc; ++c) hist[hist_rows - 1][c] = xt[c];
        }
      }
      for (int64_t j = 0; j < hist_rows; ++j) {
        for (int64_t c = 0; c < nc; ++c) {
          conv_state[j * channels + c0 + c] = formats::encode_bf16(hist[j][c]);
        }
      }
    }
  });
}

void short_conv_silu_ref(const ExecContext& ctx, const float* x, int64_t num_tokens,
                         int64_t channels, const float* w, int64_t width, uint16_t* conv_state,
                         float* y) {
  (void)ctx;
  check_args(num_tokens, channels, width);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t c = 0; c < channels; ++c) {
      double acc = 0;
      for (int64_t j = 0; j < width; ++j) {
        acc +=
            static_cast<double>(w[c * width + j]) * xp_at(x, conv_state, channels, width, t + j, c);
      }
      y[t * channels + c] = static_cast<float>(acc / (1.0 + std::exp(-acc)));
    }
  }
  // The new state: the last width − 1 rows of xp (read before overwriting).
  const int64_t hist_rows = width - 1;
  std::vector<uint16_t> next(static_cast<size_t>(hist_rows * channels));
  for (int64_t j = 0; j < hist_rows; ++j) {
    for (int64_t c = 0; c < channels; ++c) {
      next[j * channels + c] =
          formats::encode_bf16(xp_at(x, conv_state, channels, width, num_tokens + j, c));
    }
  }
  std::copy(next.begin(), next.end(), conv_state);
}

}  // namespace dz::kernels
