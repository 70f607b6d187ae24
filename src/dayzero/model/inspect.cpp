#include "dayzero/model/inspect.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dayzero/formats/checkpoint.h"
#include "dayzero/model/registry.h"

namespace dz::model {
namespace {

bool is_scale(TensorRole role) {
  return role == TensorRole::kFp8Scale || role == TensorRole::kMxfp4Scale;
}

// Sums stored tensors into a summary; routed-expert parameters of the main model are kept apart
// to count active parameters at the end.
class Counter {
 public:
  explicit Counter(ModelSummary& summary) : summary_(summary) {}

  void add(const TensorSpec& spec, DType dtype, const Shape& shape, int64_t num_bytes) {
    int64_t params = logical_params(spec, shape);
    std::string component = is_scale(spec.role) ? "scales"
                            : spec.is_mtp       ? "mtp"
                                                : std::string(component_name(spec.component));
    add_to(summary_.by_component[component], params, num_bytes);
    add_to(summary_.by_dtype[std::string(dtype_name(dtype))], params, num_bytes);
    summary_.num_tensors += 1;
    summary_.total_params += params;
    summary_.total_bytes += num_bytes;
    if (spec.is_mtp) summary_.mtp_params += params;
    if (spec.is_routed_expert && !spec.is_mtp) routed_params_ += params;
    if (spec.component == Component::kEmbedding && !spec.is_mtp) embedding_params_ += params;
  }

  void finish() {
    int64_t main_params = summary_.total_params - summary_.mtp_params;
    int64_t active_routed = 0;
    if (summary_.num_routed_experts > 0)
      active_routed = routed_params_ / summary_.num_routed_experts * summary_.num_experts_per_token;
    summary_.active_params = main_params - embedding_params_ - routed_params_ + active_routed;
  }

 private:
  static void add_to(ParamBytes& entry, int64_t params, int64_t num_bytes) {
    entry.num_tensors += 1;
    entry.num_params += params;
    entry.num_bytes += num_bytes;
  }

  ModelSummary& summary_;
  int64_t routed_params_ = 0;
  int64_t embedding_params_ = 0;
};

int64_t stored_bytes(DType dtype, const Shape& shape) {
  return (shape.num_elems() * dtype_bits(dtype) + 7) / 8;
}

ModelSummary start_summary(const Architecture& arch) {
  ModelSummary summary;
  summary.model_type = arch.model_type();
  summary.recipe = std::string(arch.recipe_name());
  summary.quantization = arch.quantization().describe();
  summary.schedule = arch.schedule();
  summary.num_routed_experts = arch.dims().num_routed_experts;
  summary.num_experts_per_token = arch.dims().num_experts_per_token;
  return summary;
}

std::string dtype_list(const std::vector<DType>& dtypes) {
  std::string out;
  for (DType d : dtypes) out += (out.empty() ? "" : " or ") + std::string(dtype_name(d));
  return out;
}

std::string file_of(const formats::CheckpointTensor& tensor) {
  std::string path = tensor.file->path();
  return path.substr(path.find_last_of('/') + 1);
}

}  // namespace

ModelSummary summarize_architecture(const Architecture& arch) {
  return summarize_architecture(arch, arch.tensor_table());
}

ModelSummary summarize_architecture(const Architecture& arch, const TensorTable& table) {
  ModelSummary summary = start_summary(arch);
  Counter counter(summary);
  for (const TensorSpec& spec : table.specs()) {
    if (!table.in_published_layout(spec)) continue;
    counter.add(spec, spec.dtypes[0], spec.shape, stored_bytes(spec.dtypes[0], spec.shape));
  }
  counter.finish();
  return summary;
}

Result<ModelSummary> inspect_checkpoint(const std::string& dir) {
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<Architecture> arch, load_model_config(dir));
  DZ_ASSIGN_OR_RETURN(formats::Checkpoint checkpoint, formats::Checkpoint::open(dir));
  return inspect_checkpoint(*arch, checkpoint);
}

Result<ModelSummary> inspect_checkpoint(const Architecture& arch_ref,
                                        const formats::Checkpoint& checkpoint) {
  const Architecture* arch = &arch_ref;
  const std::string& dir = checkpoint.dir();
  TensorTable table = arch->tensor_table();
  const formats::QuantizationConfig& quant = arch->quantization();
  auto error = [&](StatusCode code, const std::string& message) {
    return Status(code, fmt::format("checkpoint {}: {}", dir, message));
  };

  // docs/formats.md §3.4: a module the ignore list names must be plain, so none may be MXFP4.
  for (const std::string& module : table.mxfp4_modules())
    if (quant.ignores(module))
      return error(
          StatusCode::kInvalidArgument,
          fmt::format("config.json: the quantization_config ignore list names module \"{}\", "
                      "which the {} recipe stores as MXFP4",
                      module, arch->recipe_name()));

  ModelSummary summary = start_summary(*arch);
  Counter counter(summary);
  for (const TensorSpec& spec : table.specs()) {
    auto found = checkpoint.find(spec.name);
    if (spec.only_if_weight_is_fp8) {
      auto weight = checkpoint.find(weight_of_scale(spec.name));
      bool weight_is_fp8 = weight && weight->info->dtype == DType::kF8E4M3;
      if (!weight_is_fp8 && found)
        return error(StatusCode::kInvalidArgument,
                     fmt::format("tensor \"{}\" in {} scales a weight that is not F8_E4M3",
                                 spec.name, file_of(*found)));
      if (!weight_is_fp8) continue;
    }
    if (!found)
      return error(StatusCode::kNotFound,
                   fmt::format("tensor \"{}\" is missing (expected {} {}, component {})", spec.name,
                               dtype_list(spec.dtypes), spec.shape.to_string(),
                               component_name(spec.component)));
    const formats::TensorInfo& info = *found->info;
    if (!(info.shape == spec.shape))
      return error(
          StatusCode::kInvalidArgument,
          fmt::format("tensor \"{}\" in {} has shape {}, config.json implies {}", spec.name,
                      file_of(*found), info.shape.to_string(), spec.shape.to_string()));
    if (std::find(spec.dtypes.begin(), spec.dtypes.end(), info.dtype) == spec.dtypes.end())
      return error(StatusCode::kInvalidArgument,
                   fmt::format("tensor \"{}\" in {} has dtype {}, expected {}", spec.name,
                               file_of(*found), dtype_name(info.dtype), dtype_list(spec.dtypes)));
    counter.add(spec, info.dtype, info.shape, static_cast<int64_t>(info.size_bytes));
  }

  auto prefixes = arch->unchecked_prefixes();
  for (const formats::CheckpointTensor& tensor : checkpoint.tensors()) {
    const std::string& name = tensor.info->name;
    if (table.find(name) != nullptr) continue;
    auto prefix = std::find_if(prefixes.begin(), prefixes.end(),
                               [&](const auto& p) { return name.starts_with(p.first); });
    if (prefix == prefixes.end())
      return error(StatusCode::kInvalidArgument,
                   fmt::format("tensor \"{}\" in {} is not expected by the {} recipe for this "
                               "config.json",
                               name, file_of(tensor), arch->recipe_name()));
    TensorSpec spec{.name = name, .component = prefix->second};
    counter.add(spec, tensor.info->dtype, tensor.info->shape,
                static_cast<int64_t>(tensor.info->size_bytes));
  }
  counter.finish();
  return summary;
}

namespace {

std::string human(int64_t value) {
  const char* suffixes[] = {"", "K", "M", "B", "T"};
  double v = static_cast<double>(value);
  int i = 0;
  while (v >= 1000.0 && i < 4) {
    v /= 1000.0;
    ++i;
  }
  return i == 0 ? fmt::format("{}", value) : fmt::format("{:.2f}{}", v, suffixes[i]);
}

void print_table(std::string& out, const std::map<std::string, ParamBytes>& rows,
                 std::string_view title) {
  out +=
      fmt::format("  {:<16} {:>18} {:>10} {:>16} {:>8}\n", title, "params", "", "bytes", "tensors");
  for (const auto& [name, row] : rows)
    out += fmt::format("  {:<16} {:>18} {:>10} {:>16} {:>8}\n", name, row.num_params,
                       human(row.num_params), row.num_bytes, row.num_tensors);
}

}  // namespace

std::string format_summary_text(const ModelSummary& s) {
  std::string out;
  out += fmt::format("model_type: {} (recipe {})\n", s.model_type, s.recipe);
  out += fmt::format("quantization: {}\n", s.quantization);
  const auto& sched = s.schedule;
  out += fmt::format(
      "layers: {} (+{} MTP): {} KDA, {} MLA, {} MLA+DSA; {} dense MLP, {} MoE, "
      "{} latent MoE\n",
      sched.num_main_layers(), sched.num_mtp_layers(), sched.count(AttentionKind::kKda),
      sched.count(AttentionKind::kMla), sched.count(AttentionKind::kMlaDsa),
      sched.count(FfnKind::kDenseMlp), sched.count(FfnKind::kMoe),
      sched.count(FfnKind::kLatentMoe));
  out += "schedule:\n";
  for (const std::string& line : describe_schedule(sched)) out += "  " + line + "\n";
  out += "by component:\n";
  print_table(out, s.by_component, "component");
  out += "by dtype:\n";
  print_table(out, s.by_dtype, "dtype");
  out += fmt::format("tensors: {}\n", s.num_tensors);
  out += fmt::format("total parameters: {} ({}), {} bytes\n", s.total_params, human(s.total_params),
                     s.total_bytes);
  if (s.mtp_params > 0)
    out += fmt::format("  of which MTP: {} ({})\n", s.mtp_params, human(s.mtp_params));
  out += fmt::format("active per token: {} ({}) with {} of {} routed experts\n", s.active_params,
                     human(s.active_params), s.num_experts_per_token, s.num_routed_experts);
  return out;
}

std::string format_summary_json(const ModelSummary& s) {
  nlohmann::ordered_json j;
  j["model_type"] = s.model_type;
  j["recipe"] = s.recipe;
  j["quantization"] = s.quantization;
  j["num_layers"] = s.schedule.num_main_layers();
  j["num_mtp_layers"] = s.schedule.num_mtp_layers();
  j["layers"] = nlohmann::ordered_json::array();
  for (const LayerSpec& layer : s.schedule.layers)
    j["layers"].push_back({{"layer", layer.layer_id},
                           {"attention", attention_kind_name(layer.attention)},
                           {"ffn", ffn_kind_name(layer.ffn)},
                           {"attn_res", layer.attn_res},
                           {"attn_res_write", layer.attn_res_write},
                           {"mtp", layer.is_mtp}});
  j["schedule"] = describe_schedule(s.schedule);
  auto rows = [](const std::map<std::string, ParamBytes>& table) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& [name, row] : table)
      out[name] = {
          {"params", row.num_params}, {"bytes", row.num_bytes}, {"tensors", row.num_tensors}};
    return out;
  };
  j["by_component"] = rows(s.by_component);
  j["by_dtype"] = rows(s.by_dtype);
  j["num_tensors"] = s.num_tensors;
  j["total_params"] = s.total_params;
  j["total_bytes"] = s.total_bytes;
  j["mtp_params"] = s.mtp_params;
  j["active_params"] = s.active_params;
  j["num_routed_experts"] = s.num_routed_experts;
  j["num_experts_per_token"] = s.num_experts_per_token;
  return j.dump(2);
}

}  // namespace dz::model
