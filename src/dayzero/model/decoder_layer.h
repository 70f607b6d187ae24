#pragma once
// One decoder layer as blocks (docs/models.md §7): a token mixer (MLA, MLA with the DSA indexer, or
// KDA) and an FFN (dense gated MLP, MoE, latent MoE), each behind its pre-norm. The residual
// around them (plain sum or AttnRes) belongs to the model that stacks the layers; a layer only
// turns a normalized input into a sublayer output. Recipes fill the blocks a layer has; nothing
// here knows an architecture.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"
#include "dayzero/dist/comm.h"
#include "dayzero/model/blocks/attn_res.h"
#include "dayzero/model/blocks/dsa_indexer.h"
#include "dayzero/model/blocks/kda.h"
#include "dayzero/model/blocks/mla.h"
#include "dayzero/model/blocks/moe.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/kv_cache.h"
#include "dayzero/model/layer_schedule.h"
#include "dayzero/model/mixer_seconds.h"
#include "dayzero/model/parallel_plan.h"
#include "dayzero/model/taps.h"
#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

// y = round_bf16(RMSNorm(x; weight, eps)) over num_rows rows of width dim (docs/models.md §1.1:
// FP32, rounded once); may alias.
void rms_norm_bf16(const ExecContext& ctx, const float* x, const std::vector<float>& weight,
                   float* y, int64_t num_rows, int64_t dim, float eps);

struct DecoderLayer {
  int layer_id = 0;
  int64_t hidden_size = 0;
  float norm_eps = 1e-6f;
  std::vector<float> input_layernorm;           // [d]
  std::vector<float> post_attention_layernorm;  // [d]

  // Token mixer: exactly one of mla (optionally with indexer) and kda.
  std::unique_ptr<MlaBlock> mla;
  std::unique_ptr<DsaIndexer> indexer;  // MLA+DSA
  std::unique_ptr<KdaBlock> kda;

  // FFN: exactly one of dense_mlp and moe.
  std::optional<MlpWeights> dense_mlp;
  MlpActivation dense_activation;
  std::unique_ptr<MoeBlock> moe;

  // AttnRes pseudo-queries folded with their norms (docs/models.md §5); empty without AttnRes.
  std::vector<float> attn_res_query;  // before the mixer
  std::vector<float> ffn_res_query;   // before the FFN
  bool attn_res_write = false;        // the running prefix joins the bank before the mixer

  // Tensor parallelism: the TP group whose partial mixer and FFN outputs are summed
  // (docs/parallel.md §1); null in one process and at tp = 1.
  dist::Comm* comm = nullptr;

  AttentionKind attention_kind() const;
  FfnKind ffn_kind() const;
  // What this layer caches per token, and its recurrent state (KDA).
  LayerCacheSpec cache_spec(kernels::KvCacheDtype kv_cache_dtype) const;
  // What attention() and ffn() take from `scratch` for a step of at most max_tokens tokens whose
  // sequences reach at most max_range cached positions.
  size_t scratch_bytes(const ExecContext& ctx, int64_t max_tokens, int64_t max_range) const;

  // normed [T, d] = round_bf16(input_layernorm(h)).
  void attention_norm(const ExecContext& ctx, const float* h, int64_t num_tokens,
                      float* normed) const;
  void ffn_norm(const ExecContext& ctx, const float* h, int64_t num_tokens, float* normed) const;

  // out [T, d] = the mixer's output (BF16-valued) for the normalized input; writes this layer's
  // cache records and recurrent state. Taps "attn_norm" is the caller's; the blocks tap theirs.
  void attention(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                 const float* normed, float* out, Arena& scratch, TapSink* taps) const;
  // out [T, d] = the FFN's output (BF16-valued); taps "ffn_out".
  void ffn(const ExecContext& ctx, const float* normed, int64_t num_tokens, float* out,
           Arena& scratch, TapSink* taps) const;
  // A step in which this rank's data-parallel group has no tokens (--ep > 1): the MoE still
  // runs its experts on the tokens other groups send it.
  void ffn_without_tokens(const ExecContext& ctx, Arena& scratch) const;

 private:
  // The mixer's partial o_proj output (this rank's heads) summed over `comm`, rounded to BF16.
  void sum_partial_output(float* out, int64_t num_tokens, TapSink* taps) const;
};

// What one decoder layer is made of: the recipe maps its config onto the blocks' configs; the
// blocks know their tensors.
struct DecoderLayerConfig {
  LayerSpec spec = {};
  int64_t hidden_size = 0;
  float norm_eps = 1e-6f;
  std::optional<MlaConfig> mla = {};             // kMla, kMlaDsa
  std::optional<DsaIndexerConfig> indexer = {};  // kMlaDsa
  std::optional<KdaConfig> kda = {};             // kKda
  int64_t dense_intermediate_size = 0;           // kDenseMlp
  MlpActivation dense_activation = {};
  std::optional<MoeConfig> moe = {};     // kMoe, kLatentMoe
  std::string_view moe_prefix = "mlp.";  // Kimi checkpoints: "block_sparse_moe."
};

// A layer's weights as read, before the blocks are built; a block the layer lacks stays empty.
struct DecoderLayerWeights {
  std::vector<float> input_layernorm;
  std::vector<float> post_attention_layernorm;
  AttnResQueryWeights attn_res;  // "self_attention_res"
  AttnResQueryWeights ffn_res;   // "mlp_res"
  MlaWeights mla;
  DsaIndexerWeights indexer;
  KdaWeights kda;
  MlpWeights dense_mlp;
  MoeWeights moe;
};

// "model.layers.<layer_id>.", under which every layer's tensors are published.
std::string decoder_layer_prefix(int layer_id);
// The layer's tensors under decoder_layer_prefix(): its two norms, AttnRes' pseudo-queries
// "self_attention_res" and "mlp_res", the mixer under "self_attn." (the indexer under
// "self_attn.indexer."), then the dense MLP under "mlp." or the MoE under moe_prefix.
void visit_decoder_layer_tensors(TensorVisitor& v, const DecoderLayerConfig& c,
                                 DecoderLayerWeights& w);
// The layer from the weights visit_decoder_layer_tensors loaded. Under a parallel plan (`shard`
// not whole) the blocks run this rank's heads and experts; the layer sums their partial outputs
// over `tp_comm` (its TP group, when tp > 1), and the MoE exchanges routed tokens over
// `expert_comm` (every rank, when ep > 1).
DecoderLayer make_decoder_layer(const DecoderLayerConfig& c, DecoderLayerWeights w,
                                const RankShard& shard = {}, dist::Comm* tp_comm = nullptr,
                                dist::Comm* expert_comm = nullptr);

}  // namespace dz::model
