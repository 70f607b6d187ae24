#include "dayzero/model/causal_lm.h"

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

Result<std::unique_ptr<CausalLm>> load_causal_lm(const std::string& dir,
                                                 const ModelOptions& options) {
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<Architecture> arch, load_model_config(dir));
  DZ_ASSIGN_OR_RETURN(formats::Checkpoint checkpoint, formats::Checkpoint::open(dir));
  DZ_RETURN_IF_ERROR(inspect_checkpoint(*arch, checkpoint).status());
  return arch->load_model(std::make_unique<formats::Checkpoint>(std::move(checkpoint)), options);
}

}  // namespace dz::model
