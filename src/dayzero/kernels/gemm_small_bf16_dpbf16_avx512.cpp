// AVX512-BF16 body of gemm_small_bf16.h, for CPUs without AMX. A panel is [K / 2 pairs][64
// columns][2] BF16 codes, contiguous (its 32-deep blocks follow each other), so one K pair of a
// panel is four zmm of 16 columns × 2 codes: exactly VDPBF16PS's B operand. Each token's pair of
// activations is broadcast as one 32-bit lane and multiplied into four accumulators (64 columns);
// up to kGroupTokens tokens share each weight load. Even and odd pairs go to two accumulator sets
// (eight independent VDPBF16PS chains per token hide its latency), added at the end. A work item
// (a panel × up to 48 tokens) runs the panel in chunks of kChunkPairs pairs, each for all its
// token groups while it is in L1; the activations are packed so that a chunk's tokens are
// contiguous too (pack_dpbf16_activations).
//
// Every token's output is summed in the same order whatever the token count, grouping and chunking
// (accumulators saved and reloaded between chunks exactly), so a row of several tokens gives each
// one bit for bit what a one-token forward gives it: a speculative verification row or a prefill
// chunk scores its tokens exactly as decode steps would.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/kernels/gemm_small_bf16.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels::detail {
namespace {

constexpr int64_t kPanelCols = 64;
constexpr int64_t kPairCodes = kPanelCols * 2;  // one K pair of a panel
constexpr int64_t kGroupTokens = kDpbf16GroupTokens;
constexpr int kSets = 2;
// Weights are prefetched into L2 8 KiB ahead: one thread streaming a panel from DRAM reached 0.47
// of the DRAM read rate without it, 0.89 with it (two 4 KiB pages ahead; gemm_small_bf16_bench,
// Zen 5). A prefetch past the end of a panel reads the next one (or, past the last, nothing: a
// prefetch does not fault).
constexpr int64_t kPrefetchCodes = 8192 / 2;
// Pairs of a panel run for every token group of an item before the next ones: 128 pairs of 64
// columns are 32 KiB, in L1 while the groups pass over them. Without chunks a panel of 7168 inputs
// (896 KiB) was read from L3 or DRAM again by each group: 512 tokens on one thread took 0.6 of
// oneDNN's speed (gemm_small_bf16_bench, Zen 5). An even count, as each step takes two pairs.
constexpr int64_t kChunkPairs = 128;

// f(s, t, i) for every accumulator of kTokens tokens, unrolled, so that they stay in registers.
template <int kTokens, typename F>
inline void for_each_acc(const F& f) {
  DZ_UNROLL(2)
  for (int s = 0; s < kSets; ++s) {
    DZ_UNROLL(3)
    for (int t = 0; t < kTokens; ++t) {
      DZ_UNROLL(4)
      for (int i = 0; i < 4; ++i) f(s, t, i);
    }
  }
}

// Pairs [pair_begin, pair_end) of one panel for kTokens tokens. The accumulators come from `acc`
// ([kSets][kTokens][4] vectors, FP32) unless `first` (zero), and go back there unless `last`, where
// the two sets are added and y[t, c] for c < cols (≤ 64) stored. Saving and reloading FP32
// registers is exact, so a token's sums do not depend on how the pairs are cut into chunks.
// x: the group's first token's pairs of this chunk; the next token's follow kChunkPairs later.
template <int kTokens>
void panel_tokens(const int32_t* x, const uint16_t* panel, int64_t pair_begin, int64_t pair_end,
                  bool first, bool last, float* acc_store, int64_t cols, float* y,
                  int64_t y_stride) {
  // Every loop over the accumulators is unrolled, so that they live in registers.
  __m512 acc[kSets][kTokens][4];
  const auto stored = [&](int s, int t, int i) {
    return acc_store + ((s * kTokens + t) * 4 + i) * 16;
  };
  for_each_acc<kTokens>([&](int s, int t, int i) {
    acc[s][t][i] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(stored(s, t, i));
  });
  for (int64_t j = pair_begin; j < pair_end; j += kSets) {
    DZ_UNROLL(2)
    for (int s = 0; s < kSets; ++s) {
      const uint16_t* w = panel + (j + s) * kPairCodes;
      DZ_UNROLL(4)
      for (int i = 0; i < 4; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchCodes + 32 * i), _MM_HINT_T1);
      __m512bh wv[4];
      DZ_UNROLL(4)
      for (int i = 0; i < 4; ++i) wv[i] = (__m512bh)_mm512_loadu_si512(w + 32 * i);
      DZ_UNROLL(3)
      for (int t = 0; t < kTokens; ++t) {
        const auto xv = (__m512bh)_mm512_set1_epi32(x[t * kChunkPairs + j - pair_begin + s]);
        DZ_UNROLL(4)
        for (int i = 0; i < 4; ++i) acc[s][t][i] = _mm512_dpbf16_ps(acc[s][t][i], xv, wv[i]);
      }
    }
  }
  if (!last) {
    for_each_acc<kTokens>(
        [&](int s, int t, int i) { _mm512_storeu_ps(stored(s, t, i), acc[s][t][i]); });
    return;
  }
  DZ_UNROLL(3)
  for (int t = 0; t < kTokens; ++t) {
    DZ_UNROLL(4)
    for (int i = 0; i < 4; ++i) {
      const __m512 sum = _mm512_add_ps(acc[0][t][i], acc[1][t][i]);
      const int64_t c = 16 * i;
      const int64_t n = std::clamp<int64_t>(cols - c, 0, 16);
      _mm512_mask_storeu_ps(y + t * y_stride + c, static_cast<__mmask16>((1u << n) - 1), sum);
    }
  }
}

using PanelTokens = void (*)(const int32_t*, const uint16_t*, int64_t, int64_t, bool, bool, float*,
                             int64_t, float*, int64_t);
constexpr PanelTokens kPanelTokens[kGroupTokens] = {panel_tokens<1>, panel_tokens<2>,
                                                    panel_tokens<3>};

// Accumulator floats one group keeps between chunks.
constexpr int64_t kGroupAccFloats = kSets * kGroupTokens * 4 * 16;

}  // namespace

const int32_t* pack_dpbf16_activations(const Bf16PanelWeight& weight, const float* x,
                                       int64_t num_tokens) {
  const int64_t in = weight.in_features, num_pairs = weight.padded_in / 2;
  const int64_t num_chunks = (num_pairs + kChunkPairs - 1) / kChunkPairs;
  thread_local std::vector<int32_t> packed;
  packed.assign(static_cast<size_t>(num_chunks * num_tokens * kChunkPairs), 0);
  for (int64_t t = 0; t < num_tokens; ++t)
    for (int64_t c = 0; c < num_chunks; ++c) {
      // Elements [2 · kChunkPairs · c, …) of token t, as BF16 codes (RNE), zeros past `in`.
      auto* dst = reinterpret_cast<uint16_t*>(packed.data() + (c * num_tokens + t) * kChunkPairs);
      const float* src = x + t * in;
      const int64_t begin = 2 * kChunkPairs * c, end = std::min(in, begin + 2 * kChunkPairs);
      for (int64_t e = begin; e < end; e += 16) {
        const auto mask = static_cast<__mmask16>(end - e >= 16 ? 0xFFFF : (1u << (end - e)) - 1);
        const __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, src + e));
        _mm256_mask_storeu_epi16(dst + (e - begin), mask, reinterpret_cast<const __m256i&>(v));
      }
    }
  return packed.data();
}

void gemm_small_bf16_dpbf16_items(const Bf16PanelWeight& weight, const int32_t* x_packed,
                                  int64_t num_tokens, int64_t tokens_per_item, int64_t item_begin,
                                  int64_t item_end, float* y) {
  const int64_t K = weight.padded_in, N = weight.out_features;
  const int64_t num_pairs = K / 2;
  const int64_t items_per_panel = (num_tokens + tokens_per_item - 1) / tokens_per_item;
  // One item's accumulators: its groups of ≤ kGroupTokens tokens.
  alignas(64) float acc[(kDpbf16ItemTokens + kGroupTokens - 1) / kGroupTokens * kGroupAccFloats];
  DZ_CHECK(tokens_per_item <= kDpbf16ItemTokens, "{} tokens per item, at most {}", tokens_per_item,
           kDpbf16ItemTokens);
  for (int64_t item = item_begin; item < item_end; ++item) {
    const int64_t p = item / items_per_panel;
    const int64_t first = item % items_per_panel * tokens_per_item;
    const int64_t count = std::min(tokens_per_item, num_tokens - first);
    const uint16_t* panel = weight.data + p * K * kPanelCols;
    const int64_t col0 = p * kPanelCols, cols = std::min(kPanelCols, N - col0);
    // Groups as even as possible: 4 tokens run as 2 + 2, not 3 + 1.
    const int64_t num_groups = (count + kGroupTokens - 1) / kGroupTokens;
    // The panel in chunks of kChunkPairs pairs, each run for every group while it is in L1.
    for (int64_t c0 = 0; c0 < num_pairs; c0 += kChunkPairs) {
      const int64_t c1 = std::min(num_pairs, c0 + kChunkPairs);
      for (int64_t g = 0, t0 = 0; g < num_groups; ++g) {
        const int64_t t1 = count * (g + 1) / num_groups;
        const int64_t t = first + t0;
        const int32_t* x = x_packed + (c0 / kChunkPairs * num_tokens + t) * kChunkPairs;
        kPanelTokens[t1 - t0 - 1](x, panel, c0, c1, c0 == 0, c1 == num_pairs,
                                  acc + g * kGroupAccFloats, cols, y + t * N + col0, N);
        t0 = t1;
      }
    }
  }
}

}  // namespace dz::kernels::detail
