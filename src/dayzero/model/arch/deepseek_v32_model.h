#pragma once
// The runnable deepseek_v32 model (docs/models.md §7.1): a HybridModel of MLA + DSA-indexer layers
// with dense SwiGLU or grouped-sigmoid MoE FFNs, plus the MTP layer and its head, which only
// DeepSeek has. Blocks come from model/blocks, the forward from HybridModel, in the numerics of
// docs/models.md §0 (BF16-valued activations between blocks, FP32 residual adds rounded once).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dayzero/formats/checkpoint.h"
#include "dayzero/model/arch/deepseek_v32.h"
#include "dayzero/model/blocks/dsa_indexer.h"
#include "dayzero/model/blocks/mla.h"
#include "dayzero/model/blocks/moe.h"
#include "dayzero/model/hybrid_model.h"
#include "dayzero/model/weight_loader.h"

namespace dz::model {

// Block configs derived from the model config (exposed for tests).
MlaConfig deepseek_v32_mla_config(const DeepseekV32Config& config);
DsaIndexerConfig deepseek_v32_indexer_config(const DeepseekV32Config& config);
MoeConfig deepseek_v32_moe_config(const DeepseekV32Config& config);

class DeepseekV32Model final : public HybridModel {
 public:
  // Loads every block from `checkpoint` (already validated against deepseek_v32_tensors) and the
  // first MTP layer, the only one run.
  static Result<std::unique_ptr<DeepseekV32Model>> load(
      const DeepseekV32Config& config, const std::string& prefix,
      std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options);
  ~DeepseekV32Model() override;

  bool has_mtp() const override { return mtp_ != nullptr; }
  // mtp_logits() on the final-norm output that the last forward() kept. Under context
  // parallelism the MTP batch is split like any step (its pieces need not be the last forward's:
  // the kept rows are the whole step's).
  // Chaining keeps the MTP output rows of the last call's logits rows; not under context
  // parallelism (kUnsupported).
  Status forward_mtp_chain(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                           float* out_logits, TapSink* taps) override;
  Status forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                     std::span<const int64_t> logits_rows, float* out_logits,
                     TapSink* taps) override;
  // MTP (docs/models.md §7.1): row t predicts token t+2 from h_t and x_{t+1}:
  // z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]) through the MTP decoder layer (layer id
  // num_hidden_layers, with its own caches) at position t, then shared_head. `batch` carries the
  // tokens x_{t+1} at the positions t; main_final [num_tokens, d] is the main model's model.norm
  // output at t (what vLLM passes; pre- or post-norm is (unverified), docs/models.md §9, and the
  // reference's default is post-norm). Taps under layer num_hidden_layers: the decoder layer's,
  // "mtp_input" (eh_proj output), "final_norm", "logits".
  Status mtp_logits(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                    const float* main_final, std::span<const int64_t> logits_rows,
                    float* out_logits, TapSink* taps);

  const DeepseekV32Config& config() const { return config_; }

  // The MTP layer's own tensors beside its decoder layer (defined in the .cpp).
  struct Mtp;

 private:
  DeepseekV32Model(HybridModelParts parts, DeepseekV32Config config);
  bool keeps_final_norm() const override { return mtp_ != nullptr; }
  void keep_final_norm(const ForwardBatch& batch, std::vector<float>& normed) override;
  // z [T, d]: the MTP decoder layer's output for `batch` (a checked batch with tokens).
  std::vector<float> mtp_hidden(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                                const float* main_final, TapSink* taps);
  // out_logits [num_rows, vocab] from z rows [num_rows, d]: shared_head norm, then the head.
  void mtp_head(const ExecContext& ctx, std::vector<float> rows, int64_t num_rows,
                float* out_logits, TapSink* taps) const;

  DeepseekV32Config config_;
  std::unique_ptr<Mtp> mtp_;
  // The last forward()'s model.norm output [T, d] and positions, for forward_mtp (MTP only).
  std::vector<float> last_final_;
  // The MTP layer's output rows [rows, d] of the last MTP call's logits rows (chaining).
  std::vector<float> last_mtp_rows_;
  std::vector<int32_t> last_positions_;
};

}  // namespace dz::model
