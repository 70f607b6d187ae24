// The KDA oracle: docs/models.md §4.4 token by token, the state held in double during the call.
#include <cmath>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/kernels/kda.h"

namespace dz::kernels {

void kda_recurrent_ref(const KdaDims& dims, const float* q, const float* k, const float* v,
                       const float* g, const float* beta, int64_t num_tokens, float* state,
                       float* out) {
  DZ_CHECK(dims.num_heads > 0 && dims.head_dim > 0, "KDA dims H = {}, d = {}", dims.num_heads,
           dims.head_dim);
  const int64_t H = dims.num_heads, d = dims.head_dim;
  const double sc = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> s(static_cast<size_t>(d * d));  // S[kk][vv], K-first here on purpose
  for (int64_t h = 0; h < H; ++h) {
    float* sh = state + h * d * d;  // V-first [d_v, d_k]
    for (int64_t vv = 0; vv < d; ++vv) {
      for (int64_t kk = 0; kk < d; ++kk) s[kk * d + vv] = sh[vv * d + kk];
    }
    for (int64_t t = 0; t < num_tokens; ++t) {
      const int64_t base = (t * H + h) * d;
      for (int64_t kk = 0; kk < d; ++kk) {
        const double alpha = std::exp(static_cast<double>(g[base + kk]));
        for (int64_t vv = 0; vv < d; ++vv) s[kk * d + vv] *= alpha;
      }
      const double b = beta[t * H + h];
      for (int64_t vv = 0; vv < d; ++vv) {
        double pred = 0;
        for (int64_t kk = 0; kk < d; ++kk) pred += s[kk * d + vv] * k[base + kk];
        const double u = b * (v[base + vv] - pred);
        for (int64_t kk = 0; kk < d; ++kk) s[kk * d + vv] += k[base + kk] * u;
      }
      for (int64_t vv = 0; vv < d; ++vv) {
        double o = 0;
        for (int64_t kk = 0; kk < d; ++kk) o += s[kk * d + vv] * (sc * q[base + kk]);
        out[base + vv] = static_cast<float>(o);
      }
    }
    for (int64_t vv = 0; vv < d; ++vv) {
      for (int64_t kk = 0; kk < d; ++kk) sh[vv * d + kk] = static_cast<float>(s[kk * d + vv]);
    }
  }
}

}  // namespace dz::kernels
