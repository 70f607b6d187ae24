#pragma once
// Feed-forward blocks: the gated MLP with SiLU (SwiGLU) or SiTU (docs/models.md §1.1), the
// DeepSeek- style MoE with grouped sigmoid routing (§6.1, and Kimi-Linear's §6.2 as the n_group = 1
// case): correction bias for selection only, renormalisation, routed scaling, shared experts
// unscaled; and K3's latent MoE (§6.3), whose routed experts run in a narrower latent space.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"
#include "dayzero/dist/comm.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/taps.h"
#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

struct MlpWeights {
  kernels::LinearWeight gate_proj;  // [inter, d]  (w1)
  kernels::LinearWeight up_proj;    // [inter, d]  (w3)
  kernels::LinearWeight down_proj;  // [d, inter]  (w2)
};

// How a checkpoint names a gated MLP's three linears.
struct GatedMlpNames {
  std::string_view gate, up, down;
};
inline constexpr GatedMlpNames kProjNames{"gate_proj", "up_proj", "down_proj"};
inline constexpr GatedMlpNames kW1W3W2Names{"w1", "w3", "w2"};  // w1 gate, w3 up, w2 down

// A gated MLP's linears under the current prefix: gate and up [intermediate, hidden], down
// [hidden, intermediate]. Tensor-parallel (dense MLP, shared experts): gate and up by column, down
// by row; a routed expert is held whole by one rank (by expert).
enum class MlpSplit : unsigned char { kTensorParallel, kByExpert };
void visit_gated_mlp_tensors(TensorVisitor& v, const GatedMlpNames& names, int64_t intermediate,
                             int64_t hidden, MlpSplit split, MlpWeights& w);

// The elementwise activation of a gated MLP, act(g, u) with g = gate(x), u = up(x):
//   kSilu: silu(g)·u;
//   kSitu: β·tanh(g/β)·σ(g) · u', u' = β_lin·tanh(u/β_lin), or u' = u when β_lin is 0 (absent).
struct MlpActivation {
  enum class Kind : unsigned char { kSilu, kSitu } kind = Kind::kSilu;
  float situ_beta = 0;         // β (K3: activation_situ_beta = 4), > 0 for kSitu
  float situ_linear_beta = 0;  // β_lin (K3: 25); 0: u' = u
};

// act(g, u) in FP32 for one element, exactly as gated_mlp_forward computes it (not rounded).
float gated_activation(const MlpActivation& activation, float gate, float up);

// out [num_tokens, d] = down(act(gate(x), up(x))); gate and up outputs rounded to BF16, the
// activation in FP32, rounded to BF16 before down_proj as the reference's BF16 activations are.
// out is FP32, not rounded: a dense FFN rounds it like any linear output, MoE sums it in FP32.
void gated_mlp_forward(const ExecContext& ctx, const MlpWeights& weights,
                       const MlpActivation& activation, const float* x, int64_t num_tokens,
                       float* out, Arena& scratch);
// What gated_mlp_forward takes from `scratch` for at most max_tokens tokens.
size_t gated_mlp_scratch_bytes(const MlpWeights& weights, int64_t max_tokens);

struct MoeConfig {
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 1;
  int64_t topk_group = 1;
  bool norm_topk_prob = true;
  float routed_scaling_factor = 1.0f;
  float renorm_epsilon = 0.0f;    // Kimi adds 1e-20 to the denominator
  MlpActivation activation;       // of routed and shared experts
  float latent_norm_eps = 1e-5f;  // latent MoE: ε of the RMSNorm of the routed sum
  // The stored shapes and names (visit_moe_tensors).
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;   // of one routed expert (moe_intermediate_size)
  int64_t num_shared_experts = 0;  // stored fused along the intermediate axis when several
  int64_t latent_size = 0;         // latent MoE: the experts' width r; 0 without
  bool latent_norm = false;        // latent MoE: RMSNorm of the routed sum
  GatedMlpNames expert_names = kProjNames;
  // Tensor or expert parallelism (docs/parallel.md §1): this rank holds only some routed experts
  // (the others' weights are empty) or a column slice of the shared experts, so its output is a
  // partial sum that the caller all-reduces and then rounds; forward() leaves it in FP32.
  bool output_is_partial = false;
  // Latent MoE under a plan: the ranks over which the routed sum [T, r] is all-reduced before its
  // norm (which needs all of it); each rank then up-projects its r / N columns (the up
  // projection is split by row), so the result joins the FFN's all-reduce once.
  dist::Comm* latent_comm = nullptr;
  // Expert parallelism (--ep > 1, docs/parallel.md §1): the ranks routed experts are split over
  // (all tp · ep of them, rank i holding experts [i·E/N, (i+1)·E/N)). Each rank sends its share of
  // its group's tokens to the ranks holding their experts and gets their weighted outputs back;
  // the other tokens' routed outputs are zero here (their share's rank has them). Null: every
  // rank runs its own experts on every token (one process, or --ep 1).
  dist::Comm* expert_comm = nullptr;
  struct TokenShare {
    int index = 0;  // the rank's place in its TP group
    int count = 1;  // the group's ranks
  } token_share = {};
};

struct MoeWeights {
  std::vector<float> gate_weight;              // [E, d], FP32 copy of the BF16 router
  std::vector<float> e_score_correction_bias;  // [E]
  std::vector<MlpWeights> experts;             // [E]; [inter, r] / [r, inter] when latent
  std::vector<MlpWeights> shared_experts;      // usually one (fused when several); full width d
  // Latent MoE (§6.3), both set or neither: z = down(x) feeds the routed experts, up maps their
  // (normalised) sum back to d.
  std::optional<kernels::LinearWeight> latent_down_proj;  // [r, d]
  std::optional<kernels::LinearWeight> latent_up_proj;    // [d, r]
  std::vector<float> latent_norm;                         // [r]; empty: no norm
};

// The MoE's tensors under its prefix ("mlp." or "block_sparse_moe."): the router "gate" and its
// correction bias (replicated), the latent projections (replicated), routed experts
// "experts.<e>." by expert (only those the visitor holds_expert()), the shared experts
// "shared_experts." tensor-parallel.
void visit_moe_tensors(TensorVisitor& v, const MoeConfig& c, MoeWeights& w);

// Routing decisions for inspection and operator tests.
struct RoutingResult {
  std::vector<int32_t> expert_ids;  // [num_tokens, k]
  std::vector<float> weights;       // [num_tokens, k], after renormalisation and scaling
  std::vector<float> scores;        // [num_tokens, E], σ(router logits), unbiased
};

// §6.1: fills expert ids (ties to the lower id) and weights for every token.
void route_grouped_sigmoid(const ExecContext& ctx, const MoeConfig& config,
                           const MoeWeights& weights, const float* x, int64_t num_tokens,
                           int64_t hidden_size, RoutingResult& result);

class MoeBlock {
 public:
  // Weights are checked against config with DZ_CHECK: the loader has validated shapes already.
  MoeBlock(MoeConfig config, MoeWeights weights);
  const MoeConfig& config() const { return config_; }
  const MoeWeights& weights() const { return weights_; }  // route_grouped_sigmoid (verification)
  // What forward() takes from `scratch` for a step of at most max_tokens tokens.
  size_t scratch_bytes(int64_t max_tokens) const;

  // out [num_tokens, d] = Σ_e w_e·Expert_e(x) + Σ shared(x), x the FFN input after the post-
  // attention norm; summed in FP32 and rounded to BF16 once. Each expert runs one GEMM over the
  // tokens routed to it; experts without tokens are skipped. Taps "router_scores" [T, E],
  // "routing_ids" and "routing_weights" [T, k]; a sink's substitutes for the last two replace
  // the block's own decisions (verification, tests).
  // Latent: routing and shared experts on x; z = round_bf16(latent_down(x)) (tap "latent_in"
  // [T, r]); y_lat = Σ_e w_e·Expert_e(z) in FP32; out = round_bf16(latent_up(round_bf16(
  // RMSNorm(y_lat))) + Σ shared(x)), or round_bf16(y_lat) into latent_up without a norm.
  // Under expert parallelism every rank calls it for every layer, with num_tokens 0 where its
  // group has no tokens this step: it still runs its experts on the tokens others send it.
  void forward(const ExecContext& ctx, const float* x, int64_t num_tokens, float* out,
               Arena& scratch, TapSink* taps, int layer_id) const;

 private:
  // The (row, expert, weight) choices one forward runs on this rank, in any order.
  struct RoutedSlots {
    std::vector<int64_t> row;
    std::vector<int32_t> expert;
    std::vector<float> weight;
    void add(int64_t r, int32_t e, float w) {
      row.push_back(r);
      expert.push_back(e);
      weight.push_back(w);
    }
  };
  // row_sums [num_rows, r] = for each row the FP32 sum, in expert order, of weight · Expert(row)
  // over its slots (zero for a row without any). Each expert runs one GEMM over its rows.
  void run_routed(const ExecContext& ctx, const float* rows, int64_t num_rows,
                  const RoutedSlots& slots, float* row_sums, Arena& scratch) const;
  // Expert parallelism: routed_sum [T, r] for this rank's share of the T tokens (the other rows
  // zero), from the experts of every rank: dispatch, run, combine (docs/parallel.md §3).
  void exchange_routed(const ExecContext& ctx, const RoutingResult& routing, const float* rows,
                       int64_t num_tokens, float* routed_sum, int layer_id) const;
  // What run_routed takes from `scratch` for num_rows rows and num_slots slots.
  size_t routed_scratch_bytes(int64_t num_rows, int64_t num_slots) const;

  MoeConfig config_;
  MoeWeights weights_;
  int64_t hidden_size_ = 0;
  int64_t expert_width_ = 0;  // input width of the routed experts: d, or r when latent
  // Ranks the latent up projection's columns are split over (1 in one process).
  int latent_ranks() const {
    return config_.latent_comm != nullptr ? config_.latent_comm->size() : 1;
  }
  int64_t max_intermediate_ = 0;  // widest gate_proj among routed and shared experts
  std::vector<bool> held_;        // [E]: the routed experts this rank holds
  // The router as a BF16 linear (exact: the gate weight is BF16-valued), for a fast FP32-
  // accumulating x·Wgᵀ; empty if some gate value is not BF16, then the scalar loop runs.
  kernels::LinearWeight router_;
  bool router_is_bf16_ = false;
  // Expert parallelism: the tokens other ranks send are not bounded by this rank's batch, so
  // their scratch grows as needed.
  mutable std::unique_ptr<Arena> exchange_scratch_;
};

}  // namespace dz::model
