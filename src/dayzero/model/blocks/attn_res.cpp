#include "dayzero/model/blocks/attn_res.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "dayzero/core/check.h"

namespace dz::model {
namespace {

// Independent partial sums: the compiler vectorises the lane loop without reassociating.
constexpr int kLanes = 16;

// s = (cw·v)·(mean(v²) + eps)^−1/2 over `dim` values, FP32 lanes; rows so large that v² overflows
// FP32 (|v| ≳ 1e18) are rescored in double so the score stays finite.
float row_score(const float* cw, const float* v, int64_t dim, float eps) {
  float dot[kLanes] = {}, squares[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= dim; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      dot[l] += cw[j + l] * v[j + l];
      squares[l] += v[j + l] * v[j + l];
    }
  }
  for (int l = 0; j + l < dim; ++l) {
    dot[l] += cw[j + l] * v[j + l];
    squares[l] += v[j + l] * v[j + l];
  }
  float dot_sum = 0, square_sum = 0;
  for (int l = 0; l < kLanes; ++l) {
    dot_sum += dot[l];
    square_sum += squares[l];
  }
  if (std::isfinite(dot_sum) && std::isfinite(square_sum))
    return dot_sum / std::sqrt(square_sum / static_cast<float>(dim) + eps);
  double dot64 = 0, squares64 = 0;
  for (int64_t i = 0; i < dim; ++i) {
    dot64 += static_cast<double>(cw[i]) * v[i];
    squares64 += static_cast<double>(v[i]) * v[i];
  }
  return static_cast<float>(dot64 / std::sqrt(squares64 / static_cast<double>(dim) + eps));
}

// acc[:] = w·v[:] (first) or acc[:] += w·v[:]. `omp simd`: the rows never alias the output, and
// GCC's -O2 cost model would not vectorise a loop of unknown length on its own.
void scaled_add(float* acc, const float* v, float w, int64_t dim, bool first) {
  if (first) {
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) acc[i] = w * v[i];
  } else {
#pragma omp simd
    for (int64_t i = 0; i < dim; ++i) acc[i] += w * v[i];
  }
}

int64_t token_grain(int64_t num_rows, int64_t dim) {
  return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, num_rows * dim));
}

void check_rows(std::span<const float* const> rows, const float* folded_query, int64_t dim) {
  DZ_CHECK(folded_query != nullptr && dim > 0, "AttnRes: query {} for width {}",
           static_cast<const void*>(folded_query), dim);
  for (const float* row : rows) DZ_CHECK(row != nullptr, "AttnRes: null row");
}

}  // namespace

void visit_attn_res_tensors(TensorVisitor& v, std::string_view name, int64_t dim,
                            AttnResQueryWeights& w) {
  const std::string n(name);
  v.floats(n + "_proj.weight", {1, dim}, DType::kBF16, Split::kReplicated, w.proj);
  v.floats(n + "_norm.weight", {dim}, DType::kBF16, Split::kReplicated, w.norm);
}

std::vector<float> attn_res_folded_query(std::span<const float> proj_weight,
                                         std::span<const float> norm_weight) {
  DZ_CHECK(proj_weight.size() == norm_weight.size(),
           "AttnRes: proj weight of {} values, norm weight of {}", proj_weight.size(),
           norm_weight.size());
  std::vector<float> cw(proj_weight.size());
  for (size_t i = 0; i < cw.size(); ++i) cw[i] = norm_weight[i] * proj_weight[i];
  return cw;
}

void attn_res_mix(const ExecContext& ctx, std::span<const float* const> rows,
                  const float* folded_query, int64_t num_tokens, int64_t dim, float eps,
                  float* out) {
  DZ_CHECK(!rows.empty(), "AttnRes: a mix needs at least one row");
  check_rows(rows, folded_query, dim);
  const auto num_rows = static_cast<int64_t>(rows.size());
  parallel_for(ctx, num_tokens, token_grain(num_rows, dim), [&](int64_t begin, int64_t end) {
    std::vector<float> scores(rows.size());
    for (int64_t t = begin; t < end; ++t) {
      float max_score = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < num_rows; ++j) {
        scores[j] = row_score(folded_query, rows[j] + t * dim, dim, eps);
        max_score = std::max(max_score, scores[j]);
      }
      float sum = 0;
      for (float& s : scores) {
        s = std::exp(s - max_score);
        sum += s;
      }
      const float inv_sum = 1.0f / sum;
      for (int64_t j = 0; j < num_rows; ++j)
        scaled_add(out + t * dim, rows[j] + t * dim, scores[j] * inv_sum, dim, j == 0);
    }
  });
}

void attn_res_mix_ref(const ExecContext& ctx, std::span<const float* const> rows,
                      const float* folded_query, int64_t num_tokens, int64_t dim, float eps,
                      float* out) {
  DZ_CHECK(!rows.empty(), "AttnRes: a mix needs at least one row");
  check_rows(rows, folded_query, dim);
  parallel_for(ctx, num_tokens, 1, [&](int64_t begin, int64_t end) {
    std::vector<double> scores(rows.size()), acc(static_cast<size_t>(dim));
    for (int64_t t = begin; t < end; ++t) {
      for (size_t j = 0; j < rows.size(); ++j) {
        const float* v = rows[j] + t * dim;
        double dot = 0, squares = 0;
        for (int64_t i = 0; i < dim; ++i) {
          dot += static_cast<double>(folded_query[i]) * v[i];
          squares += static_cast<double>(v[i]) * v[i];
        }
        scores[j] = dot / std::sqrt(squares / static_cast<double>(dim) + eps);
      }
      const double max_score = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double& s : scores) {
        s = std::exp(s - max_score);
        sum += s;
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t j = 0; j < rows.size(); ++j)
        for (int64_t i = 0; i < dim; ++i) acc[i] += scores[j] / sum * rows[j][t * dim + i];
      for (int64_t i = 0; i < dim; ++i) out[t * dim + i] = static_cast<float>(acc[i]);
    }
  });
}

void attn_res_partial(const ExecContext& ctx, std::span<const float* const> rows,
                      const float* folded_query, int64_t num_tokens, int64_t dim, float eps,
                      float* max_score, float* sum_exp, float* acc) {
  check_rows(rows, folded_query, dim);
  const auto num_rows = static_cast<int64_t>(rows.size());
  parallel_for(ctx, num_tokens, token_grain(num_rows, dim), [&](int64_t begin, int64_t end) {
    std::vector<float> scores(rows.size());
    for (int64_t t = begin; t < end; ++t) {
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < num_rows; ++j) {
        scores[j] = row_score(folded_query, rows[j] + t * dim, dim, eps);
        m = std::max(m, scores[j]);
      }
      float sum = 0;
      if (num_rows == 0) std::fill(acc + t * dim, acc + (t + 1) * dim, 0.0f);
      for (int64_t j = 0; j < num_rows; ++j) {
        const float e = std::exp(scores[j] - m);
        sum += e;
        scaled_add(acc + t * dim, rows[j] + t * dim, e, dim, j == 0);
      }
      max_score[t] = m;
      sum_exp[t] = sum;
    }
  });
}

void attn_res_merge(const ExecContext& ctx, const float* prefix, const float* folded_query,
                    int64_t num_tokens, int64_t dim, float eps, const float* max_score,
                    const float* sum_exp, const float* acc, float* out) {
  check_rows(std::span<const float* const>(&prefix, 1), folded_query, dim);
  parallel_for(ctx, num_tokens, token_grain(2, dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float s = row_score(folded_query, prefix + t * dim, dim, eps);
      const float m = std::max(max_score[t], s);
      // With no completed rows max_score is −inf: their weight exp(−inf) is 0 and acc is ignored.
      const float a = max_score[t] == -std::numeric_limits<float>::infinity()
                          ? 0.0f
                          : std::exp(max_score[t] - m);
      const float b = std::exp(s - m);
      const float inv_sum = 1.0f / (a * sum_exp[t] + b);
      const float wa = a * inv_sum, wb = b * inv_sum;
      const float* acc_t = acc + t * dim;
      const float* p_t = prefix + t * dim;
      float* out_t = out + t * dim;
      if (wa == 0.0f) {
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) out_t[i] = wb * p_t[i];
      } else {
        // out may alias acc, element by element: still no loop-carried dependence.
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) out_t[i] = wa * acc_t[i] + wb * p_t[i];
      }
    }
  });
}

void attn_res_mix_two_phase(const ExecContext& ctx, std::span<const float* const> rows,
                            int64_t prefix_row, const float* folded_query, int64_t num_tokens,
                            int64_t dim, float eps, float* out) {
  const auto num_rows = static_cast<int64_t>(rows.size());
  DZ_CHECK(prefix_row >= 0 && prefix_row < num_rows, "AttnRes: prefix row {} of {}", prefix_row,
           num_rows);
  std::vector<const float*> completed;
  for (int64_t j = 0; j < num_rows; ++j)
    if (j != prefix_row) completed.push_back(rows[j]);
  std::vector<float> max_score(static_cast<size_t>(num_tokens));
  std::vector<float> sum_exp(max_score.size());
  // acc [T, d]: written into out, which the merge may overwrite in place.
  attn_res_partial(ctx, completed, folded_query, num_tokens, dim, eps, max_score.data(),
                   sum_exp.data(), out);
  attn_res_merge(ctx, rows[prefix_row], folded_query, num_tokens, dim, eps, max_score.data(),
                 sum_exp.data(), out, out);
}

}  // namespace dz::model
