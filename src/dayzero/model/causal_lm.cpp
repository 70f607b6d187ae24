#include "dayzero/model/causal_lm.h"

#include <spdlog/spdlog.h>

#include "dayzero/formats/checkpoint.h"
#include "dayzero/model/architecture.h"
#include "dayzero/model/inspect.h"
#include "dayzero/model/registry.h"

namespace dz::model {

Result<std::unique_ptr<CausalLm>> Architecture::load_model(std::unique_ptr<formats::Checkpoint>,
                                                           const ModelOptions&) const {
  return make_error(
      StatusCode::kUnsupported,
      "model_type \"{}\": the {} recipe can inspect this checkpoint but not run it yet",
      model_type(), recipe_name());
}

Status CausalLm::forward_mtp(const ExecContext&, const ForwardBatch&, KvCache&,
                             std::span<const int64_t>, float*, TapSink*) {
  return make_error(StatusCode::kUnsupported, "this model has no multi-token-prediction head");
}

Status CausalLm::forward_mtp_chain(const ExecContext&, const ForwardBatch&, KvCache&, float*,
                                   TapSink*) {
  return make_error(StatusCode::kUnsupported, "this model has no chained multi-token prediction");
}

Result<std::unique_ptr<CausalLm>> load_causal_lm(const std::string& dir,
                                                 const ModelOptions& options) {
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<Architecture> arch, load_model_config(dir));
  const ParallelPlan& plan = options.plan;
  if (plan.world_size() > 1) {
    DZ_RETURN_IF_ERROR(validate_plan(plan, arch->dims()));
    if (plan.cp > 1 && plan.ep > 1)
      return make_error(StatusCode::kUnsupported,
                        "plan {}: context parallelism with --ep > 1 is not built yet "
                        "(docs/parallel.md §10)",
                        plan.describe());
    if (plan.cp > 1 && (options.cp_comm == nullptr || options.cp_comm->size() != plan.cp))
      return make_error(StatusCode::kInvalidArgument, "plan {}: the CP group needs {} ranks",
                        plan.describe(), plan.cp);
    if (options.comm == nullptr || options.comm->size() != plan.world_size())
      return make_error(StatusCode::kInvalidArgument, "plan {} needs {} ranks, the job has {}",
                        plan.describe(), plan.world_size(),
                        options.comm == nullptr ? 1 : options.comm->size());
    if (plan.tp > 1 && (options.tp_comm == nullptr || options.tp_comm->size() != plan.tp))
      return make_error(StatusCode::kInvalidArgument, "plan {}: the TP group needs {} ranks",
                        plan.describe(), plan.tp);
  }
  DZ_ASSIGN_OR_RETURN(formats::Checkpoint checkpoint, formats::Checkpoint::open(dir));
  DZ_RETURN_IF_ERROR(inspect_checkpoint(*arch, checkpoint).status());
  if (plan.world_size() > 1) {
    const TensorTable table = arch->tensor_table();
    const RankWeights held = weights_per_rank(table, plan);
    const auto mib = [](int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); };
    spdlog::info(
        "rank {} of {} ({}): holds {:.1f} MiB of the {:.1f} MiB of weights ({:.1f} MiB "
        "replicated)",
        options.rank, plan.world_size(), plan.describe(), mib(held.bytes),
        mib(weights_per_rank(table, {}).bytes), mib(held.replicated_bytes));
  }
  return arch->load_model(std::make_unique<formats::Checkpoint>(std::move(checkpoint)), options);
}

}  // namespace dz::model
