#include "dayzero/model/arch/kimi_linear.h"

#include <algorithm>

#include <fmt/format.h>

#include "dayzero/formats/checkpoint.h"
#include "dayzero/kernels/short_conv.h"
#include "dayzero/model/arch/moe_config_checks.h"
#include "dayzero/model/causal_lm.h"

namespace dz::model {
namespace {

// Far above any published model; keeps schedules and tensor tables of hostile configs bounded.

#define READ(method, field, ...) \
  DZ_READ_CONFIG_FIELD(obj, c, method, field __VA_OPT__(, ) __VA_ARGS__)

// Converts a 1-based layer list to 0-based, refusing out-of-range entries and duplicates.
Result<std::vector<int>> read_layer_list(const formats::ConfigObject& obj, std::string_view key,
                                         int64_t num_layers, std::vector<int>& owner,
                                         std::string_view other_key) {
  DZ_ASSIGN_OR_RETURN(std::vector<int64_t> one_based, obj.required_positive_int_list(key));
  std::vector<int> out;
  for (size_t j = 0; j < one_based.size(); ++j) {
    std::string item = fmt::format("{}[{}]", key, j);
    if (one_based[j] > num_layers)
      return obj.field_error(
          item, fmt::format("layer {} is out of range 1..{} (the list is 1-based)", one_based[j],
                            num_layers));
    int layer = static_cast<int>(one_based[j] - 1);
    if (owner[static_cast<size_t>(layer)] == 1)
      return obj.field_error(item, fmt::format("layer {} is listed twice", one_based[j]));
    if (owner[static_cast<size_t>(layer)] == 2)
      return obj.field_error(item, fmt::format("layer {} is also in {}", one_based[j], other_key));
    owner[static_cast<size_t>(layer)] = 1;
    out.push_back(layer);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Result<KimiLinearAttnConfig> parse_linear_attn_config(const formats::ConfigObject& obj,
                                                      int64_t num_layers) {
  KimiLinearAttnConfig c;
  // owner[i]: 0 = unlisted, 1 = listed by the list being read, 2 = by the other list.
  std::vector<int> owner(static_cast<size_t>(num_layers), 0);
  DZ_ASSIGN_OR_RETURN(c.kda_layers,
                      read_layer_list(obj, "kda_layers", num_layers, owner, "full_attn_layers"));
  for (int& o : owner) o = o == 1 ? 2 : 0;
  DZ_ASSIGN_OR_RETURN(c.full_attn_layers,
                      read_layer_list(obj, "full_attn_layers", num_layers, owner, "kda_layers"));
  for (size_t i = 0; i < owner.size(); ++i)
    if (owner[i] == 0)
      return obj.field_error("kda_layers",
                             fmt::format("layer {} (1-based) is in neither kda_layers nor "
                                         "full_attn_layers; together they must cover 1..{}",
                                         i + 1, num_layers));
  READ(required_positive_int, num_heads);
  READ(required_positive_int, head_dim);
  READ(required_positive_int, short_conv_kernel_size);
  if (c.short_conv_kernel_size > kernels::kMaxShortConvWidth)
    return obj.field_error("short_conv_kernel_size",
                           fmt::format("{} exceeds {}, the widest short convolution dayzero runs",
                                       c.short_conv_kernel_size, kernels::kMaxShortConvWidth));
  READ(optional_bool, use_full_rank_gate, false);
  READ(optional_number, gate_lower_bound);
  if (c.gate_lower_bound && !(*c.gate_lower_bound < 0.0))
    return obj.type_error("gate_lower_bound", "a negative number");
  if (c.gate_lower_bound && c.num_heads > c.head_dim)
    return obj.field_error("num_heads", fmt::format("{} heads do not fit the A_log padding to "
                                                    "head_dim {} of the bounded gate",
                                                    c.num_heads, c.head_dim));
  return c;
}

// dayzero_hybrid's RoPE + indexer fields (docs/recipe_dayzero_hybrid.md).
Result<RopeDsaConfig> parse_rope_dsa(const formats::ConfigObject& obj, const KimiLinearConfig& k) {
  RopeDsaConfig c;
  if (k.mla_use_nope)
    return obj.field_error("mla_use_nope",
                           "must be absent or false for dayzero_hybrid (its MLA uses RoPE)");
  if (!k.q_lora_rank)
    return obj.field_error("q_lora_rank",
                           "is required for dayzero_hybrid (the DSA indexer reads the q latent)");
  READ(required_number, rope_theta);
  if (!(c.rope_theta > 1.0)) return obj.type_error("rope_theta", "a number above 1");
  if (obj.has("rope_scaling"))
    return obj.field_error("rope_scaling",
                           "must be null or absent for dayzero_hybrid (plain RoPE frequencies; "
                           "YaRN is not part of this recipe)");
  READ(required_positive_int, index_n_heads);
  READ(required_positive_int, index_head_dim);
  READ(required_positive_int, index_topk);
  READ(optional_bool, indexer_rope_interleave, false);
  if (k.qk_rope_head_dim % 2 != 0)
    return obj.field_error("qk_rope_head_dim",
                           fmt::format("{} is odd; RoPE rotates pairs", k.qk_rope_head_dim));
  if (c.index_head_dim < k.qk_rope_head_dim)
    return obj.field_error("index_head_dim",
                           fmt::format("{} is smaller than its rope part qk_rope_head_dim {}",
                                       c.index_head_dim, k.qk_rope_head_dim));
  return c;
}

Status check_contradictions(const formats::ConfigObject& obj, const KimiLinearConfig& c,
                            KimiMlaKind mla_kind) {
  if (mla_kind == KimiMlaKind::kNope && !c.mla_use_nope)
    return obj.field_error("mla_use_nope", "must be true: Kimi MLA with RoPE is not supported");
  DZ_RETURN_IF_ERROR(check_moe_routing_fields(
      obj, {.num_experts = {"num_experts", c.num_experts},
            .experts_per_token = {"num_experts_per_token", c.num_experts_per_token},
            .num_groups = {"num_expert_group", c.num_expert_group},
            .topk_group = c.topk_group,
            .first_k_dense_replace = c.first_k_dense_replace,
            .num_hidden_layers = c.num_hidden_layers}));
  if (c.moe_router_activation_func != "sigmoid")
    return obj.field_error(
        "moe_router_activation_func",
        fmt::format("unsupported \"{}\" (supported: sigmoid)", c.moe_router_activation_func));
  if (c.hidden_act != "silu" && c.hidden_act != "situ")
    return obj.field_error("hidden_act",
                           fmt::format("unsupported \"{}\" (supported: silu, situ)", c.hidden_act));
  const auto& q = c.quantization_config;
  if (q.method != formats::QuantMethod::kNone &&
      q.method != formats::QuantMethod::kMxfp4CompressedTensors)
    return obj.field_error("quantization_config",
                           fmt::format("{} is not a kimi_linear format (supported: "
                                       "compressed-tensors mxfp4-pack-quantized or none)",
                                       q.describe()));
  if (q.method == formats::QuantMethod::kMxfp4CompressedTensors) {
    int64_t expert_in = c.routed_expert_hidden_size.value_or(c.hidden_size);
    if (expert_in % q.group_size != 0 || c.moe_intermediate_size % q.group_size != 0)
      return obj.field_error("quantization_config",
                             fmt::format("MXFP4 experts need in-dims divisible by {} (expert "
                                         "width {}, moe_intermediate_size {})",
                                         q.group_size, expert_in, c.moe_intermediate_size));
  }
  return Status::ok_status();
}

class KimiLinear final : public Architecture {
 public:
  KimiLinear(KimiLinearConfig config, std::string model_type, std::string prefix)
      : config_(std::move(config)),
        model_type_(std::move(model_type)),
        prefix_(std::move(prefix)) {}

  std::string_view recipe_name() const override {
    return config_.rope_dsa ? "dayzero_hybrid" : "kimi_linear";
  }
  const std::string& model_type() const override { return model_type_; }
  LayerSchedule schedule() const override { return kimi_linear_schedule(config_); }
  TensorTable tensor_table() const override { return kimi_linear_tensors(config_, prefix_); }
  const formats::QuantizationConfig& quantization() const override {
    return config_.quantization_config;
  }
  ModelDims dims() const override {
    const KimiLinearAttnConfig& kda = config_.linear_attn_config;
    ModelDims dims{
        .hidden_size = config_.hidden_size,
        .vocab_size = config_.vocab_size,
        .dense_intermediate_size = config_.intermediate_size,
        .mla_heads = config_.num_attention_heads,
        .kv_lora_rank = config_.kv_lora_rank,
        .qk_rope_head_dim = config_.qk_rope_head_dim,
        .mla_uses_rope = config_.rope_dsa.has_value(),
        .kda_heads = kda.num_heads,
        .kda_head_dim = kda.head_dim,
        .kda_conv_size = kda.short_conv_kernel_size,
        .num_routed_experts = config_.num_experts,
        .num_experts_per_token = config_.num_experts_per_token,
        .num_shared_experts = config_.num_shared_experts,
        .moe_intermediate_size = config_.moe_intermediate_size,
        .routed_hidden_size = config_.routed_expert_hidden_size.value_or(config_.hidden_size),
        .num_expert_groups = config_.use_grouped_topk ? config_.num_expert_group : 1,
        .topk_groups = config_.use_grouped_topk ? config_.topk_group : 1};
    if (config_.vision) dims.vision_layers = config_.vision->vt_num_hidden_layers;
    if (config_.rope_dsa) {
      dims.index_n_heads = config_.rope_dsa->index_n_heads;
      dims.index_head_dim = config_.rope_dsa->index_head_dim;
      dims.index_topk = config_.rope_dsa->index_topk;
    }
    return dims;
  }
  Result<std::unique_ptr<CausalLm>> load_model(std::unique_ptr<formats::Checkpoint> checkpoint,
                                               const ModelOptions& options) const override {
    return load_kimi_linear_model(config_, prefix_, std::move(checkpoint), options);
  }

 private:
  KimiLinearConfig config_;
  std::string model_type_;
  std::string prefix_;
};

}  // namespace

Result<KimiLinearConfig> parse_kimi_linear_config(const formats::ConfigObject& obj,
                                                  KimiMlaKind mla_kind) {
  KimiLinearConfig c;
  READ(required_positive_int, vocab_size);
  READ(required_positive_int, hidden_size);
  READ(required_positive_int, intermediate_size);
  READ(required_positive_int, num_hidden_layers);
  if (c.num_hidden_layers > kMaxLayers)
    return obj.field_error("num_hidden_layers",
                           fmt::format("{} exceeds the limit {}", c.num_hidden_layers, kMaxLayers));
  READ(required_positive_int, num_attention_heads);
  READ(optional_positive_int, q_lora_rank);
  READ(required_positive_int, kv_lora_rank);
  READ(required_positive_int, qk_nope_head_dim);
  READ(required_positive_int, qk_rope_head_dim);
  READ(required_positive_int, v_head_dim);
  if (mla_kind == KimiMlaKind::kNope) {
    READ(required_bool, mla_use_nope);
  } else {
    READ(optional_bool, mla_use_nope, false);
  }
  READ(optional_bool, mla_use_output_gate, false);
  READ(required_positive_int, num_experts);
  READ(required_positive_int, num_experts_per_token);
  READ(optional_non_negative_int, num_shared_experts, 0);
  READ(required_positive_int, moe_intermediate_size);
  READ(required_string, moe_router_activation_func);
  READ(optional_bool, moe_renormalize, true);
  READ(required_number, routed_scaling_factor);
  READ(optional_bool, use_grouped_topk, false);
  if (obj.has("num_expert_group")) {
    READ(required_positive_int, num_expert_group);
  }
  if (obj.has("topk_group")) {
    READ(required_positive_int, topk_group);
  }
  READ(required_non_negative_int, first_k_dense_replace);
  READ(required_positive_int, moe_layer_freq);
  READ(optional_positive_int, routed_expert_hidden_size);
  READ(optional_bool, latent_moe_use_norm, false);
  READ(required_string, hidden_act);
  if (c.hidden_act == "situ") {
    READ(required_number, activation_situ_beta);
    READ(required_number, activation_situ_linear_beta);
  }
  READ(optional_positive_int, attn_res_block_size);
  READ(required_number, rms_norm_eps);
  READ(optional_bool, tie_word_embeddings, false);
  READ(optional_non_negative_int, num_nextn_predict_layers, 0);
  if (mla_kind == KimiMlaKind::kNope && c.num_nextn_predict_layers != 0)
    return obj.field_error("num_nextn_predict_layers",
                           "MTP layers are not defined for kimi_linear");
  if (c.num_nextn_predict_layers > 1)
    return obj.field_error("num_nextn_predict_layers",
                           "dayzero_hybrid defines at most one MTP layer");
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject linear, obj.required_object("linear_attn_config"));
  DZ_ASSIGN_OR_RETURN(c.linear_attn_config, parse_linear_attn_config(linear, c.num_hidden_layers));
  DZ_ASSIGN_OR_RETURN(auto quant, obj.optional_object("quantization_config"));
  if (quant) {
    DZ_ASSIGN_OR_RETURN(c.quantization_config, formats::parse_quantization_config(*quant));
  }
  DZ_RETURN_IF_ERROR(check_contradictions(obj, c, mla_kind));
  if (mla_kind == KimiMlaKind::kRopeDsa) {
    DZ_ASSIGN_OR_RETURN(c.rope_dsa, parse_rope_dsa(obj, c));
  }
  return c;
}

#undef READ

LayerSchedule kimi_linear_schedule(const KimiLinearConfig& c) {
  auto ffn = [&c](int i) {
    if (i < c.first_k_dense_replace || i % c.moe_layer_freq != 0) return FfnKind::kDenseMlp;
    return c.routed_expert_hidden_size ? FfnKind::kLatentMoe : FfnKind::kMoe;
  };
  LayerSchedule schedule;
  const auto& kda = c.linear_attn_config.kda_layers;
  for (int i = 0; i < static_cast<int>(c.num_hidden_layers); ++i) {
    LayerSpec layer{
        .layer_id = i,
        .attention = std::binary_search(kda.begin(), kda.end(), i) ? AttentionKind::kKda
                     : c.rope_dsa                                  ? AttentionKind::kMlaDsa
                                                                   : AttentionKind::kMla,
        .ffn = ffn(i),
        .attn_res = c.attn_res_block_size.has_value(),
        .attn_res_write = c.attn_res_block_size && i % *c.attn_res_block_size == 0,
    };
    schedule.layers.push_back(layer);
  }
  for (int i = 0; i < static_cast<int>(c.num_nextn_predict_layers); ++i) {
    const int id = static_cast<int>(c.num_hidden_layers) + i;
    schedule.layers.push_back(LayerSpec{
        .layer_id = id, .attention = AttentionKind::kMlaDsa, .ffn = ffn(id), .is_mtp = true});
  }
  return schedule;
}

namespace {

Result<std::unique_ptr<Architecture>> make_kimi_linear(KimiLinearConfig config,
                                                       const RecipeInput& input) {
  return std::unique_ptr<Architecture>(
      std::make_unique<KimiLinear>(std::move(config), input.model_type, input.tensor_prefix));
}

}  // namespace

Result<std::unique_ptr<Architecture>> parse_kimi_linear(const RecipeInput& input) {
  DZ_ASSIGN_OR_RETURN(KimiLinearConfig config, parse_kimi_linear_config(input.text));
  // Kimi-Linear's modeling file builds kv_a_layernorm with its default 1e-6 (docs/models.md §2.5).
  config.kv_a_layernorm_eps = 1e-6;
  return make_kimi_linear(std::move(config), input);
}

Result<std::unique_ptr<Architecture>> parse_kimi_k3(const RecipeInput& input) {
  DZ_ASSIGN_OR_RETURN(KimiLinearConfig config, parse_kimi_linear_config(input.text));
  DZ_ASSIGN_OR_RETURN(std::optional<formats::ConfigObject> vision,
                      input.root.optional_object("vision_config"));
  if (vision) {
    DZ_ASSIGN_OR_RETURN(config.vision, parse_vision_config(*vision, config.hidden_size));
    DZ_ASSIGN_OR_RETURN(int64_t placeholder,
                        input.root.required_non_negative_int("media_placeholder_token_id"));
    if (placeholder >= config.vocab_size)
      return input.root.field_error(
          "media_placeholder_token_id",
          fmt::format("{} is outside the vocabulary of {}", placeholder, config.vocab_size));
    config.media_placeholder_token_id = static_cast<int32_t>(placeholder);
  }
  return make_kimi_linear(std::move(config), input);
}

Result<std::unique_ptr<Architecture>> parse_dayzero_hybrid(const RecipeInput& input) {
  DZ_ASSIGN_OR_RETURN(KimiLinearConfig config,
                      parse_kimi_linear_config(input.text, KimiMlaKind::kRopeDsa));
  return make_kimi_linear(std::move(config), input);
}

}  // namespace dz::model
