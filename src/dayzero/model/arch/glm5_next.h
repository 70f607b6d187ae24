#pragma once
// `glm5_next` (GLM-5.3-Flash, docs/models.md §7.4) as `dayzero analyze` reads it: the config
// fields, the layer schedule and the tensor table of the published checkpoint, with no loader. The
// engine refuses to run it (registry.cpp): its mHC hyper-connections and the pooled-block indexer
// are not built; Architecture::missing() lists them.

#include <memory>

#include "dayzero/core/status.h"
#include "dayzero/model/architecture.h"

namespace dz::model {

// The registry's analysis-only entry point; `input.text` is text_config.
Result<std::unique_ptr<Architecture>> parse_glm5_next_for_analysis(const RecipeInput& input);

}  // namespace dz::model
