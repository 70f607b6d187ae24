#pragma once
// A HybridModel with random weights built from a small JSON config, no checkpoint file: the
// models the serving benchmarks (bench/batched_decode_bench.cpp, `dayzero bench`) decode, sized
// so their weights are well over the L3 (docs/performance.md). Any per-layer mix of MLA, MLA+DSA
// and KDA mixers with a dense or MoE FFN; BF16 or FP8-block weights, and MXFP4 routed experts.
//
// Random init (weights uniform with the standard deviation given): every linear gain²/in, so a
// projection keeps the RMS of its (normalised) input; the sublayer outputs (o_proj, down_proj) get
// gain 1/√(2·num_layers) so the residual stream stays O(1) through the stack; norms 1 + U(±0.1);
// the embedding table RMS 1. The same config and seed build the same model.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/hybrid_model.h"

namespace dz::model {

enum class SyntheticMixer { kMla, kMlaDsa, kKda };
enum class SyntheticFormat { kBf16, kFp8Block, kMxfp4 };  // kMxfp4: routed experts only

struct SyntheticMlaConfig {
  int64_t num_heads = 16;
  int64_t q_lora_rank = 1536;  // 0: q = Linear(x; q_proj)
  int64_t kv_lora_rank = 512;
  int64_t qk_nope_head_dim = 128;
  int64_t qk_rope_head_dim = 64;
  int64_t v_head_dim = 128;
};

struct SyntheticDsaConfig {  // the indexer of mla_dsa layers (needs q_lora_rank > 0)
  int64_t index_n_heads = 16;
  int64_t index_head_dim = 128;
  int64_t index_topk = 2048;
};

struct SyntheticKdaConfig {
  int64_t num_heads = 16;
  int64_t head_dim = 128;
  int64_t conv_width = 4;
  int64_t gate_rank = 128;  // f_a/f_b and g_a/g_b low-rank width
};

struct SyntheticFfnConfig {
  bool moe = false;                   // "kind": "dense" | "moe"
  int64_t intermediate_size = 0;      // dense layers (all of them, or the first first_dense_layers)
  int64_t first_dense_layers = 0;     // moe: layers [0, k) are dense (DeepSeek's first_k_dense)
  int64_t num_experts = 0;            // moe: routed experts
  int64_t num_experts_per_tok = 0;    // moe: top-k
  int64_t moe_intermediate_size = 0;  // moe: width of each routed and shared expert
  int64_t num_shared_experts = 0;     // moe: fused into one shared MLP of n · width
};

struct SyntheticModelConfig {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  std::vector<SyntheticMixer> mixer_pattern;  // repeated over the layers: layer i gets [i % n]
  SyntheticMlaConfig mla;
  SyntheticDsaConfig dsa;
  SyntheticKdaConfig kda;
  SyntheticFfnConfig ffn;
  SyntheticFormat weight_format = SyntheticFormat::kBf16;  // attention, dense, shared, lm_head
  SyntheticFormat expert_format = SyntheticFormat::kBf16;  // routed experts
  kernels::KvCacheDtype kv_cache_dtype = kernels::KvCacheDtype::kBf16;
  // What the MXFP4 weights multiply (not in the JSON: the bench command's --mxfp4-activations).
  kernels::Mxfp4Activations mxfp4_activations = kernels::Mxfp4Activations::kBf16;
  uint64_t seed = 1;

  SyntheticMixer mixer(int64_t layer) const {
    return mixer_pattern[static_cast<size_t>(layer) % mixer_pattern.size()];
  }
  bool is_moe_layer(int64_t layer) const { return ffn.moe && layer >= ffn.first_dense_layers; }
};

// Parses the JSON text of a config (schema: bench/configs/*.json; unknown keys are refused);
// errors name the field: `synthetic config: field "mla.kv_lora_rank": expected ...`.
Result<SyntheticModelConfig> parse_synthetic_config(std::string_view text);
Result<SyntheticModelConfig> load_synthetic_config(const std::string& path);
// The checks of parse_synthetic_config that relate fields (kInvalidArgument naming them), for
// configs built in code.
Status validate_synthetic_config(const SyntheticModelConfig& config);

// What one decode step reads, in the formats the engine keeps (MLA's absorbed W_UK/W_UV are BF16,
// the rest as stored): bytes independent of the batch (attention, dense FFNs, shared experts,
// routers, lm_head, norms) and the bytes of one routed expert. Embedding rows are not counted.
struct SyntheticWeightBytes {
  int64_t per_step_bytes = 0;    // read once per step whatever the batch
  int64_t per_expert_bytes = 0;  // one routed expert of one MoE layer
  int64_t num_moe_layers = 0;
  int64_t total_bytes = 0;  // everything the model holds (incl. the embedding)
  int64_t num_params = 0;   // all parameters (incl. the embedding)
  // Parameters a token multiplies with (2 FLOPs each): all but the embedding and the unrouted
  // experts; attention's context-dependent FLOPs not included.
  int64_t active_params = 0;
};
SyntheticWeightBytes synthetic_weight_bytes(const SyntheticModelConfig& config);

// Builds the model (validates the config first). Owns its embedding table.
Result<std::unique_ptr<HybridModel>> build_synthetic_model(const SyntheticModelConfig& config);

std::string_view synthetic_mixer_name(SyntheticMixer mixer);     // "mla", "mla_dsa", "kda"
std::string_view synthetic_format_name(SyntheticFormat format);  // "bf16", "fp8_block", "mxfp4"

}  // namespace dz::model
