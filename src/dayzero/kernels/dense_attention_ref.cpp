#include <algorithm>
#include <cmath>
#include <vector>

#include "dayzero/kernels/dense_attention.h"

namespace dz::kernels {

void dense_attention_ref(const DenseAttentionArgs& a) {
  const int64_t n = a.num_tokens;
  const int64_t hd = a.head_dim;
  std::vector<double> scores(static_cast<size_t>(n));
  for (int64_t h = 0; h < a.num_heads; ++h)
    for (int64_t i = 0; i < n; ++i) {
      const float* q = a.q + i * a.q_stride + h * hd;
      double top = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        const float* k = a.k + j * a.k_stride + h * hd;
        double s = 0;
        for (int64_t e = 0; e < hd; ++e) s += static_cast<double>(q[e]) * k[e];
        scores[static_cast<size_t>(j)] = s * a.softmax_scale;
        top = std::max(top, scores[static_cast<size_t>(j)]);
      }
      double total = 0;
      for (double& s : scores) total += (s = std::exp(s - top));
      float* out = a.out + i * a.out_stride + h * hd;
      for (int64_t e = 0; e < hd; ++e) {
        double acc = 0;
        for (int64_t j = 0; j < n; ++j)
          acc += scores[static_cast<size_t>(j)] * a.v[j * a.v_stride + h * hd + e];
        out[e] = static_cast<float>(acc / total);
      }
    }
}

}  // namespace dz::kernels
