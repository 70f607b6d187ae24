#include "dayzero/kernels/gemm_small_bf16.h"

#include <algorithm>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/kernels/cpu_features.h"

namespace dz::kernels {
namespace detail {
void gemm_small_bf16_amx_rows(const AmxPanelWeight& weight, const uint16_t* x_bf16,
                              int64_t padded_tokens, int64_t num_tokens, int64_t panel_begin,
                              int64_t panel_end, float* y);
void round_rows_to_bf16_avx512(const float* x, int64_t num_rows, int64_t cols, int64_t padded_cols,
                               int64_t padded_rows, uint16_t* out);
}  // namespace detail

namespace {

constexpr int64_t kPanelCols = 64;
constexpr int64_t kBlockDepth = 32;

}  // namespace

bool gemm_small_bf16_amx_available() {
  return cpu_features().amx_bf16;
}

std::optional<AmxPanelWeight> amx_panel_weight(const dnnl::memory::desc& desc, const void* data,
                                               int64_t in_features, int64_t out_features) {
  if (!gemm_small_bf16_amx_available() || data == nullptr) return std::nullopt;
  const dnnl_memory_desc_t& d = desc.data;
  if (d.ndims != 2 || d.data_type != dnnl_bf16 || d.format_kind != dnnl_blocked ||
      d.dims[0] != in_features || d.dims[1] != out_features || d.offset0 != 0)
    return std::nullopt;
  const int64_t padded_in = (in_features + kBlockDepth - 1) / kBlockDepth * kBlockDepth;
  const int64_t padded_out = (out_features + kPanelCols - 1) / kPanelCols * kPanelCols;
  const dnnl_blocking_desc_t& b = d.format_desc.blocking;
  const bool blocks_match = b.inner_nblks == 3 && b.inner_blks[0] == 16 && b.inner_idxs[0] == 0 &&
                            b.inner_blks[1] == kPanelCols && b.inner_idxs[1] == 1 &&
                            b.inner_blks[2] == 2 && b.inner_idxs[2] == 0;
  if (!blocks_match || d.padded_dims[0] != padded_in || d.padded_dims[1] != padded_out ||
      b.strides[0] != kBlockDepth * kPanelCols || b.strides[1] != padded_in * kPanelCols)
    return std::nullopt;
  return AmxPanelWeight{.data = static_cast<const uint16_t*>(data),
                        .in_features = in_features,
                        .out_features = out_features,
                        .padded_in = padded_in,
                        .padded_out = padded_out};
}

void gemm_small_bf16_amx(const ExecContext& ctx, const AmxPanelWeight& weight, const float* x,
                         int64_t num_tokens, float* y) {
  DZ_CHECK(num_tokens >= 1 && num_tokens <= kGemmSmallBf16MaxTokens,
           "gemm_small_bf16_amx: {} tokens, at most {}", num_tokens, kGemmSmallBf16MaxTokens);
  // x as BF16 codes [padded_tokens, padded_in], zero-padded: whole 16-row A tiles, whole K blocks.
  const int64_t padded_tokens = (num_tokens + 15) / 16 * 16;
  thread_local std::vector<uint16_t> x_bf16;
  x_bf16.resize(static_cast<size_t>(padded_tokens * weight.padded_in));
  detail::round_rows_to_bf16_avx512(x, num_tokens, weight.in_features, weight.padded_in,
                                    padded_tokens, x_bf16.data());
  const int64_t num_panels = weight.padded_out / kPanelCols;
  const int64_t threads = std::max(ctx.num_threads, 1);
  const int64_t grain = std::max<int64_t>(1, (num_panels + threads - 1) / threads);
  const uint16_t* xb = x_bf16.data();
  parallel_for(ctx, num_panels, grain, [&](int64_t begin, int64_t end) {
    detail::gemm_small_bf16_amx_rows(weight, xb, padded_tokens, num_tokens, begin, end, y);
  });
}

void pack_amx_panels(const uint16_t* w, int64_t out_features, int64_t in_features,
                     uint16_t* out_panels) {
  const int64_t padded_in = (in_features + kBlockDepth - 1) / kBlockDepth * kBlockDepth;
  const int64_t padded_out = (out_features + kPanelCols - 1) / kPanelCols * kPanelCols;
  std::fill_n(out_panels, padded_in * padded_out, uint16_t{0});
  for (int64_t n = 0; n < out_features; ++n)
    for (int64_t k = 0; k < in_features; ++k) {
      const int64_t panel = n / kPanelCols, block = k / kBlockDepth;
      const int64_t pair = (k % kBlockDepth) / 2, half = k % 2;
      out_panels[(panel * padded_in / kBlockDepth + block) * kBlockDepth * kPanelCols +
                 (pair * kPanelCols + n % kPanelCols) * 2 + half] = w[n * in_features + k];
    }
}

}  // namespace dz::kernels
