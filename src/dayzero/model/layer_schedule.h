#pragma once
// What each decoder layer is made of, as a recipe reads it from the config: the token mixer
// (MLA, MLA with the DSA indexer, or KDA), the FFN (dense MLP, MoE, latent MoE), whether AttnRes
// replaces the residual sum, and which layers are MTP heads (docs/models.md §7).

#include <string>
#include <vector>

namespace dz::model {

enum class AttentionKind : unsigned char {
  kMla,     // latent attention (DeepSeek RoPE or Kimi NoPE; docs/models.md §2)
  kMlaDsa,  // MLA made sparse by the lightning indexer (docs/models.md §3)
  kKda,     // Kimi Delta Attention (docs/models.md §4)
};

enum class FfnKind : unsigned char {
  kDenseMlp,   // SwiGLU / SiTU MLP with intermediate_size
  kMoe,        // routed + shared experts at full width (docs/models.md §6.1, §6.2)
  kLatentMoe,  // routed experts in a latent width (docs/models.md §6.3)
};

struct LayerSpec {
  int layer_id = 0;  // 0-based; MTP layers follow the main layers (DeepSeek: 61)
  AttentionKind attention = AttentionKind::kMla;
  FfnKind ffn = FfnKind::kDenseMlp;
  bool attn_res = false;        // AttnRes mixes before both sublayers (docs/models.md §5)
  bool attn_res_write = false;  // this layer appends the running prefix to the bank
  bool is_mtp = false;          // a multi-token-prediction head, not part of the main stack
};

struct LayerSchedule {
  std::vector<LayerSpec> layers;  // main layers in order, then MTP layers

  int num_main_layers() const;
  int num_mtp_layers() const;
  int count(AttentionKind kind) const;  // main layers only
  int count(FfnKind kind) const;        // main layers only
};

std::string attention_kind_name(AttentionKind kind);  // "MLA", "MLA+DSA", "KDA"
std::string ffn_kind_name(FfnKind kind);              // "dense MLP", "MoE", "latent MoE"
// "KDA + dense MLP", "MLA + MoE + AttnRes (write)", "MTP: MLA+DSA + MoE".
std::string describe_layer(const LayerSpec& layer);
// Runs of consecutive layers with the same description: "0: KDA + dense MLP", "1-2: KDA + MoE".
std::vector<std::string> describe_schedule(const LayerSchedule& schedule);

}  // namespace dz::model
