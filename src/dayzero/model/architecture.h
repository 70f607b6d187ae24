#pragma once
// A parsed model config, as one recipe understands it (docs/style.md §2). The registry picks the
// recipe from model_type; the recipe parses its typed config (model/arch/<recipe>.h) and answers
// these questions from it. Nothing outside the recipe reads the config JSON.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/model/layer_schedule.h"
#include "dayzero/model/tensor_table.h"

namespace dz::formats {
class Checkpoint;
}  // namespace dz::formats

namespace dz::model {

// The most decoder layers (main + MTP) a config may declare: a sanity bound against hostile files.
inline constexpr int64_t kMaxLayers = 4096;

class CausalLm;
struct ModelOptions;

// What the registry hands a recipe.
struct RecipeInput {
  formats::ConfigObject root;  // the whole config.json
  formats::ConfigObject text;  // the decoder's fields: root, or root.text_config when nested
  std::string model_type;      // top-level model_type as written
  std::string tensor_prefix;   // prepended to every tensor name ("language_model." for kimi_k3)
};

// The sizes that planning reads (parallel plans, `dayzero analyze`), whatever the recipe. Zero
// where the model has no such part (no indexer: index_n_heads 0; no KDA: kda_heads 0).
struct ModelDims {
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t dense_intermediate_size = 0;  // dense MLP layers
  // MLA: heads and the cached latent (kv_lora_rank values, then qk_rope_head_dim rope values).
  int64_t mla_heads = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_rope_head_dim = 0;
  bool mla_cache_fp8 = false;  // the recipe's default latent cache: FP8 (DeepSeek) or BF16 (Kimi)
  bool mla_uses_rope = false;  // false: Kimi's NoPE MLA
  // DSA lightning indexer.
  int64_t index_n_heads = 0;
  int64_t index_head_dim = 0;
  int64_t index_topk = 0;
  int64_t index_kpool = 1;  // tokens pooled into one indexer key (GLM-5.3-Flash: 4)
  // KDA: heads of head_dim (d_k = d_v) and the short conv's width.
  int64_t kda_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t kda_conv_size = 0;
  // MoE. routed_hidden_size: the width routed experts take tokens at (hidden_size, or the latent
  // width of a latent MoE).
  int64_t num_routed_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t num_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  int64_t routed_hidden_size = 0;
  int64_t num_expert_groups = 1;
  int64_t topk_groups = 1;
  // A vision tower the engine runs (K3's MoonViT): its blocks; 0 without one.
  int64_t vision_layers = 0;
};

class Architecture {
 public:
  virtual ~Architecture() = default;

  // The recipe that parsed the config ("deepseek_v32", "kimi_linear").
  virtual std::string_view recipe_name() const = 0;
  // The top-level model_type ("kimi_k3" for a K3 checkpoint read by the kimi_linear recipe).
  virtual const std::string& model_type() const = 0;
  virtual LayerSchedule schedule() const = 0;
  // Every tensor the checkpoint must hold, and nothing else (apart from unchecked_prefixes()).
  virtual TensorTable tensor_table() const = 0;
  // Tensor-name prefixes whose tensors are accepted without a table (e.g. a vision tower whose
  // names are read from the checkpoint), with the component they are counted under.
  virtual std::vector<std::pair<std::string, Component>> unchecked_prefixes() const { return {}; }
  virtual const formats::QuantizationConfig& quantization() const = 0;
  virtual ModelDims dims() const = 0;
  // Operators and features the config uses that the engine does not build (item, why); empty for
  // every runnable recipe, listed by analysis-only readings (`dayzero analyze`).
  virtual std::vector<std::pair<std::string, std::string>> missing() const { return {}; }

  // Builds the runnable model from a checkpoint already checked against tensor_table(); the model
  // keeps the checkpoint (its embedding tables stay in the mapping). kUnsupported for recipes that
  // only parse and inspect so far.
  virtual Result<std::unique_ptr<CausalLm>> load_model(
      std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options) const;
};

}  // namespace dz::model
