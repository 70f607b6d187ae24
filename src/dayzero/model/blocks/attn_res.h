#pragma once
// Attention Residuals, K3 block semantics (docs/models.md §5): a softmax over depth that mixes raw
// rows (the embedding, completed block sums, the running prefix P) with a learned pseudo-query. All
// FP32 and never rounded: the sublayer's own RMSNorm rounds what it reads.

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

// One pseudo-query as stored: `<name>_proj.weight` [1, d] and `<name>_norm.weight` [d],
// replicated (the mix needs the whole row on every rank).
struct AttnResQueryWeights {
  std::vector<float> proj;  // [d]
  std::vector<float> norm;  // [d]
};
void visit_attn_res_tensors(TensorVisitor& v, std::string_view name, int64_t dim,
                            AttnResQueryWeights& w);

// cw = norm_weight ⊙ proj_weight (both [d]; proj is the [1, d] weight's only row), computed once at
// load: folding the RMSNorm weight into the query turns the mix into one dot product per row.
std::vector<float> attn_res_folded_query(std::span<const float> proj_weight,
                                         std::span<const float> norm_weight);

// out [T, d] = Σ_j softmax_j(s)·rows[j], s_j = (cw·v_j)·(mean(v_j²) + eps)^−1/2, no 1/sqrt(d);
// rows[j] → [T, d] FP32 (at least one row), folded_query cw [d]. out may not alias a row.
void attn_res_mix(const ExecContext& ctx, std::span<const float* const> rows,
                  const float* folded_query, int64_t num_tokens, int64_t dim, float eps,
                  float* out);

// The oracle: the same formula with double accumulation and a double softmax, rounded to FP32 once.
void attn_res_mix_ref(const ExecContext& ctx, std::span<const float* const> rows,
                      const float* folded_query, int64_t num_tokens, int64_t dim, float eps,
                      float* out);

// Two-phase form: the completed rows (every row but rows[prefix_row]) are reduced to a softmax
// partial first, the running prefix is merged last by an online-softmax (LSE) merge. Same result as
// attn_res_mix up to round-off. The phases are exposed so that a caller can run phase 1 once per
// bank state for all pseudo-queries of a block.
void attn_res_mix_two_phase(const ExecContext& ctx, std::span<const float* const> rows,
                            int64_t prefix_row, const float* folded_query, int64_t num_tokens,
                            int64_t dim, float eps, float* out);

// Phase 1, per token t: max_score[t] = max_j s_j, sum_exp[t] = Σ_j exp(s_j − max), acc [T, d] =
// Σ_j exp(s_j − max)·v_j over `rows` (may be empty: max −inf, sums 0).
void attn_res_partial(const ExecContext& ctx, std::span<const float* const> rows,
                      const float* folded_query, int64_t num_tokens, int64_t dim, float eps,
                      float* max_score, float* sum_exp, float* acc);
// Phase 2: out [T, d] = the mix over the phase-1 rows and `prefix` [T, d]. out may alias acc.
void attn_res_merge(const ExecContext& ctx, const float* prefix, const float* folded_query,
                    int64_t num_tokens, int64_t dim, float eps, const float* max_score,
                    const float* sum_exp, const float* acc, float* out);

}  // namespace dz::model
