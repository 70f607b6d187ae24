#pragma once
// Recipe for `deepseek_v32` (DeepSeek-V3.2 / V3.2-Exp, docs/models.md §7.1): MLA with YaRN RoPE and
// the DSA lightning indexer on every layer, dense SwiGLU then grouped-sigmoid MoE, FP8 128×128
// block weights, one MTP layer.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dayzero/core/status.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/model/architecture.h"

namespace dz::model {

// Field names and meanings as in config.json.
struct DeepseekV32Config {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;      // dense layers
  int64_t moe_intermediate_size = 0;  // one routed expert
  int64_t num_hidden_layers = 0;
  int64_t num_nextn_predict_layers = 0;  // MTP layers, indexed after the main ones
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;  // required: the indexer reads c_q
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t n_routed_experts = 0;
  int64_t n_shared_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t n_group = 0;
  int64_t topk_group = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  std::string topk_method;   // "noaux_tc"
  std::string scoring_func;  // "sigmoid"
  std::string hidden_act;    // "silu"
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  // Indexer RoPE layout: false = rotate-half, the published fix (docs/models.md §3.5); GLM-5 DSA
  // configs set true. Absent from DeepSeek's config.json.
  bool indexer_rope_interleave = false;
  int64_t max_position_embeddings = 0;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  std::optional<formats::RopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  formats::QuantizationConfig quantization_config;  // none or fp8 block
};

Result<DeepseekV32Config> parse_deepseek_v32_config(const formats::ConfigObject& config);
// Layers 0…L−1, then the MTP layers L…L+num_nextn_predict_layers−1.
LayerSchedule deepseek_v32_schedule(const DeepseekV32Config& config);
TensorTable deepseek_v32_tensors(const DeepseekV32Config& config, const std::string& prefix);

// The registry's entry point.
Result<std::unique_ptr<Architecture>> parse_deepseek_v32(const RecipeInput& input);

}  // namespace dz::model
