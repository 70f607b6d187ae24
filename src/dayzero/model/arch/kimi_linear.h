#pragma once
// Recipe for `kimi_linear` (Kimi-Linear-48B-A3B, docs/models.md §7.2) and, through the nested
// text_config, `kimi_k3` (docs/models.md §7.3). K3's features are switched on by fields, never
// guessed from dimensions: q_lora_rank (q LoRA in MLA), mla_use_output_gate (gated MLA),
// linear_attn_config.use_full_rank_gate / gate_lower_bound (KDA output gate, bounded decay),
// attn_res_block_size (AttnRes), routed_expert_hidden_size (latent MoE), hidden_act "situ".
// The same recipe reads `dayzero_hybrid` (docs/recipe_dayzero_hybrid.md): a flat Kimi config whose
// full_attn_layers are DeepSeek-V3.2 MLA with RoPE and the DSA lightning indexer (`rope_dsa`).

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/model/vision/vision_config.h"
#include "dayzero/model/architecture.h"

namespace dz::model {

// linear_attn_config. The layer lists are 1-based in the file and 0-based here.
struct KimiLinearAttnConfig {
  std::vector<int> kda_layers;        // sorted, 0-based
  std::vector<int> full_attn_layers;  // sorted, 0-based (MLA layers)
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t short_conv_kernel_size = 0;
  bool use_full_rank_gate = false;         // g_proj [H·d, hidden] instead of g_a/g_b
  std::optional<double> gate_lower_bound;  // set: bounded "safe" gate (docs/models.md §4.2)
};

// dayzero_hybrid only: the MLA layers rotate the rope part (interleaved, plain frequencies
// rope_theta^(−2i/d_r)) and are made sparse by the DSA indexer (docs/models.md §3).
struct RopeDsaConfig {
  double rope_theta = 10000.0;
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  bool indexer_rope_interleave =
      false;  // false: rotate-half, as DeepSeek-V3.2 (docs/models.md §3.5)
};

struct KimiLinearConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // dense layers
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  std::optional<int64_t> q_lora_rank;  // null in Kimi-Linear, 1536 in K3
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool mla_use_nope = false;  // must be true for Kimi (NoPE MLA), absent or false with rope_dsa
  bool mla_use_output_gate = false;
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t num_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  std::string moe_router_activation_func;  // "sigmoid"
  bool moe_renormalize = true;
  double routed_scaling_factor = 1.0;
  bool use_grouped_topk = false;
  int64_t num_expert_group = 1;
  int64_t topk_group = 1;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  std::optional<int64_t> routed_expert_hidden_size;  // latent MoE width (K3)
  bool latent_moe_use_norm = false;
  std::string hidden_act;                      // "silu" or "situ"
  double activation_situ_beta = 0.0;           // situ only
  double activation_situ_linear_beta = 0.0;    // situ only
  std::optional<int64_t> attn_res_block_size;  // AttnRes (K3)
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  // dayzero_hybrid only: 1 adds an MTP layer (model/mtp_layer.h) as layer num_hidden_layers, MLA
  // with the indexer and the FFN the schedule's rule gives that index, without AttnRes.
  int64_t num_nextn_predict_layers = 0;
  KimiLinearAttnConfig linear_attn_config;
  formats::QuantizationConfig quantization_config;  // none or compressed-tensors MXFP4 experts
  std::optional<RopeDsaConfig> rope_dsa;            // set for dayzero_hybrid
  // ε of the MLA kv_a_layernorm when it is not rms_norm_eps; set by the registry's entry point,
  // not read from the file (parse_kimi_linear: 1e-6).
  std::optional<double> kv_a_layernorm_eps;
  // kimi_k3 with a vision tower (top-level vision_config) and the token whose positions its
  // embeddings fill (media_placeholder_token_id); set by parse_kimi_k3.
  std::optional<VisionConfig> vision;
  int32_t media_placeholder_token_id = -1;
};

// Which MLA the parser accepts: Kimi's NoPE MLA, or (dayzero_hybrid) RoPE MLA with the indexer,
// which also requires q_lora_rank and reads RopeDsaConfig's fields.
enum class KimiMlaKind : unsigned char { kNope, kRopeDsa };

// `config` is the decoder's object (the top level for kimi_linear, text_config for kimi_k3).
Result<KimiLinearConfig> parse_kimi_linear_config(const formats::ConfigObject& config,
                                                  KimiMlaKind mla_kind = KimiMlaKind::kNope);
LayerSchedule kimi_linear_schedule(const KimiLinearConfig& config);
TensorTable kimi_linear_tensors(const KimiLinearConfig& config, const std::string& prefix);

// The runnable model (a HybridModel) from a checkpoint already checked against
// kimi_linear_tensors. The KV cache defaults to BF16; FP8 needs kv_lora_rank % 128 == 0.
Result<std::unique_ptr<CausalLm>> load_kimi_linear_model(
    const KimiLinearConfig& config, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options);

// The registry's entry points: kimi_linear, kimi_k3 (its text_config), dayzero_hybrid.
Result<std::unique_ptr<Architecture>> parse_kimi_linear(const RecipeInput& input);
Result<std::unique_ptr<Architecture>> parse_kimi_k3(const RecipeInput& input);
Result<std::unique_ptr<Architecture>> parse_dayzero_hybrid(const RecipeInput& input);

}  // namespace dz::model
