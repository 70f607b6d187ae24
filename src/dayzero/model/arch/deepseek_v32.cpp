#include "dayzero/model/arch/deepseek_v32.h"

#include <fmt/format.h>

#include "dayzero/model/arch/deepseek_v32_model.h"
#include "dayzero/model/arch/moe_config_checks.h"

namespace dz::model {
namespace {

#define READ(method, field, ...) \
  DZ_READ_CONFIG_FIELD(obj, c, method, field __VA_OPT__(, ) __VA_ARGS__)

// Far above any published model; keeps tensor tables of hostile configs bounded.

Status check_contradictions(const formats::ConfigObject& obj, const DeepseekV32Config& c) {
  if (c.num_hidden_layers + c.num_nextn_predict_layers > kMaxLayers)
    return obj.field_error(
        "num_hidden_layers",
        fmt::format("{} layers (+{} MTP) exceed the limit {}", c.num_hidden_layers,
                    c.num_nextn_predict_layers, kMaxLayers));
  DZ_RETURN_IF_ERROR(check_moe_routing_fields(
      obj, {.num_experts = {"n_routed_experts", c.n_routed_experts},
            .experts_per_token = {"num_experts_per_tok", c.num_experts_per_tok},
            .num_groups = {"n_group", c.n_group},
            .topk_group = c.topk_group,
            .first_k_dense_replace = c.first_k_dense_replace,
            .num_hidden_layers = c.num_hidden_layers}));
  if (c.index_head_dim < c.qk_rope_head_dim)
    return obj.field_error("index_head_dim",
                           fmt::format("{} is smaller than its rope part qk_rope_head_dim {}",
                                       c.index_head_dim, c.qk_rope_head_dim));
  if (c.topk_method != "noaux_tc")
    return obj.field_error("topk_method",
                           fmt::format("unsupported \"{}\" (supported: noaux_tc)", c.topk_method));
  if (c.scoring_func != "sigmoid")
    return obj.field_error("scoring_func",
                           fmt::format("unsupported \"{}\" (supported: sigmoid)", c.scoring_func));
  if (c.hidden_act != "silu")
    return obj.field_error("hidden_act",
                           fmt::format("unsupported \"{}\" (supported: silu)", c.hidden_act));
  auto method = c.quantization_config.method;
  if (method != formats::QuantMethod::kNone && method != formats::QuantMethod::kFp8Block)
    return obj.field_error("quantization_config",
                           fmt::format("{} is not a deepseek_v32 format (supported: fp8 or none)",
                                       c.quantization_config.describe()));
  return Status::ok_status();
}

bool is_moe_layer(const DeepseekV32Config& c, int64_t layer_id) {
  return layer_id >= c.first_k_dense_replace && layer_id % c.moe_layer_freq == 0;
}

class DeepseekV32 final : public Architecture {
 public:
  DeepseekV32(DeepseekV32Config config, std::string model_type, std::string prefix)
      : config_(std::move(config)),
        model_type_(std::move(model_type)),
        prefix_(std::move(prefix)) {}

  std::string_view recipe_name() const override { return "deepseek_v32"; }
  const std::string& model_type() const override { return model_type_; }
  LayerSchedule schedule() const override { return deepseek_v32_schedule(config_); }
  TensorTable tensor_table() const override { return deepseek_v32_tensors(config_, prefix_); }
  const formats::QuantizationConfig& quantization() const override {
    return config_.quantization_config;
  }
  ModelDims dims() const override {
    return {.hidden_size = config_.hidden_size,
            .vocab_size = config_.vocab_size,
            .dense_intermediate_size = config_.intermediate_size,
            .mla_heads = config_.num_attention_heads,
            .kv_lora_rank = config_.kv_lora_rank,
            .qk_rope_head_dim = config_.qk_rope_head_dim,
            .mla_cache_fp8 = true,
            .mla_uses_rope = true,
            .index_n_heads = config_.index_n_heads,
            .index_head_dim = config_.index_head_dim,
            .index_topk = config_.index_topk,
            .num_routed_experts = config_.n_routed_experts,
            .num_experts_per_token = config_.num_experts_per_tok,
            .num_shared_experts = config_.n_shared_experts,
            .moe_intermediate_size = config_.moe_intermediate_size,
            .routed_hidden_size = config_.hidden_size,
            .num_expert_groups = config_.n_group,
            .topk_groups = config_.topk_group};
  }
  Result<std::unique_ptr<CausalLm>> load_model(std::unique_ptr<formats::Checkpoint> checkpoint,
                                               const ModelOptions& options) const override {
    return load_deepseek_v32_model(config_, prefix_, std::move(checkpoint), options);
  }

 private:
  DeepseekV32Config config_;
  std::string model_type_;
  std::string prefix_;
};

}  // namespace

Result<DeepseekV32Config> parse_deepseek_v32_config(const formats::ConfigObject& obj) {
  DeepseekV32Config c;
  READ(required_positive_int, vocab_size);
  READ(required_positive_int, hidden_size);
  READ(required_positive_int, intermediate_size);
  READ(required_positive_int, moe_intermediate_size);
  READ(required_positive_int, num_hidden_layers);
  READ(optional_non_negative_int, num_nextn_predict_layers, 0);
  READ(required_positive_int, num_attention_heads);
  READ(required_positive_int, q_lora_rank);
  READ(required_positive_int, kv_lora_rank);
  READ(required_positive_int, qk_nope_head_dim);
  READ(required_positive_int, qk_rope_head_dim);
  READ(required_positive_int, v_head_dim);
  READ(required_positive_int, n_routed_experts);
  READ(optional_non_negative_int, n_shared_experts, 0);
  READ(required_positive_int, num_experts_per_tok);
  READ(required_positive_int, n_group);
  READ(required_positive_int, topk_group);
  READ(required_non_negative_int, first_k_dense_replace);
  READ(required_positive_int, moe_layer_freq);
  READ(optional_bool, norm_topk_prob, true);
  READ(required_number, routed_scaling_factor);
  READ(required_string, topk_method);
  READ(required_string, scoring_func);
  READ(required_string, hidden_act);
  READ(required_positive_int, index_n_heads);
  READ(required_positive_int, index_head_dim);
  READ(required_positive_int, index_topk);
  READ(optional_bool, indexer_rope_interleave, false);
  READ(required_positive_int, max_position_embeddings);
  READ(required_number, rope_theta);
  READ(required_number, rms_norm_eps);
  READ(optional_bool, tie_word_embeddings, false);
  DZ_ASSIGN_OR_RETURN(bool attention_bias, obj.optional_bool("attention_bias", false));
  if (attention_bias) return obj.field_error("attention_bias", "biased attention is not supported");
  DZ_ASSIGN_OR_RETURN(auto rope, obj.optional_object("rope_scaling"));
  if (rope) {
    DZ_ASSIGN_OR_RETURN(c.rope_scaling, formats::parse_rope_scaling(*rope));
  }
  DZ_ASSIGN_OR_RETURN(auto quant, obj.optional_object("quantization_config"));
  if (quant) {
    DZ_ASSIGN_OR_RETURN(c.quantization_config, formats::parse_quantization_config(*quant));
  }
  DZ_RETURN_IF_ERROR(check_contradictions(obj, c));
  return c;
}

#undef READ

LayerSchedule deepseek_v32_schedule(const DeepseekV32Config& c) {
  LayerSchedule schedule;
  int64_t num_layers = c.num_hidden_layers + c.num_nextn_predict_layers;
  for (int64_t i = 0; i < num_layers; ++i)
    schedule.layers.push_back(LayerSpec{
        .layer_id = static_cast<int>(i),
        .attention = AttentionKind::kMlaDsa,
        .ffn = is_moe_layer(c, i) ? FfnKind::kMoe : FfnKind::kDenseMlp,
        .is_mtp = i >= c.num_hidden_layers,
    });
  return schedule;
}

Result<std::unique_ptr<Architecture>> parse_deepseek_v32(const RecipeInput& input) {
  DZ_ASSIGN_OR_RETURN(DeepseekV32Config config, parse_deepseek_v32_config(input.text));
  return std::unique_ptr<Architecture>(
      std::make_unique<DeepseekV32>(std::move(config), input.model_type, input.tensor_prefix));
}

}  // namespace dz::model
