#include "dayzero/kernels/gemm_small_bf16.h"

#include <algorithm>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/kernels/cpu_features.h"

namespace dz::kernels {
namespace detail {
void gemm_small_bf16_amx_rows(const Bf16PanelWeight& weight, const uint16_t* x_bf16,
                              int64_t padded_tokens, int64_t num_tokens, int64_t panel_begin,
                              int64_t panel_end, float* y);
// Items: (panel, block of tokens_per_item tokens), panel-major, so that one thread's range runs
// the token blocks of a panel one after another while the panel is in L1/L2.
void gemm_small_bf16_dpbf16_items(const Bf16PanelWeight& weight, const int32_t* x_packed,
                                  int64_t num_tokens, int64_t tokens_per_item, int64_t item_begin,
                                  int64_t item_end, float* y);
// x rounded to BF16 (RNE) in the order the AVX512-BF16 body reads it: per chunk of K pairs, every
// token's pairs of that chunk together (a per-thread buffer, reused).
const int32_t* pack_dpbf16_activations(const Bf16PanelWeight& weight, const float* x,
                                       int64_t num_tokens);
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

bool gemm_small_bf16_dpbf16_available() {
  return cpu_features().avx512_bf16;
}

bool gemm_small_bf16_available() {
  return gemm_small_bf16_amx_available() || gemm_small_bf16_dpbf16_available();
}

std::optional<Bf16PanelWeight> bf16_panel_weight(const dnnl::memory::desc& desc, const void* data,
                                                 int64_t in_features, int64_t out_features) {
  if (!gemm_small_bf16_available() || data == nullptr) return std::nullopt;
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
  return Bf16PanelWeight{.data = static_cast<const uint16_t*>(data),
                         .in_features = in_features,
                         .out_features = out_features,
                         .padded_in = padded_in,
                         .padded_out = padded_out};
}

bool gemm_small_bf16_takes(int64_t num_tokens) {
  if (gemm_small_bf16_amx_available()) return num_tokens <= kGemmSmallBf16AmxMaxTokens;
  return gemm_small_bf16_dpbf16_available() && num_tokens <= kGemmSmallBf16Dpbf16MaxTokens;
}

void gemm_small_bf16(const ExecContext& ctx, const Bf16PanelWeight& weight, const float* x,
                     int64_t num_tokens, float* y) {
  if (gemm_small_bf16_amx_available())
    gemm_small_bf16_amx(ctx, weight, x, num_tokens, y);
  else
    gemm_small_bf16_dpbf16(ctx, weight, x, num_tokens, y);
}

void gemm_small_bf16_amx(const ExecContext& ctx, const Bf16PanelWeight& weight, const float* x,
                         int64_t num_tokens, float* y) {
  DZ_CHECK(num_tokens >= 1 && num_tokens <= kGemmSmallBf16AmxMaxTokens,
           "gemm_small_bf16_amx: {} tokens, at most {}", num_tokens, kGemmSmallBf16AmxMaxTokens);
  // x as BF16 codes [padded_tokens, padded_in], zero-padded: whole 16-row A tiles, whole K blocks.
  const int64_t padded_tokens = (num_tokens + 15) / 16 * 16;
  thread_local std::vector<uint16_t> x_bf16;
  x_bf16.resize(static_cast<size_t>(padded_tokens * weight.padded_in));
  detail::round_rows_to_bf16_avx512(x, num_tokens, weight.in_features, weight.padded_in,
                                    padded_tokens, x_bf16.data());
  const uint16_t* xb = x_bf16.data();
  // One contiguous range of panels per thread; a second thread only for kMinParallelBytes of
  // weights ([256, 256] at one token: 0.9 µs on one thread, 4.2 on two; gemm_small_bf16_bench).
  const int64_t num_panels = weight.padded_out / kPanelCols;
  const int64_t threads = std::max(ctx.num_threads, 1);
  const int64_t grain =
      std::max((num_panels + threads - 1) / threads,
               grain_for_work(weight.padded_in * kPanelCols * 2, kMinParallelBytes));
  parallel_for(ctx, num_panels, grain, [&](int64_t begin, int64_t end) {
    detail::gemm_small_bf16_amx_rows(weight, xb, padded_tokens, num_tokens, begin, end, y);
  });
}

void gemm_small_bf16_dpbf16(const ExecContext& ctx, const Bf16PanelWeight& weight, const float* x,
                            int64_t num_tokens, float* y) {
  DZ_CHECK(num_tokens >= 1 && num_tokens <= kGemmSmallBf16Dpbf16MaxTokens,
           "gemm_small_bf16_dpbf16: {} tokens, at most {}", num_tokens,
           kGemmSmallBf16Dpbf16MaxTokens);
  const int32_t* xp = detail::pack_dpbf16_activations(weight, x, num_tokens);
  const int64_t num_panels = weight.padded_out / kPanelCols;
  const int64_t per_item = std::min(num_tokens, detail::kDpbf16ItemTokens);
  const int64_t num_items = num_panels * ((num_tokens + per_item - 1) / per_item);
  const int64_t item_bytes =
      weight.padded_in * kPanelCols * 2 *
      ((per_item + detail::kDpbf16GroupTokens - 1) / detail::kDpbf16GroupTokens);
  const int64_t threads = std::max(ctx.num_threads, 1);
  const int64_t grain =
      std::max((num_items + threads - 1) / threads, grain_for_work(item_bytes, kMinParallelBytes));
  parallel_for(ctx, num_items, grain, [&](int64_t begin, int64_t end) {
    detail::gemm_small_bf16_dpbf16_items(weight, xp, num_tokens, per_item, begin, end, y);
  });
}

void pack_bf16_panels(const uint16_t* w, int64_t out_features, int64_t in_features,
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
