#pragma once
// The runnable deepseek_v32 model (models.md §7.1): embedding, decoder layers of MLA + DSA indexer
// with a dense SwiGLU or grouped-sigmoid MoE FFN, final norm and lm_head, plus the MTP layer and
// its head. Blocks come from model/blocks; this file only composes them, in the numerics of
// notes/issue3.md (BF16-valued activations between blocks, FP32 residual adds rounded once).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/formats/checkpoint.h"
#include "dayzero/model/arch/deepseek_v32.h"
#include "dayzero/model/blocks/dsa_indexer.h"
#include "dayzero/model/blocks/mla.h"
#include "dayzero/model/blocks/moe.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/model/weight_loader.h"

namespace dz::model {

// Block configs derived from the model config (exposed for tests).
MlaConfig deepseek_v32_mla_config(const DeepseekV32Config& config);
DsaIndexerConfig deepseek_v32_indexer_config(const DeepseekV32Config& config);
MoeConfig deepseek_v32_moe_config(const DeepseekV32Config& config);

class DeepseekV32Model final : public CausalLm {
 public:
  // Loads every block from `checkpoint` (already validated against deepseek_v32_tensors).
  static Result<std::unique_ptr<DeepseekV32Model>> load(
      const DeepseekV32Config& config, const std::string& prefix,
      std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options);
  ~DeepseekV32Model() override;

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  std::vector<LayerCacheSpec> cache_layers() const override;
  Status forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                 std::span<const int64_t> logits_rows, float* out_logits, TapSink* taps) override;

  // The main stack without the head: hidden [num_tokens, d], the residual stream after the last
  // layer (before model.norm). forward() is this, final_norm() and lm_head on the asked rows.
  Status forward_hidden(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                        float* hidden, TapSink* taps);

  bool has_mtp() const override { return mtp_ != nullptr; }
  // mtp_logits() on the final-norm output that the last forward() kept.
  Status forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                     std::span<const int64_t> logits_rows, float* out_logits,
                     TapSink* taps) override;
  // MTP (models.md §7.1): row t predicts token t+2 from h_t and x_{t+1}:
  // z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]) through the MTP decoder layer (layer id
  // num_hidden_layers, with its own caches) at position t, then shared_head. `batch` carries the
  // tokens x_{t+1} at the positions t; main_final [num_tokens, d] is the main model's model.norm
  // output at t (what vLLM passes; pre- or post-norm is (unverified), models.md §9, and the
  // reference's default is post-norm). Taps under layer num_hidden_layers: the decoder layer's,
  // "mtp_input" (eh_proj output), "final_norm", "logits".
  Status mtp_logits(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                    const float* main_final, std::span<const int64_t> logits_rows,
                    float* out_logits, TapSink* taps);
  // out [num_tokens, d] = round_bf16(model.norm(hidden)).
  void final_norm(const ExecContext& ctx, const float* hidden, int64_t num_tokens,
                  float* out) const;

  const DeepseekV32Config& config() const { return config_; }

  // Operator-level verification (models.md §8.1, `dayzero verify`): main layer `layer_id`'s blocks,
  // to run them on the reference's inputs, and the block arena sized for `batch` (reset it before
  // each block).
  struct LayerBlocks {
    const MlaBlock* mla = nullptr;
    const DsaIndexer* indexer = nullptr;
    const MlpWeights* dense_mlp = nullptr;  // layers < first_k_dense_replace
    const MoeBlock* moe = nullptr;          // the others
  };
  LayerBlocks layer_blocks(int layer_id) const;
  Arena& block_scratch(const ExecContext& ctx, const ForwardBatch& batch);

 private:
  struct Layer;
  struct Mtp;

  DeepseekV32Model(DeepseekV32Config config, ModelOptions options,
                   std::unique_ptr<formats::Checkpoint> checkpoint);
  Result<std::unique_ptr<Layer>> load_layer(const WeightLoader& loader, int layer_id,
                                            bool is_moe) const;
  Status check_batch(const ForwardBatch& batch, const KvCache& cache) const;
  // x [T, d] in place: one decoder layer (attention and FFN sublayers with their residuals).
  void run_layer(const ExecContext& ctx, const Layer& layer, int layer_id,
                 const ForwardBatch& batch, KvCache& cache, float* x, TapSink* taps);
  // Sizes the block arena for this batch from the blocks' own bounds (reset before each block).
  void ensure_scratch(const ExecContext& ctx, const ForwardBatch& batch);

  DeepseekV32Config config_;
  ModelOptions options_;
  std::unique_ptr<formats::Checkpoint> checkpoint_;  // the embedding tables live in its mapping
  std::string prefix_;
  Embedding embed_tokens_;                      // [vocab, d]
  std::vector<float> final_norm_;               // [d]
  kernels::LinearWeight lm_head_;               // [vocab, d]
  std::vector<std::unique_ptr<Layer>> layers_;  // main layers
  std::unique_ptr<Mtp> mtp_;
  std::unique_ptr<Arena> scratch_;  // block scratch, grown for longer batches
  // The last forward()'s model.norm output [T, d] and positions, for forward_mtp (MTP only).
  std::vector<float> last_final_;
  std::vector<int32_t> last_positions_;
};

}  // namespace dz::model
