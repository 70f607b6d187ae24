#pragma once
// The runnable deepseek_v32 model (docs/models.md §7.1): a HybridModel of MLA + DSA-indexer layers
// with dense SwiGLU or grouped-sigmoid MoE FFNs, plus the MTP layer (model/mtp_layer.h). Blocks
// come from model/blocks, the forward from HybridModel, in the numerics of docs/models.md §0
// (BF16-valued activations between blocks, FP32 residual adds rounded once).

#include <cstdint>
#include <memory>
#include <string>

#include "dayzero/formats/checkpoint.h"
#include "dayzero/model/arch/deepseek_v32.h"
#include "dayzero/model/blocks/dsa_indexer.h"
#include "dayzero/model/blocks/mla.h"
#include "dayzero/model/blocks/moe.h"
#include "dayzero/model/hybrid_model.h"
#include "dayzero/model/weight_loader.h"

namespace dz::model {

// Block configs derived from the model config (exposed for tests).
MlaConfig deepseek_v32_mla_config(const DeepseekV32Config& config);
DsaIndexerConfig deepseek_v32_indexer_config(const DeepseekV32Config& config);
MoeConfig deepseek_v32_moe_config(const DeepseekV32Config& config);

// The model (a HybridModel) from a checkpoint already validated against deepseek_v32_tensors,
// with the first MTP layer (the only one run) when the config has any.
Result<std::unique_ptr<CausalLm>> load_deepseek_v32_model(
    const DeepseekV32Config& config, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options);

}  // namespace dz::model
