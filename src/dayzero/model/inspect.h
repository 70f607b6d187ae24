#pragma once
// `dayzero inspect`: check a checkpoint folder against its recipe's tensor table and count what
// it holds. Parameters are logical: an FP8 or MXFP4 weight counts out×in parameters (MXFP4 packs
// two per byte); its scale tensor counts bytes only, under the component "scales".

#include <cstdint>
#include <map>
#include <string>

#include "dayzero/core/status.h"
#include "dayzero/formats/checkpoint.h"
#include "dayzero/model/architecture.h"

namespace dz::model {

struct ParamBytes {
  int64_t num_tensors = 0;
  int64_t num_params = 0;
  int64_t num_bytes = 0;
};

struct ModelSummary {
  std::string model_type;
  std::string recipe;
  std::string quantization;  // QuantizationConfig::describe()
  LayerSchedule schedule;
  // Keys are component_name() values, "mtp" for every tensor of an MTP layer, "scales" for
  // FP8/MXFP4 scale tensors.
  std::map<std::string, ParamBytes> by_component;
  std::map<std::string, ParamBytes> by_dtype;  // stored dtype ("BF16", "F8_E4M3", "U8", ...)
  int64_t num_tensors = 0;
  int64_t total_params = 0;  // everything, MTP included
  int64_t total_bytes = 0;
  int64_t mtp_params = 0;
  // Per token in the main model (MTP excluded): every parameter except the embedding table (a
  // lookup) and the routed experts, plus num_experts_per_token / num_routed_experts of the
  // routed-expert parameters. This is the convention of the published "active" figures
  // (DeepSeek-V3.2 37B, Kimi-K3 104B, Kimi-Linear 3B).
  int64_t active_params = 0;
  int64_t num_routed_experts = 0;
  int64_t num_experts_per_token = 0;
};

// What the config promises, with the published dtypes (no checkpoint needed).
ModelSummary summarize_architecture(const Architecture& arch);
// The same from arch.tensor_table(), already built (a 1.6 TB model's table takes seconds).
ModelSummary summarize_architecture(const Architecture& arch, const TensorTable& table);

// Opens DIR/config.json through the registry and the checkpoint in DIR; every expected tensor
// must be present with the expected shape and an accepted dtype, and no other tensor may be
// there. The first problem is returned, naming the tensor (or config field).
Result<ModelSummary> inspect_checkpoint(const std::string& dir);
// The same checks on an open checkpoint (the model loader runs them before loading).
Result<ModelSummary> inspect_checkpoint(const Architecture& arch,
                                        const formats::Checkpoint& checkpoint);

std::string format_summary_text(const ModelSummary& summary);
std::string format_summary_json(const ModelSummary& summary);  // parsed by tests/inspect_test.sh

}  // namespace dz::model
