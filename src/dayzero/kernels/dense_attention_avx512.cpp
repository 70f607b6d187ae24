// AVX512-BF16 body of dense_attention.h. A work item is a group of 4 queries of one head; it runs
// over the keys in tiles of 64 with an online softmax:
//   scores: for each head-dimension pair, 4 key vectors (16 keys × the pair, VDPBF16PS's B operand)
//           times each query's broadcast pair: 16 accumulators, each key load shared by 4 queries;
//   softmax: scale, mask the padding keys, running maximum, e^(s − max), the row sums in FP32,
//           the old outputs scaled by e^(old max − new max), the probabilities rounded to BF16;
//   outputs: for each key pair, the values of 64 head dimensions (4 vectors of 16 dims × the pair)
//           times each query's broadcast probability pair, 64 dimensions at a time.
// GCC 12's AVX-512 headers trip -Wmaybe-uninitialized on their own _mm512_undefined_*() idiom
// (GCC bug 105593); the warning is about the header, not this code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "dayzero/kernels/dense_attention.h"
#include "dayzero/kernels/exp_avx512.h"
#include "dayzero/kernels/unroll.h"

namespace dz::kernels::detail {
namespace {

constexpr int kGroup = static_cast<int>(kDenseQueryGroup);
constexpr int kKeyVectors = static_cast<int>(kDenseKeyTile / 16);

inline __m512bh pair_of(const uint16_t* codes) {
  int32_t bits;
  std::memcpy(&bits, codes, sizeof(bits));
  return (__m512bh)_mm512_set1_epi32(bits);
}

}  // namespace

void dense_attention_groups_avx512(const DenseHeadPacked& head, float softmax_scale,
                                   int64_t group_begin, int64_t group_end, float* out,
                                   int64_t out_stride) {
  const int64_t n = head.num_tokens;
  const int64_t hd = head.head_dim;
  const int64_t pairs = hd / 2;
  const __m512 scale = _mm512_set1_ps(softmax_scale);
  // A block of groups shares each key tile, read once from memory and then from L1/L2 (a head's
  // keys and values are megabytes; one group alone would stream them from L3 for 4 queries).
  constexpr int64_t kBlockGroups = kDenseBlockQueries / kDenseQueryGroup;
  alignas(64) float o[kDenseBlockQueries][kDenseAttentionMaxHeadDim];
  alignas(64) uint16_t p[kGroup][kDenseKeyTile];
  float running_max[kDenseBlockQueries];
  float total[kDenseBlockQueries];
  for (int64_t block = group_begin; block < group_end; block += kBlockGroups) {
    const int64_t block_groups = std::min(kBlockGroups, group_end - block);
    for (int64_t r = 0; r < block_groups * kGroup; ++r) {
      running_max[r] = -INFINITY;
      total[r] = 0;
      std::fill_n(o[r], hd, 0.0f);
    }
    for (int64_t tile = 0; tile < n; tile += kDenseKeyTile) {
      const uint16_t* k = head.k + tile / 16 * pairs * 32;
      const uint16_t* v = head.v + tile / 2 * hd * 2;
      const int64_t valid = std::min(kDenseKeyTile, n - tile);
      const int64_t key_pairs = (valid + 1) / 2;
      for (int64_t g = 0; g < block_groups; ++g) {
        const int64_t first = (block + g) * kGroup;
        float(*og)[kDenseAttentionMaxHeadDim] = o + g * kGroup;
        float* mg = running_max + g * kGroup;
        float* lg = total + g * kGroup;
        const uint16_t* q[kGroup];
        DZ_UNROLL(4)
        for (int r = 0; r < kGroup; ++r) q[r] = head.q + std::min(first + r, n - 1) * hd;
        // Scores of 4 queries × 64 keys.
        __m512 s[kGroup][kKeyVectors];
        DZ_UNROLL(4)
        for (int r = 0; r < kGroup; ++r) DZ_UNROLL(4)
        for (int j = 0; j < kKeyVectors; ++j) s[r][j] = _mm512_setzero_ps();
        for (int64_t e = 0; e < pairs; ++e) {
          __m512bh kv[kKeyVectors];
          DZ_UNROLL(4)
          for (int j = 0; j < kKeyVectors; ++j)
            kv[j] = (__m512bh)_mm512_loadu_si512(k + (j * pairs + e) * 32);
          DZ_UNROLL(4)
          for (int r = 0; r < kGroup; ++r) {
            const __m512bh qv = pair_of(q[r] + 2 * e);
            DZ_UNROLL(4)
            for (int j = 0; j < kKeyVectors; ++j) s[r][j] = _mm512_dpbf16_ps(s[r][j], qv, kv[j]);
          }
        }
        // Online softmax; keys past n (the last tile's padding) get probability 0.
        DZ_UNROLL(4)
        for (int r = 0; r < kGroup; ++r) {
          __m512 top = _mm512_set1_ps(-INFINITY);
          DZ_UNROLL(4)
          for (int j = 0; j < kKeyVectors; ++j) {
            const int64_t lanes = std::clamp<int64_t>(valid - 16 * j, 0, 16);
            const auto live = static_cast<__mmask16>((1u << lanes) - 1u);
            s[r][j] = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), live, s[r][j], scale);
            top = _mm512_max_ps(top, s[r][j]);
          }
          const float new_max = std::max(mg[r], _mm512_reduce_max_ps(top));
          const float correction = std::exp(mg[r] - new_max);
          mg[r] = new_max;
          const __m512 shift = _mm512_set1_ps(new_max);
          __m512 sum = _mm512_setzero_ps();
          DZ_UNROLL(4)
          for (int j = 0; j < kKeyVectors; ++j) {
            s[r][j] = exp_ps(_mm512_sub_ps(s[r][j], shift));
            sum = _mm512_add_ps(sum, s[r][j]);
          }
          lg[r] = lg[r] * correction + _mm512_reduce_add_ps(sum);
          DZ_UNROLL(4)
          for (int j = 0; j < kKeyVectors; j += 2)  // keys in order, as BF16 pairs
            _mm512_storeu_si512(p[r] + 16 * j, (__m512i)_mm512_cvtne2ps_pbh(s[r][j + 1], s[r][j]));
          if (correction != 1.0f) {
            const __m512 c = _mm512_set1_ps(correction);
            for (int64_t d = 0; d < hd; d += 16)
              _mm512_store_ps(og[r] + d, _mm512_mul_ps(_mm512_load_ps(og[r] + d), c));
          }
        }
        // Outputs += P · V, 64 head dimensions at a time.
        for (int64_t d0 = 0; d0 < hd; d0 += 64) {
          __m512 acc[kGroup][4];
          DZ_UNROLL(4)
          for (int r = 0; r < kGroup; ++r) DZ_UNROLL(4)
          for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_load_ps(og[r] + d0 + 16 * j);
          for (int64_t t = 0; t < key_pairs; ++t) {
            const uint16_t* vt = v + (t * (hd / 16) + d0 / 16) * 32;
            __m512bh vv[4];
            DZ_UNROLL(4)
            for (int j = 0; j < 4; ++j) vv[j] = (__m512bh)_mm512_loadu_si512(vt + 32 * j);
            DZ_UNROLL(4)
            for (int r = 0; r < kGroup; ++r) {
              const __m512bh pv = pair_of(p[r] + 2 * t);
              DZ_UNROLL(4)
              for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], pv, vv[j]);
            }
          }
          DZ_UNROLL(4)
          for (int r = 0; r < kGroup; ++r) DZ_UNROLL(4)
          for (int j = 0; j < 4; ++j) _mm512_store_ps(og[r] + d0 + 16 * j, acc[r][j]);
        }
      }
    }
    for (int64_t r = 0; r < block_groups * kGroup; ++r) {
      const int64_t token = block * kGroup + r;
      if (token >= n) break;
      const __m512 inverse = _mm512_set1_ps(1.0f / total[r]);
      float* row = out + token * out_stride;
      for (int64_t d = 0; d < hd; d += 16)
        _mm512_storeu_ps(row + d, _mm512_mul_ps(_mm512_load_ps(o[r] + d), inverse));
    }
  }
}

}  // namespace dz::kernels::detail
