#pragma once
// What the engine sees of a loaded model, whatever its architecture (docs/architecture.md, "Data
// through one engine step"): the caches it needs per layer, and one forward over a ForwardBatch
// that writes the batch's cache records and returns FP32 logits for the rows asked for.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/dist/comm.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/context_parallel.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/kv_cache.h"
#include "dayzero/model/parallel_plan.h"
#include "dayzero/model/taps.h"

namespace dz::model {

class VisionEncoder;

struct ModelOptions {
  // MLA latent cache storage; nullopt: the recipe's default (deepseek_v32 fp8, Kimi bf16).
  std::optional<kernels::KvCacheDtype> kv_cache_dtype;
  // What MXFP4 weights multiply: BF16 activations, or MXINT8 (an opt-in, docs/decisions.md).
  kernels::Mxfp4Activations mxfp4_activations = kernels::Mxfp4Activations::kBf16;
  // Multi-rank (docs/parallel.md): this rank's place in the plan and the communicator over the
  // plan's ranks; one process when comm is null.
  ParallelPlan plan = {};
  int rank = 0;
  dist::Comm* comm = nullptr;
  dist::Comm* tp_comm = nullptr;  // the rank's TP group; comm itself when ep = cp = 1
  dist::Comm* cp_comm = nullptr;  // the rank's CP group (the ranks of its TP index); cp > 1 only
  ContextLayout cp_layout = ContextLayout::kZigzag;

  // Where partial outputs are summed (the TP group; null unless tp > 1) and between which ranks
  // routed tokens travel (all of them; null unless ep > 1).
  dist::Comm* tp_group() const { return plan.tp > 1 ? tp_comm : nullptr; }
  dist::Comm* expert_group() const { return plan.ep > 1 ? comm : nullptr; }
  dist::Comm* cp_group() const { return plan.cp > 1 ? cp_comm : nullptr; }
};

class CausalLm {
 public:
  virtual ~CausalLm() = default;

  virtual int64_t vocab_size() const = 0;
  virtual int64_t hidden_size() const = 0;
  // One spec per layer id (MTP layers included), for KvCache::create.
  virtual std::vector<LayerCacheSpec> cache_layers() const = 0;
  // The blocks this rank's cache stores, for KvCache::create: a share under context parallelism
  // (docs/parallel.md §9.4), all of them otherwise.
  virtual BlockShard cache_shard() const { return {}; }

  // Runs every token of `batch` through the model: writes each token's cache records at
  // batch.slot_mapping (earlier positions must already be cached), and fills out_logits
  // [logits_rows.size(), vocab] with FP32 logits of the given rows (indices into the batch's
  // tokens). Refuses token ids outside the vocabulary and batches the cache cannot hold.
  virtual Status forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                         std::span<const int64_t> logits_rows, float* out_logits,
                         TapSink* taps) = 0;

  // What forward() refuses before it computes anything: token ids outside the vocabulary, and
  // positions, slots, block tables or state slots the cache cannot hold.
  virtual Status check_batch(const ForwardBatch& batch, const KvCache& cache) const {
    (void)batch;
    (void)cache;
    return Status::ok_status();
  }

  // Images (docs/vision.md): the processor and tower of a model that takes them; null otherwise.
  // Their embeddings enter forward() as the batch's given_embeddings.
  virtual const VisionEncoder* vision() const { return nullptr; }
  // Whether forward() takes given_embeddings (not yet under context parallelism).
  virtual bool takes_given_embeddings() const { return true; }

  // Multi-token prediction (DeepSeek MTP, docs/models.md §7.1): whether a head predicts token t+2.
  virtual bool has_mtp() const { return false; }
  // The MTP head after forward(): token i of `batch` is x_{t+1} for the last forward()'s token i,
  // at the same position t and slot (so at most as many tokens). It reads the main model's state
  // that forward() kept, writes the MTP layer's cache records, and fills out_logits
  // [logits_rows.size(), vocab] with the predictions of token t+2. kUnsupported without a head.
  virtual Status forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                             std::span<const int64_t> logits_rows, float* out_logits,
                             TapSink* taps);
  // The MTP head chained one position on (speculative decoding with more than one draft): token
  // i of `batch` (one token per sequence) is fed at the position after the one of the i-th
  // logits row of the last forward_mtp() or forward_mtp_chain(), and that row's MTP output
  // stands in for the main model's state. Writes the head's cache records at those positions and
  // fills out_logits [batch tokens, vocab]. kUnsupported without a head or where not built.
  virtual Status forward_mtp_chain(const ExecContext& ctx, const ForwardBatch& batch,
                                   KvCache& cache, float* out_logits, TapSink* taps);

  // What a model over several ranks exchanged so far, by layer and collective (rank 0's view);
  // null in one process.
  virtual const dist::CommStats* comm_stats() const { return nullptr; }

  // The engine made `cache` for this model: a model over several ranks makes one of the same
  // geometry on every rank now rather than at the first step (which would then wait for it).
  virtual void cache_created(KvCache& cache) { (void)cache; }

  // The cache edits the engine makes between forwards (copy-on-write of a shared partial block,
  // recurrent-state checkpoints), through the model so that a model over several ranks makes them
  // on every rank's cache (model/step_broadcast.h).
  virtual void copy_block_rows(KvCache& cache, int32_t from_block, int32_t to_block,
                               int64_t num_rows) {
    cache.copy_block_rows(from_block, to_block, num_rows);
  }
  virtual void copy_state_slot(KvCache& cache, int32_t from, int32_t to) {
    cache.copy_state_slot(from, to);
  }
};

// Reads DIR/config.json through the registry, opens and validates the checkpoint against the
// recipe's tensor table (the checks of `dayzero inspect`), and builds the recipe's model.
Result<std::unique_ptr<CausalLm>> load_causal_lm(const std::string& dir,
                                                 const ModelOptions& options);

}  // namespace dz::model
