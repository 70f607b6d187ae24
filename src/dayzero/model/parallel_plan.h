#pragma once
// How a model is cut over ranks (docs/parallel.md §1): tp × ep (× cp) ranks. Rank r sits at
// tp_rank = r % tp, ep_rank = (r / tp) % ep, cp_rank = r / (tp · ep). A TP group (the tp ranks with
// the same ep and cp coordinates) serves its own sequences and splits attention, KDA, dense MLPs,
// shared experts, embeddings and head by heads, columns or vocabulary; the ep TP groups are
// data-parallel. Routed experts are split by whole experts over all tp · ep ranks, tokens going to
// them by all-to-all when ep > 1. A CP group splits one long prompt.

#include <cstdint>
#include <string>

#include "dayzero/core/status.h"
#include "dayzero/model/architecture.h"
#include "dayzero/model/tensor_table.h"

namespace dz::model {

struct ParallelPlan {
  int tp = 1;
  int ep = 1;
  int cp = 1;

  int world_size() const { return tp * ep * cp; }
  int tp_rank(int rank) const { return rank % tp; }
  int ep_rank(int rank) const { return (rank / tp) % ep; }
  int cp_rank(int rank) const { return rank / (tp * ep); }
  std::string describe() const;  // "tp=2 ep=2 cp=1 (4 ranks)"
};

// Where one rank sits in a plan: its place in its TP group and among the ranks that split the
// routed experts (all tp · ep of them).
struct RankShard {
  int tp_rank = 0;
  int tp = 1;
  int expert_rank = 0;
  int expert_ranks = 1;

  static RankShard of(const ParallelPlan& plan, int rank);
  bool is_whole() const { return tp == 1 && expert_ranks == 1; }
  // Whether this rank holds routed expert `expert` of `num_experts` (contiguous ranges).
  bool holds_expert(int64_t expert, int64_t num_experts) const;
  // Its experts: [expert_begin, expert_end).
  int64_t expert_begin(int64_t num_experts) const {
    return num_experts / expert_ranks * expert_rank;
  }
  int64_t expert_end(int64_t num_experts) const {
    return num_experts / expert_ranks * (expert_rank + 1);
  }
};

// kInvalidArgument naming the first size the plan does not divide (heads, KDA heads, experts,
// intermediate sizes, vocabulary), or a degree below 1.
Status validate_plan(const ParallelPlan& plan, const ModelDims& dims);

// How many ranks share one tensor of this split: 1 for replicated, tp for head / column / row /
// vocabulary splits, tp · ep for routed experts (whole experts per rank).
int64_t split_ways(Split split, const ParallelPlan& plan);

// What one rank holds of a model's stored tensors (published dtypes): each tensor's bytes divided
// by the ranks that share it; `replicated_bytes` of it are held whole by every rank. FP8 scales
// that exist only with an FP8 weight count where the published weight is FP8, as inspect does.
struct RankWeights {
  int64_t bytes = 0;
  int64_t replicated_bytes = 0;
};
RankWeights weights_per_rank(const TensorTable& table, const ParallelPlan& plan);

}  // namespace dz::model
