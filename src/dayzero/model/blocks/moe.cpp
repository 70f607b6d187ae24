#include "dayzero/model/blocks/moe.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string_view>

#include <fmt/format.h>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/activations.h"
#include "dayzero/kernels/fast_math.h"
#include "dayzero/kernels/norms.h"

namespace dz::model {
namespace {

// Experts with at most this many tokens run one per thread: up to here the expert linears take
// their GEMV paths (FP8 block below 9 tokens, MXFP4 up to 8), one pass over the weights.
constexpr int64_t kFewTokensPerExpert = 8;

size_t floats_bytes(int64_t num_elems) {
  // Arena rounds every allocation up to its 64-byte alignment.
  return (static_cast<size_t>(num_elems) * sizeof(float) + 63) / 64 * 64;
}

using kernels::round_bf16_inline;
using kernels::sigmoid_fast;
using kernels::tanh_fast;

inline float silu_times(float g, float u) {
  return kernels::silu_fast(g) * u;
}

// β·tanh(g/β)·σ(g) · u'; saturates to ±β·(β_lin or u) and 0 without overflow or NaN.
inline float situ_times(float g, float u, float beta, float linear_beta) {
  const float a = beta * tanh_fast(g / beta) * sigmoid_fast(g);
  return a * (linear_beta != 0.0f ? linear_beta * tanh_fast(u / linear_beta) : u);
}

// gate[i] ← round_bf16(SiTU(round_bf16(gate[i]), round_bf16(up[i]))) for i < n.
void situ_product(float* gate, const float* up, int64_t n, float beta, float linear_beta) {
  if (linear_beta != 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float g = round_bf16_inline(gate[i]), u = round_bf16_inline(up[i]);
      const float a = beta * tanh_fast(g / beta) * sigmoid_fast(g);
      gate[i] = round_bf16_inline(a * (linear_beta * tanh_fast(u / linear_beta)));
    }
  } else {
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const float g = round_bf16_inline(gate[i]), u = round_bf16_inline(up[i]);
      gate[i] = round_bf16_inline(beta * tanh_fast(g / beta) * sigmoid_fast(g) * u);
    }
  }
}

// gated_mlp_forward with caller-provided gate/up buffers [num_tokens, inter].
void gated_into(const ExecContext& ctx, const MlpWeights& weights, const MlpActivation& activation,
                const float* x, int64_t num_tokens, float* out, float* gate, float* up) {
  const int64_t inter = weights.gate_proj.out_features();
  const int64_t num_elems = num_tokens * inter;
  weights.gate_proj.forward(ctx, x, num_tokens, gate);
  weights.up_proj.forward(ctx, x, num_tokens, up);
  const bool situ = activation.kind == MlpActivation::Kind::kSitu;
  const float beta = activation.situ_beta, linear_beta = activation.situ_linear_beta;
  parallel_for(ctx, num_elems, int64_t{1} << 14, [&](int64_t begin, int64_t end) {
    if (situ) {
      situ_product(gate + begin, up + begin, end - begin, beta, linear_beta);
    } else {
      kernels::silu_product_bf16(gate + begin, up + begin, end - begin);
    }
  });
  weights.down_proj.forward(ctx, gate, num_tokens, out);
}

void check_activation(const MlpActivation& activation) {
  DZ_CHECK(activation.kind == MlpActivation::Kind::kSilu ||
               (activation.situ_beta > 0.0f && activation.situ_linear_beta >= 0.0f),
           "SiTU needs β > 0 and β_lin ≥ 0, got {} and {}", activation.situ_beta,
           activation.situ_linear_beta);
}

// Indices [0, n) ordered by value descending, ties to the lower index; only the first k sorted.
void top_k_indices(const float* values, int64_t n, int64_t k, std::vector<int32_t>& order) {
  order.resize(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [values](int32_t a, int32_t b) {
    return values[a] > values[b] || (values[a] == values[b] && a < b);
  });
}

// docs/models.md §6.1 from router logits [num_tokens, E]: fills result.scores/expert_ids/weights.
void route_from_logits(const ExecContext& ctx, const MoeConfig& config, const float* bias,
                       const float* logits, int64_t num_tokens, RoutingResult& result) {
  const int64_t num_experts = config.num_experts, k = config.num_experts_per_tok;
  const int64_t group_size = num_experts / config.n_group;
  const bool grouped = config.n_group > 1 && config.topk_group < config.n_group;
  result.scores.resize(static_cast<size_t>(num_tokens * num_experts));
  result.expert_ids.resize(static_cast<size_t>(num_tokens * k));
  result.weights.resize(static_cast<size_t>(num_tokens * k));
  parallel_for(ctx, num_tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> biased(static_cast<size_t>(num_experts));
    std::vector<float> group_scores(static_cast<size_t>(config.n_group));
    std::vector<int32_t> order;
    for (int64_t t = begin; t < end; ++t) {
      float* scores = result.scores.data() + t * num_experts;
      for (int64_t e = 0; e < num_experts; ++e) {
        scores[e] = 1.0f / (1.0f + std::exp(-logits[t * num_experts + e]));
        biased[e] = scores[e] + (bias != nullptr ? bias[e] : 0.0f);
      }
      if (grouped) {
        // A group's score is the sum of its two best biased scores (one if it has one expert).
        for (int64_t g = 0; g < config.n_group; ++g) {
          const float* group = biased.data() + g * group_size;
          top_k_indices(group, group_size, std::min<int64_t>(2, group_size), order);
          group_scores[g] = group[order[0]] + (group_size > 1 ? group[order[1]] : 0.0f);
        }
        top_k_indices(group_scores.data(), config.n_group, config.topk_group, order);
        std::vector<bool> kept(static_cast<size_t>(config.n_group), false);
        for (int64_t i = 0; i < config.topk_group; ++i) kept[order[i]] = true;
        for (int64_t e = 0; e < num_experts; ++e)
          if (!kept[e / group_size]) biased[e] = -std::numeric_limits<float>::infinity();
      }
      top_k_indices(biased.data(), num_experts, k, order);
      int32_t* ids = result.expert_ids.data() + t * k;
      float* weights = result.weights.data() + t * k;
      float sum = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        ids[i] = order[i];
        weights[i] = scores[order[i]];  // unbiased: the bias only selects
        sum += weights[i];
      }
      const float denominator = config.norm_topk_prob ? sum + config.renorm_epsilon : 1.0f;
      for (int64_t i = 0; i < k; ++i)
        weights[i] = weights[i] / denominator * config.routed_scaling_factor;
    }
  });
}

void check_config(const MoeConfig& config) {
  DZ_CHECK(config.num_experts > 0 && config.num_experts_per_tok > 0 &&
               config.num_experts_per_tok <= config.num_experts,
           "MoE: {} experts, top-{}", config.num_experts, config.num_experts_per_tok);
  DZ_CHECK(config.n_group > 0 && config.num_experts % config.n_group == 0 &&
               config.topk_group > 0 && config.topk_group <= config.n_group,
           "MoE: {} experts in {} groups, keep {}", config.num_experts, config.n_group,
           config.topk_group);
  DZ_CHECK(config.topk_group * (config.num_experts / config.n_group) >= config.num_experts_per_tok,
           "MoE: {} kept groups of {} cannot supply top-{}", config.topk_group,
           config.num_experts / config.n_group, config.num_experts_per_tok);
}

}  // namespace

float gated_activation(const MlpActivation& activation, float gate, float up) {
  check_activation(activation);
  return activation.kind == MlpActivation::Kind::kSitu
             ? situ_times(gate, up, activation.situ_beta, activation.situ_linear_beta)
             : silu_times(gate, up);
}

void gated_mlp_forward(const ExecContext& ctx, const MlpWeights& weights,
                       const MlpActivation& activation, const float* x, int64_t num_tokens,
                       float* out, Arena& scratch) {
  check_activation(activation);
  const int64_t inter = weights.gate_proj.out_features();
  float* gate = scratch.allocate_floats(num_tokens * inter);
  float* up = scratch.allocate_floats(num_tokens * inter);
  gated_into(ctx, weights, activation, x, num_tokens, out, gate, up);
}

size_t gated_mlp_scratch_bytes(const MlpWeights& weights, int64_t max_tokens) {
  return 2 * floats_bytes(max_tokens * weights.gate_proj.out_features());
}

void route_grouped_sigmoid(const ExecContext& ctx, const MoeConfig& config,
                           const MoeWeights& weights, const float* x, int64_t num_tokens,
                           int64_t hidden_size, RoutingResult& result) {
  check_config(config);
  const int64_t num_experts = config.num_experts;
  DZ_CHECK(static_cast<int64_t>(weights.gate_weight.size()) == num_experts * hidden_size,
           "router weight has {} values for [{}, {}]", weights.gate_weight.size(), num_experts,
           hidden_size);
  // x · Wgᵀ in FP32, one sequential sum per logit: the plain reference form.
  std::vector<float> logits(static_cast<size_t>(num_tokens * num_experts));
  parallel_for(ctx, num_tokens * num_experts, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* xt = x + (i / num_experts) * hidden_size;
      const float* w = weights.gate_weight.data() + (i % num_experts) * hidden_size;
      float acc = 0.0f;
      for (int64_t j = 0; j < hidden_size; ++j) acc += xt[j] * w[j];
      logits[i] = acc;
    }
  });
  const float* bias =
      weights.e_score_correction_bias.empty() ? nullptr : weights.e_score_correction_bias.data();
  route_from_logits(ctx, config, bias, logits.data(), num_tokens, result);
}

void visit_gated_mlp_tensors(TensorVisitor& v, const GatedMlpNames& names, int64_t intermediate,
                             int64_t hidden, MlpSplit split, MlpWeights& w) {
  const bool by_expert = split == MlpSplit::kByExpert;
  const Split in_split = by_expert ? Split::kByExpert : Split::kColumn;
  const Split out_split = by_expert ? Split::kByExpert : Split::kRow;
  constexpr auto kYes = Quantizable::kYes;
  v.linear(names.gate, intermediate, hidden, in_split, kYes, w.gate_proj);
  v.linear(names.up, intermediate, hidden, in_split, kYes, w.up_proj);
  v.linear(names.down, hidden, intermediate, out_split, kYes, w.down_proj);
}

void visit_moe_tensors(TensorVisitor& v, const MoeConfig& c, MoeWeights& w) {
  using Scope = TensorVisitor::Scope;
  const int64_t E = c.num_experts, d = c.hidden_size;
  {
    Scope router(v, {.component = Component::kRouter});
    v.floats("gate.weight", {E, d}, DType::kBF16, Split::kReplicated, w.gate_weight);
    v.floats("gate.e_score_correction_bias", {E}, DType::kF32, Split::kReplicated,
             w.e_score_correction_bias);
  }
  int64_t expert_width = d;
  if (c.latent_size > 0) {
    Scope latent(v, {.component = Component::kLatentMoe});
    const int64_t r = expert_width = c.latent_size;
    v.linear("routed_expert_down_proj", r, d, Split::kReplicated, Quantizable::kYes,
             w.latent_down_proj.emplace());
    if (c.latent_norm)
      v.floats("routed_expert_norm.weight", {r}, DType::kBF16, Split::kReplicated, w.latent_norm);
    v.linear("routed_expert_up_proj", d, r, Split::kRow, Quantizable::kYes,
             w.latent_up_proj.emplace());
  }
  w.experts.resize(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    if (!v.holds_expert(e, E)) continue;
    Scope expert(v,
                 {.prefix = fmt::format("experts.{}.", e), .component = Component::kRoutedExperts});
    visit_gated_mlp_tensors(v, c.expert_names, c.intermediate_size, expert_width,
                            MlpSplit::kByExpert, w.experts[static_cast<size_t>(e)]);
  }
  if (c.num_shared_experts > 0) {
    Scope shared(v, {.prefix = "shared_experts.", .component = Component::kSharedExperts});
    visit_gated_mlp_tensors(v, kProjNames, c.intermediate_size * c.num_shared_experts, d,
                            MlpSplit::kTensorParallel, w.shared_experts.emplace_back());
  }
}

MoeBlock::MoeBlock(MoeConfig config, MoeWeights weights)
    : config_(config), weights_(std::move(weights)) {
  check_config(config_);
  check_activation(config_.activation);
  DZ_CHECK(static_cast<int64_t>(weights_.experts.size()) == config_.num_experts,
           "MoE: {} expert weight sets for {} experts", weights_.experts.size(),
           config_.num_experts);
  DZ_CHECK(weights_.latent_down_proj.has_value() == weights_.latent_up_proj.has_value(),
           "latent MoE needs both latent projections");
  // A rank of a parallel plan holds some experts; the others stay empty and are skipped.
  for (const MlpWeights& expert : weights_.experts)
    held_.push_back(expert.gate_proj.out_features() > 0);
  const auto first_held = std::find(held_.begin(), held_.end(), true);
  DZ_CHECK(first_held != held_.end(), "MoE: no routed expert loaded");
  if (config_.expert_comm != nullptr) {
    // Expert parallelism: rank i of N holds experts [i·E/N, (i+1)·E/N), as exchange_routed sends.
    const int ranks = config_.expert_comm->size(), me = config_.expert_comm->rank();
    const int64_t per_rank = config_.num_experts / ranks;
    DZ_CHECK(per_rank * ranks == config_.num_experts, "MoE: {} experts over {} ranks",
             config_.num_experts, ranks);
    DZ_CHECK(
        config_.token_share.index >= 0 && config_.token_share.index < config_.token_share.count,
        "MoE: token share {} of {}", config_.token_share.index, config_.token_share.count);
    for (int64_t e = 0; e < config_.num_experts; ++e)
      DZ_CHECK(held_[static_cast<size_t>(e)] == (e / per_rank == me),
               "MoE: rank {} of {} must hold exactly experts [{}, {})", me, ranks, me * per_rank,
               (me + 1) * per_rank);
  } else {
    DZ_CHECK(config_.output_is_partial ||
                 std::all_of(held_.begin(), held_.end(), [](bool h) { return h; }),
             "MoE: a single-process block must hold every routed expert");
  }
  expert_width_ =
      weights_.experts[static_cast<size_t>(first_held - held_.begin())].gate_proj.in_features();
  // The latent norm needs the whole routed sum: a rank holding some experts sums it with its peers.
  DZ_CHECK(
      !config_.output_is_partial || !weights_.latent_down_proj || config_.latent_comm != nullptr,
      "latent MoE split over ranks needs the ranks' communicator");
  hidden_size_ = expert_width_;
  if (weights_.latent_down_proj) {
    hidden_size_ = weights_.latent_down_proj->in_features();
    DZ_CHECK(weights_.latent_down_proj->out_features() == expert_width_ &&
                 weights_.latent_up_proj->in_features() * latent_ranks() == expert_width_ &&
                 weights_.latent_up_proj->out_features() == hidden_size_,
             "latent MoE: down [{}, {}], up [{}, {}] for experts of width {}",
             weights_.latent_down_proj->out_features(), weights_.latent_down_proj->in_features(),
             weights_.latent_up_proj->out_features(), weights_.latent_up_proj->in_features(),
             expert_width_);
    DZ_CHECK(weights_.latent_norm.empty() ||
                 static_cast<int64_t>(weights_.latent_norm.size()) == expert_width_,
             "latent MoE: norm of {} values for width {}", weights_.latent_norm.size(),
             expert_width_);
  }
  DZ_CHECK(static_cast<int64_t>(weights_.gate_weight.size()) == config_.num_experts * hidden_size_,
           "MoE router: {} values for [{}, {}]", weights_.gate_weight.size(), config_.num_experts,
           hidden_size_);
  DZ_CHECK(weights_.e_score_correction_bias.empty() ||
               static_cast<int64_t>(weights_.e_score_correction_bias.size()) == config_.num_experts,
           "MoE: {} correction biases for {} experts", weights_.e_score_correction_bias.size(),
           config_.num_experts);
  const auto check_mlp = [this](const MlpWeights& mlp, int64_t width) {
    const int64_t inter = mlp.gate_proj.out_features();
    DZ_CHECK(mlp.gate_proj.in_features() == width && mlp.up_proj.in_features() == width &&
                 mlp.up_proj.out_features() == inter && mlp.down_proj.in_features() == inter &&
                 mlp.down_proj.out_features() == width,
             "MoE expert shapes do not match width {}", width);
    max_intermediate_ = std::max(max_intermediate_, inter);
  };
  for (size_t e = 0; e < weights_.experts.size(); ++e)
    if (held_[e]) check_mlp(weights_.experts[e], expert_width_);
  for (const MlpWeights& mlp : weights_.shared_experts) check_mlp(mlp, hidden_size_);
  router_is_bf16_ = std::all_of(weights_.gate_weight.begin(), weights_.gate_weight.end(),
                                [](float v) { return formats::round_to_bf16(v) == v; });
  if (router_is_bf16_)
    router_ = kernels::LinearWeight::from_f32_as_bf16(weights_.gate_weight.data(),
                                                      config_.num_experts, hidden_size_);
}

size_t MoeBlock::routed_scratch_bytes(int64_t num_rows, int64_t num_slots) const {
  const int64_t d = hidden_size_, r = expert_width_;
  // slot outputs [S, r]; an expert's gathered rows [R, r], output [R, max(d, r)], gate and up.
  return floats_bytes(num_slots * r) + floats_bytes(num_rows * r) +
         floats_bytes(num_rows * std::max(d, r)) + 2 * floats_bytes(num_rows * max_intermediate_);
}

size_t MoeBlock::scratch_bytes(int64_t max_tokens) const {
  const int64_t d = hidden_size_, r = expert_width_;
  // router logits, the FP32 sum [T, d], the routed experts' work; latent: z, the routed sum and
  // a rank's columns of it [T, r]; the shared experts reuse the routed work's buffers.
  return floats_bytes(max_tokens * config_.num_experts) + floats_bytes(max_tokens * d) +
         routed_scratch_bytes(max_tokens, max_tokens * config_.num_experts_per_tok) +
         (weights_.latent_down_proj ? 3 * floats_bytes(max_tokens * r) : 0);
}

void MoeBlock::run_routed(const ExecContext& ctx, const float* rows, int64_t num_rows,
                          const RoutedSlots& slots, float* row_sums, Arena& scratch) const {
  const int64_t d = hidden_size_, r = expert_width_, num_experts = config_.num_experts;
  const auto num_slots = static_cast<int64_t>(slots.row.size());
  // Slots grouped by expert: a counting sort keeps each expert's rows in order.
  std::vector<int64_t> expert_begin(static_cast<size_t>(num_experts + 1), 0);
  for (int32_t id : slots.expert) {
    DZ_CHECK(id >= 0 && id < num_experts, "MoE routing: expert id {} of {}", id, num_experts);
    ++expert_begin[id + 1];
  }
  std::partial_sum(expert_begin.begin(), expert_begin.end(), expert_begin.begin());
  std::vector<int64_t> fill(expert_begin.begin(), expert_begin.end() - 1);
  std::vector<int64_t> slot_row(static_cast<size_t>(num_slots));
  std::vector<float> slot_weight(slot_row.size());
  for (int64_t s = 0; s < num_slots; ++s) {
    const int64_t at = fill[slots.expert[s]]++;
    slot_row[at] = slots.row[s];
    slot_weight[at] = slots.weight[s];
  }
  // Each row's slots in slot order, which is expert order (compressed rows).
  std::vector<int64_t> row_begin(static_cast<size_t>(num_rows + 1), 0);
  for (int64_t row : slot_row) ++row_begin[row + 1];
  std::partial_sum(row_begin.begin(), row_begin.end(), row_begin.begin());
  std::vector<int64_t> row_fill(row_begin.begin(), row_begin.end() - 1);
  std::vector<int64_t> row_slots(slot_row.size());
  for (int64_t s = 0; s < num_slots; ++s) row_slots[row_fill[slot_row[s]]++] = s;

  float* slot_out = scratch.allocate_floats(num_slots * r);  // weighted output of each slot
  float* gathered = scratch.allocate_floats(num_rows * r);
  float* expert_out = scratch.allocate_floats(num_rows * std::max(d, r));
  float* gate = scratch.allocate_floats(num_rows * max_intermediate_);
  float* up = scratch.allocate_floats(num_rows * max_intermediate_);
  // Expert e on its rows into the rows of its slots (weight applied), with the given buffers.
  const auto run_expert = [&](const ExecContext& on, int64_t e, float* in_rows, float* out_rows,
                              float* gate_rows, float* up_rows) {
    const int64_t begin = expert_begin[e], count = expert_begin[e + 1] - begin;
    for (int64_t i = 0; i < count; ++i)
      std::copy_n(rows + slot_row[begin + i] * r, r, in_rows + i * r);
    gated_into(on, weights_.experts[e], config_.activation, in_rows, count, out_rows, gate_rows,
               up_rows);
    for (int64_t i = 0; i < count; ++i) {
      const float w = slot_weight[begin + i];
      float* dst = slot_out + (begin + i) * r;
      for (int64_t j = 0; j < r; ++j) dst[j] = w * out_rows[i * r + j];
    }
  };
  // Experts with many rows (prefill) one after another, each on every thread; experts with a
  // few (decode: 1–2 tokens each at batch 16) spread over the threads, one thread each, in one
  // parallel region: a call per expert on all threads forks and joins them for ≈ 1–3 MiB of
  // weights and restarts every thread's DRAM stream (docs/performance.md, issue 17).
  std::vector<int64_t> few;
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t count = expert_begin[e + 1] - expert_begin[e];
    if (count == 0) continue;
    if (!held_[static_cast<size_t>(e)]) {  // another rank's expert: contributes nothing here
      std::fill_n(slot_out + expert_begin[e] * r, count * r, 0.0f);
      continue;
    }
    if (count <= kFewTokensPerExpert && ctx.num_threads > 1)
      few.push_back(e);
    else
      run_expert(ctx, e, gathered, expert_out, gate, up);
  }
  // Experts of a layer are alike: the first one's weight bytes stand for each.
  int64_t expert_bytes = 0;
  if (!few.empty()) {
    const MlpWeights& first = weights_.experts[static_cast<size_t>(few.front())];
    expert_bytes = first.gate_proj.stored_bytes() + first.up_proj.stored_bytes() +
                   first.down_proj.stored_bytes();
  }
  const int64_t grain = grain_for_work(expert_bytes, kMinParallelBytes);
  parallel_for(ctx, static_cast<int64_t>(few.size()), grain, [&](int64_t begin, int64_t end) {
    // Per-thread buffers for kFewTokensPerExpert rows (thread_local: one set per worker).
    thread_local std::vector<float> buffers;
    const int64_t n = kFewTokensPerExpert;
    buffers.resize(static_cast<size_t>(n * (r + std::max(d, r) + 2 * max_intermediate_)));
    float* in_rows = buffers.data();
    float* out_rows = in_rows + n * r;
    float* gate_rows = out_rows + n * std::max(d, r);
    float* up_rows = gate_rows + n * max_intermediate_;
    for (int64_t i = begin; i < end; ++i)
      run_expert(ExecContext{.num_threads = 1}, few[static_cast<size_t>(i)], in_rows, out_rows,
                 gate_rows, up_rows);
  });
  // Each row's slots summed in expert order: the order of one expert after another, whichever
  // thread ran which expert.
  parallel_for(ctx, num_rows, 8, [&](int64_t row_first, int64_t row_end) {
    for (int64_t row = row_first; row < row_end; ++row) {
      float* dst = row_sums + row * r;
      std::fill_n(dst, r, 0.0f);
      for (int64_t i = row_begin[row]; i < row_begin[row + 1]; ++i) {
        const float* src = slot_out + row_slots[i] * r;
        for (int64_t j = 0; j < r; ++j) dst[j] += src[j];
      }
    }
  });
}

namespace {

// One dispatched record: the choices of one token on one rank. Its bytes: the choice count, the
// token's row as BF16 (exact: the experts' input is BF16-valued), then per choice the expert id and
// the FP32 weight (docs/parallel.md §3).
int64_t record_bytes(int64_t width, int64_t choices) {
  return 4 + 2 * width + 8 * choices;
}

template <typename T>
void put(std::byte*& at, T value) {
  std::memcpy(at, &value, sizeof(T));
  at += sizeof(T);
}

template <typename T>
T take(const std::byte*& at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  at += sizeof(T);
  return value;
}

}  // namespace

void MoeBlock::exchange_routed(const ExecContext& ctx, const RoutingResult& routing,
                               const float* rows, int64_t num_tokens, float* routed_sum,
                               int layer_id) const {
  dist::Comm& comm = *config_.expert_comm;
  const int ranks = comm.size(), me = comm.rank();
  const int64_t r = expert_width_, k = config_.num_experts_per_tok;
  const int64_t per_rank = config_.num_experts / ranks;
  const auto owner = [per_rank](int32_t expert) { return static_cast<int>(expert / per_rank); };
  // This rank's share of its group's tokens: [first, first + count).
  const std::vector<int64_t> shares = dist::even_split(num_tokens, config_.token_share.count);
  const int64_t first =
      std::accumulate(shares.begin(), shares.begin() + config_.token_share.index, int64_t{0});
  const int64_t count = shares[static_cast<size_t>(config_.token_share.index)];

  // Each share token's choices in expert order, so those on one rank are consecutive and the
  // ranks come in order.
  std::vector<std::pair<int32_t, float>> choices(static_cast<size_t>(count * k));
  for (int64_t t = 0; t < count; ++t) {
    auto* mine = choices.data() + t * k;
    for (int64_t i = 0; i < k; ++i)
      mine[i] = {routing.expert_ids[(first + t) * k + i], routing.weights[(first + t) * k + i]};
    std::sort(mine, mine + k);
  }
  // Calls f(t, rank, first choice, choice count) for each rank holding some of token t's experts.
  const auto for_each_rank_of = [&](int64_t t, auto&& f) {
    const auto* c = choices.data() + t * k;
    for (int64_t i = 0; i < k;) {
      const int dest = owner(c[i].first);
      int64_t n = 1;
      while (i + n < k && owner(c[i + n].first) == dest) ++n;
      f(dest, c + i, n);
      i += n;
    }
  };

  // Dispatch: the rows go to the ranks holding their experts, the choices on this rank stay.
  std::vector<int64_t> send_bytes(static_cast<size_t>(ranks), 0);
  std::vector<int64_t> records_to(send_bytes.size(), 0);
  for (int64_t t = 0; t < count; ++t)
    for_each_rank_of(t, [&](int dest, const auto*, int64_t n) {
      if (dest == me) return;
      send_bytes[static_cast<size_t>(dest)] += record_bytes(r, n);
      ++records_to[static_cast<size_t>(dest)];
    });
  std::vector<int64_t> send_at(send_bytes.size(), 0);
  std::exclusive_scan(send_bytes.begin(), send_bytes.end(), send_at.begin(), int64_t{0});
  std::vector<std::byte> send(static_cast<size_t>(send_at.back() + send_bytes.back()));
  RoutedSlots slots;
  for (int64_t t = 0; t < count; ++t)
    for_each_rank_of(t, [&](int dest, const auto* c, int64_t n) {
      if (dest == me) {
        for (int64_t i = 0; i < n; ++i) slots.add(t, c[i].first, c[i].second);
        return;
      }
      std::byte* at = send.data() + send_at[static_cast<size_t>(dest)];
      put(at, static_cast<int32_t>(n));
      for (int64_t j = 0; j < r; ++j) put(at, formats::encode_bf16(rows[(first + t) * r + j]));
      for (int64_t i = 0; i < n; ++i) {
        put(at, c[i].first);
        put(at, c[i].second);
      }
      send_at[static_cast<size_t>(dest)] = at - send.data();
    });
  const std::vector<int64_t> recv_bytes = comm.exchange_counts(send_bytes, layer_id);
  std::vector<std::byte> recv(
      static_cast<size_t>(std::accumulate(recv_bytes.begin(), recv_bytes.end(), int64_t{0})));
  comm.all_to_all(send, send_bytes, recv, recv_bytes, dist::WireType::kU8, layer_id);

  // The rows to run here: the share's own, then every received record's.
  std::vector<int64_t> records_from(recv_bytes.size(), 0);
  std::vector<float> in_rows(static_cast<size_t>(count * r));
  std::copy_n(rows + first * r, count * r, in_rows.begin());
  const std::byte* at = recv.data();
  for (int source = 0; source < ranks; ++source) {
    const std::byte* end = at + recv_bytes[static_cast<size_t>(source)];
    while (at < end) {
      const auto n = take<int32_t>(at);
      DZ_CHECK(n >= 1 && n <= k && at + record_bytes(r, n) - 4 <= end,
               "MoE dispatch from rank {}: a record of {} choices", source, n);
      const int64_t row = static_cast<int64_t>(in_rows.size()) / r;
      for (int64_t j = 0; j < r; ++j) in_rows.push_back(formats::decode_bf16(take<uint16_t>(at)));
      for (int32_t i = 0; i < n; ++i) {
        const auto expert = take<int32_t>(at);
        const auto weight = take<float>(at);
        DZ_CHECK(owner(expert) == me, "MoE dispatch: expert {} sent to rank {}", expert, me);
        slots.add(row, expert, weight);
      }
      ++records_from[static_cast<size_t>(source)];
    }
  }
  const int64_t num_rows = static_cast<int64_t>(in_rows.size()) / r;
  const size_t bytes = routed_scratch_bytes(num_rows, static_cast<int64_t>(slots.row.size())) +
                       floats_bytes(num_rows * r);
  if (exchange_scratch_ == nullptr || exchange_scratch_->capacity_bytes() < bytes)
    exchange_scratch_ = std::make_unique<Arena>(bytes);
  exchange_scratch_->reset();
  float* row_sums = exchange_scratch_->allocate_floats(num_rows * r);
  run_routed(ctx, in_rows.data(), num_rows, slots, row_sums, *exchange_scratch_);

  // Combine: each received record's weighted sum goes back to its source, in the order received.
  std::vector<int64_t> reply_counts(records_from.size()), result_counts(records_to.size());
  for (size_t i = 0; i < records_from.size(); ++i) {
    reply_counts[i] = records_from[i] * r;
    result_counts[i] = records_to[i] * r;
  }
  std::vector<float> results(
      static_cast<size_t>(std::accumulate(result_counts.begin(), result_counts.end(), int64_t{0})));
  comm.all_to_all(
      std::as_bytes(std::span(row_sums + count * r, static_cast<size_t>((num_rows - count) * r))),
      reply_counts, std::as_writable_bytes(std::span(results)), result_counts, dist::WireType::kF32,
      layer_id);

  // Each share token's routed sum: the ranks' partial sums in rank order (ranks hold consecutive
  // experts, so this is expert order in blocks). The other tokens' rows stay zero.
  if (num_tokens == 0) return;
  std::fill_n(routed_sum, num_tokens * r, 0.0f);
  std::vector<int64_t> result_at(result_counts.size(), 0);
  std::exclusive_scan(result_counts.begin(), result_counts.end(), result_at.begin(), int64_t{0});
  for (int64_t t = 0; t < count; ++t) {
    float* dst = routed_sum + (first + t) * r;
    for_each_rank_of(t, [&](int dest, const auto*, int64_t) {
      const float* part = row_sums + t * r;
      if (dest != me) {
        part = results.data() + result_at[static_cast<size_t>(dest)];
        result_at[static_cast<size_t>(dest)] += r;
      }
      for (int64_t j = 0; j < r; ++j) dst[j] += part[j];
    });
  }
}

void MoeBlock::forward(const ExecContext& ctx, const float* x, int64_t num_tokens, float* out,
                       Arena& scratch, TapSink* taps, int layer_id) const {
  const bool exchange = config_.expert_comm != nullptr;
  if (num_tokens <= 0) {
    // A data-parallel group without tokens this step still runs its experts for the others.
    if (exchange) exchange_routed(ctx, RoutingResult{}, nullptr, 0, nullptr, layer_id);
    return;
  }
  const int64_t d = hidden_size_, r = expert_width_, num_experts = config_.num_experts;
  const int64_t k = config_.num_experts_per_tok;
  const bool latent = weights_.latent_down_proj.has_value();

  RoutingResult routed;
  if (router_is_bf16_) {
    float* logits = scratch.allocate_floats(num_tokens * num_experts);
    router_.forward(ctx, x, num_tokens, logits);
    const float* bias = weights_.e_score_correction_bias.empty()
                            ? nullptr
                            : weights_.e_score_correction_bias.data();
    route_from_logits(ctx, config_, bias, logits, num_tokens, routed);
  } else {
    route_grouped_sigmoid(ctx, config_, weights_, x, num_tokens, d, routed);
  }
  const RoutingResult* routing = &routed;
  DZ_CHECK(static_cast<int64_t>(routing->expert_ids.size()) == num_tokens * k &&
               routing->weights.size() == routing->expert_ids.size(),
           "MoE routing: {} ids, {} weights for {} tokens × top-{}", routing->expert_ids.size(),
           routing->weights.size(), num_tokens, k);
  if (static_cast<int64_t>(routing->scores.size()) == num_tokens * num_experts)
    tap(taps, layer_id, "router_scores", routing->scores.data(), Shape{num_tokens, num_experts});
  RoutingResult given;
  if (taps != nullptr) {
    std::vector<float> ids(routing->expert_ids.begin(), routing->expert_ids.end());
    tap(taps, layer_id, "routing_ids", ids.data(), Shape{num_tokens, k});
    tap(taps, layer_id, "routing_weights", routing->weights.data(), Shape{num_tokens, k});
    const float* given_ids = substitute(taps, layer_id, "routing_ids", Shape{num_tokens, k});
    const float* given_weights =
        substitute(taps, layer_id, "routing_weights", Shape{num_tokens, k});
    if (given_ids != nullptr && given_weights != nullptr) {
      given.expert_ids.assign(given_ids, given_ids + num_tokens * k);
      given.weights.assign(given_weights, given_weights + num_tokens * k);
      routing = &given;
    }
  }

  float* sum = scratch.allocate_floats(num_tokens * d);
  // The routed experts' input and FP32 sum: x and `sum` itself, or z and y_lat when latent.
  const float* expert_in = x;
  float* routed_sum = sum;
  if (latent) {
    float* z = scratch.allocate_floats(num_tokens * r);
    weights_.latent_down_proj->forward(ctx, x, num_tokens, z);
    kernels::round_to_bf16(z, num_tokens * r);
    tap(taps, layer_id, "latent_in", z, Shape{num_tokens, r});
    expert_in = z;
    routed_sum = scratch.allocate_floats(num_tokens * r);
  }
  const size_t routed_work = scratch.mark();
  if (exchange) {
    exchange_routed(ctx, *routing, expert_in, num_tokens, routed_sum, layer_id);
  } else {
    RoutedSlots slots;
    for (int64_t t = 0; t < num_tokens; ++t)
      for (int64_t i = 0; i < k; ++i)
        slots.add(t, routing->expert_ids[t * k + i], routing->weights[t * k + i]);
    run_routed(ctx, expert_in, num_tokens, slots, routed_sum, scratch);
  }
  scratch.release(routed_work);
  if (latent) {
    // The norm sees the whole routed sum (docs/models.md §6.3), then the up projection's FP32
    // output starts the block sum, unrounded. Over ranks: the sum of every rank's experts first,
    // and each rank's up projection of its columns.
    if (config_.latent_comm != nullptr)
      config_.latent_comm->all_reduce_sum(
          std::span(routed_sum, static_cast<size_t>(num_tokens * r)), layer_id);
    if (!weights_.latent_norm.empty())
      kernels::rms_norm(ctx, routed_sum, r, weights_.latent_norm.data(), routed_sum, r, num_tokens,
                        r, config_.latent_norm_eps);
    kernels::round_to_bf16(routed_sum, num_tokens * r);
    const int ranks = latent_ranks();
    if (ranks == 1) {
      weights_.latent_up_proj->forward(ctx, routed_sum, num_tokens, sum);
    } else {
      const int64_t cols = r / ranks, first = cols * config_.latent_comm->rank();
      float* mine = scratch.allocate_floats(num_tokens * cols);
      for (int64_t t = 0; t < num_tokens; ++t)
        std::copy_n(routed_sum + t * r + first, cols, mine + t * cols);
      weights_.latent_up_proj->forward(ctx, mine, num_tokens, sum);
    }
  }
  float* expert_out = scratch.allocate_floats(num_tokens * d);
  float* gate = scratch.allocate_floats(num_tokens * max_intermediate_);
  float* up = scratch.allocate_floats(num_tokens * max_intermediate_);
  for (const MlpWeights& shared : weights_.shared_experts) {
    gated_into(ctx, shared, config_.activation, x, num_tokens, expert_out, gate, up);
    for (int64_t e = 0; e < num_tokens * d; ++e) sum[e] += expert_out[e];
  }
  std::copy_n(sum, num_tokens * d, out);
  if (!config_.output_is_partial) kernels::round_to_bf16(out, num_tokens * d);
}

}  // namespace dz::model
