#pragma once
// The generic decoder every recipe composes (docs/models.md §7): token embedding, a stack of
// DecoderLayers (any mix of MLA, MLA+DSA and KDA mixers with dense, MoE or latent-MoE FFNs), the
// residual as a plain sum or as block AttnRes (§5), final norm and lm_head. A new hybrid is a
// recipe that fills HybridModelParts, not new forward code.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/formats/checkpoint.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/model/context_parallel.h"
#include "dayzero/model/decoder_layer.h"
#include "dayzero/model/mtp_layer.h"
#include "dayzero/model/vision/vision_encoder.h"
#include "dayzero/model/weight_loader.h"

namespace dz::model {

struct HybridModelParts {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  float final_norm_eps = 1e-6f;
  float attn_res_eps = 1e-6f;  // AttnRes score norm (docs/models.md §5: rms_norm_eps, (unverified))
  kernels::KvCacheDtype kv_cache_dtype = kernels::KvCacheDtype::kBf16;
  std::unique_ptr<formats::Checkpoint> checkpoint;  // the embedding table lives in its mapping
  Embedding embed_tokens;                           // [vocab, d]
  std::vector<float> final_norm;                    // [d]
  kernels::LinearWeight lm_head;                    // [vocab, d]
  std::vector<DecoderLayer> layers;                 // main layers, in order
  std::unique_ptr<MtpLayer> mtp;                    // null without an MTP head
  std::unique_ptr<VisionEncoder> vision;            // null without a vision tower
  // AttnRes: the final mix's folded query [d]; empty without AttnRes. With it every layer must
  // carry its two queries.
  std::vector<float> final_attn_res_query;
  // Tensor parallelism: the TP group's ranks, over which the vocabulary-split embedding rows are
  // summed and the head's logit columns gathered; null in one process.
  dist::Comm* comm = nullptr;
  // Context parallelism (docs/parallel.md §9): the CP group that shares each step's long
  // sequences, and how they are cut; null in one process and at cp = 1.
  dist::Comm* cp_comm = nullptr;
  ContextLayout cp_layout = ContextLayout::kZigzag;
};

// The tensors every model has, under the recipe's prefix: the embedding
// "model.embed_tokens.weight" [vocab, d] and the head "lm_head" [vocab, d], both split by
// vocabulary (the head is the embedding table itself when tied), and the final norm
// "model.norm.weight" [d].
void visit_model_globals(TensorVisitor& v, int64_t vocab_size, int64_t hidden_size,
                         bool tie_word_embeddings, HybridModelParts& parts);

class HybridModel : public CausalLm {
 public:
  // Checks the parts fit together (DZ_CHECK: the recipe built them from a validated checkpoint).
  explicit HybridModel(HybridModelParts parts);
  ~HybridModel() override;

  int64_t vocab_size() const override { return parts_.vocab_size; }
  int64_t hidden_size() const override { return parts_.hidden_size; }
  const VisionEncoder* vision() const override { return parts_.vision.get(); }
  bool takes_given_embeddings() const override { return !context_parallel(); }
  std::vector<LayerCacheSpec> cache_layers() const override;
  // Under context parallelism each CP rank stores the blocks b with b % C == its CP rank.
  BlockShard cache_shard() const override;
  // Under context parallelism a copy between two CP ranks' blocks sends the rows from one to the
  // other (a broadcast in the CP group); every CP rank must call it in the same order.
  void copy_block_rows(KvCache& cache, int32_t from_block, int32_t to_block,
                       int64_t num_rows) override;
  Status forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                 std::span<const int64_t> logits_rows, float* out_logits, TapSink* taps) override;

  // The MTP head (model/hybrid_model_mtp.cpp). forward() keeps every token's final-norm row for
  // it; under context parallelism each rank keeps its own rows and the step, and the first
  // forward_mtp() after it gathers the whole step's rows (a model whose head is not used sends
  // nothing more). The MTP batch is split like any step (its pieces need not be the last
  // forward's). Chaining keeps the MTP output rows of
  // the last call's logits rows; not under context parallelism (kUnsupported).
  bool has_mtp() const override { return parts_.mtp != nullptr; }
  Status forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                     std::span<const int64_t> logits_rows, float* out_logits,
                     TapSink* taps) override;
  Status forward_mtp_chain(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                           float* out_logits, TapSink* taps) override;
  // The MTP logits of `batch` (tokens x_{t+1} at the positions t) with main_final [T, d] the main
  // model's model.norm output at t (what vLLM passes; pre- or post-norm is (unverified) for
  // DeepSeek, docs/models.md §9). Taps under the MTP layer's id: its decoder layer's,
  // "mtp_input" (eh_proj output), "final_norm", "logits".
  Status mtp_logits(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                    const float* main_final, std::span<const int64_t> logits_rows,
                    float* out_logits, TapSink* taps);

  // The stack without the head: out [T, d] = the hidden state that model.norm reads (the
  // residual stream after the last layer, or the final AttnRes mix). forward() is this,
  // final_norm() and lm_head() on the asked rows.
  Status forward_hidden(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                        float* out, TapSink* taps);
  // out [T, d] = round_bf16(model.norm(hidden)); may alias.
  void final_norm(const ExecContext& ctx, const float* hidden, int64_t num_tokens,
                  float* out) const;
  // logits [rows.size(), vocab] of the final-norm rows picked from normed [T, d].
  void lm_head(const ExecContext& ctx, const float* normed, std::span<const int64_t> rows,
               float* logits) const;
  // Batch checks of forward(): ids in the vocabulary, positions, slots, block tables, state slots.
  Status check_batch(const ForwardBatch& batch, const KvCache& cache) const override;

  // Whether forward() shares its steps with a CP group.
  bool context_parallel() const { return parts_.cp_comm != nullptr && parts_.cp_comm->size() > 1; }
  // This rank's part of `batch` as forward() cuts it under context parallelism (null otherwise):
  // for running single blocks on it (operator-level verification).
  std::unique_ptr<ContextSplit> split_step(const ForwardBatch& batch) const {
    if (!context_parallel()) return nullptr;
    return std::make_unique<ContextSplit>(batch, *parts_.cp_comm, parts_.cp_layout);
  }
  int num_layers() const { return static_cast<int>(parts_.layers.size()); }
  const DecoderLayer& layer(int layer_id) const;
  bool has_attn_res() const { return !parts_.final_attn_res_query.empty(); }
  const Embedding& embed_tokens() const { return parts_.embed_tokens; }
  kernels::KvCacheDtype kv_cache_dtype() const { return parts_.kv_cache_dtype; }
  // The block arena sized for `batch` (operator-level verification resets it before each block).
  Arena& block_scratch(const ExecContext& ctx, const ForwardBatch& batch);

 private:
  // Runs the MTP decoder layer on x [T, d] with the plain residual, in place. With no tokens
  // (this rank's data-parallel group has none this step) only its MoE exchange runs.
  void run_mtp_layer(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache, float* x,
                     TapSink* taps);
  // z [T, d]: the MTP decoder layer's output for `batch` (a checked batch with tokens).
  std::vector<float> mtp_hidden(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                                const float* main_final, TapSink* taps);
  // out_logits [num_rows, vocab] from z rows [num_rows, d]: shared_head norm, then the head.
  void mtp_head(const ExecContext& ctx, std::vector<float> rows, int64_t num_rows,
                float* out_logits, TapSink* taps) const;
  // out [ids, d] = the rows of `table` (split by vocabulary under a plan: summed over the TP
  // group).
  void embed(const Embedding& table, std::span<const int32_t> ids, float* out) const;
  // logits [num_rows, vocab] = head · normed [num_rows, d] (split by vocabulary under a plan: the
  // TP group's columns gathered).
  void head_logits(const ExecContext& ctx, const kernels::LinearWeight& head, const float* normed,
                   int64_t num_rows, float* logits) const;
  void ensure_scratch(const ExecContext& ctx, const ForwardBatch& batch);
  // forward() under context parallelism: this rank's part of the step (ContextSplit), then the
  // final-norm rows asked for gathered from the ranks that ran them. Taps see the layers' values
  // of this rank's tokens only.
  Status forward_context_parallel(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                                  std::span<const int64_t> logits_rows, float* out_logits,
                                  TapSink* taps);
  // forward_hidden() of a checked batch (a CP rank's local part, whose pieces share slots).
  void run_layers(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache, float* out,
                  TapSink* taps);
  void run_plain(const ExecContext& ctx, const DecoderLayer& layer, const ForwardBatch& batch,
                 KvCache& cache, float* x, TapSink* taps);

  // Under context parallelism with an MTP layer: the last forward()'s step, owned (its split
  // refers to it), and this rank's final-norm rows of it, until forward_mtp() gathers them.
  struct KeptStep;
  // The MTP step's rows: last_final_ once the kept step's rows are gathered.
  const std::vector<float>& gathered_final();

  HybridModelParts parts_;
  // MTP only: the last forward()'s model.norm output [T, d] (every token's) and positions, and the
  // MTP output rows [rows, d] of the last MTP call's logits rows.
  std::unique_ptr<KeptStep> kept_step_;
  std::vector<float> last_final_;
  std::vector<int32_t> last_positions_;
  std::vector<float> last_mtp_rows_;
  std::unique_ptr<Arena> scratch_;
  bool has_recurrent_state_ = false;
};

}  // namespace dz::model
