#include "dayzero/model/parallel_plan.h"

#include <fmt/format.h>

namespace dz::model {

std::string ParallelPlan::describe() const {
  return fmt::format("tp={} ep={} cp={} ({} rank{})", tp, ep, cp, world_size(),
                     world_size() == 1 ? "" : "s");
}

Status validate_plan(const ParallelPlan& plan, const ModelDims& dims) {
  for (auto [degree, flag] : {std::pair{plan.tp, "--tp"}, {plan.ep, "--ep"}, {plan.cp, "--cp"}}) {
    if (degree < 1)
      return make_error(StatusCode::kInvalidArgument, "{} {} must be at least 1", flag, degree);
  }
  struct Need {
    int64_t size;
    int64_t ways;
    const char* what;
    const char* flag;
  };
  const Need needs[] = {
      {dims.mla_heads, plan.tp, "num_attention_heads (MLA heads)", "--tp"},
      {dims.kda_heads, plan.tp, "linear_attn_config.num_heads (KDA heads)", "--tp"},
      {dims.dense_intermediate_size, plan.tp, "intermediate_size (dense MLP)", "--tp"},
      {dims.moe_intermediate_size, plan.tp, "moe_intermediate_size (shared-expert columns)",
       "--tp"},
      {dims.vocab_size, plan.tp, "vocab_size (embedding and head rows)", "--tp"},
  };
  for (const Need& need : needs) {
    if (need.size > 0 && need.size % need.ways != 0) {
      return make_error(StatusCode::kInvalidArgument, "plan {}: {} {} is not divisible by {} {}",
                        plan.describe(), need.what, need.size, need.flag, need.ways);
    }
  }
  const int64_t expert_ranks = int64_t{plan.tp} * plan.ep;
  if (dims.num_routed_experts > 0 && dims.num_routed_experts % expert_ranks != 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "plan {}: the {} routed experts do not divide over tp x ep = {} ranks",
                      plan.describe(), dims.num_routed_experts, expert_ranks);
  }
  if (plan.ep > 1 && dims.num_routed_experts == 0) {
    return make_error(StatusCode::kInvalidArgument,
                      "plan {}: --ep {} needs routed experts, and this model has none",
                      plan.describe(), plan.ep);
  }
  return Status::ok_status();
}

RankShard RankShard::of(const ParallelPlan& plan, int rank) {
  return {.tp_rank = plan.tp_rank(rank),
          .tp = plan.tp,
          .expert_rank = rank % (plan.tp * plan.ep),
          .expert_ranks = plan.tp * plan.ep};
}

bool RankShard::holds_expert(int64_t expert, int64_t num_experts) const {
  return expert >= expert_begin(num_experts) && expert < expert_end(num_experts);
}

int64_t split_ways(Split split, const ParallelPlan& plan) {
  switch (split) {
    case Split::kReplicated:
      return 1;
    case Split::kColumn:
    case Split::kRow:
    case Split::kByHead:
    case Split::kByVocab:
      return plan.tp;
    case Split::kByExpert:
      return int64_t{plan.tp} * plan.ep;
  }
  return 1;
}

RankWeights weights_per_rank(const TensorTable& table, const ParallelPlan& plan) {
  RankWeights held;
  for (const TensorSpec& spec : table.specs()) {
    if (!table.in_published_layout(spec)) continue;
    const int64_t bytes = (spec.shape.num_elems() * dtype_bits(spec.dtypes[0]) + 7) / 8;
    const int64_t ways = split_ways(spec.split, plan);
    held.bytes += (bytes + ways - 1) / ways;
    if (spec.split == Split::kReplicated) held.replicated_bytes += bytes;
  }
  return held;
}

}  // namespace dz::model
