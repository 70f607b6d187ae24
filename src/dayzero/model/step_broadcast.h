#pragma once
// Every rank runs the same forward, rank 0 alone decides it (docs/parallel.md §7): rank 0 owns the
// scheduler, the block and state pools (the one global cache manager: block ids, reference counts,
// prefix hashes) and the sampler, and before each forward it broadcasts the step description (token
// ids, positions, slots, each sequence's block table and state slot, the logits rows) with the
// cache edits made since the last step. The other ranks keep only cache data, in a cache of the
// same geometry addressed by rank 0's block ids and slots.
//
// Rank 0 wraps its model in StepLeader, which any command or the engine drives as a CausalLm;
// every other rank calls follow_steps until rank 0's StepLeader is destroyed.
//
// With --ep > 1 the plan's ep TP groups are data-parallel: rank 0 puts each sequence in one group
// for its whole life (all sequences sharing its first cache block go with it, so prefix-cache hits
// and copies find their data), every group runs only its sequences (a group with none still takes
// part in the MoE exchanges), and the first rank of each group sends its logits rows to rank 0.

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "dayzero/dist/comm.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/model/parallel_plan.h"

namespace dz::model {

class StepLeader final : public CausalLm {
 public:
  // `model` is rank 0's shard; comm spans every rank of the plan.
  StepLeader(std::unique_ptr<CausalLm> model, dist::Comm& comm, const ParallelPlan& plan);
  // Tells the other ranks to stop following (they return from follow_steps).
  ~StepLeader() override;

  // This rank's shard, for reading its configuration (running it directly would leave the other
  // ranks behind).
  CausalLm& shard() { return *model_; }

  int64_t vocab_size() const override { return model_->vocab_size(); }
  int64_t hidden_size() const override { return model_->hidden_size(); }
  std::vector<LayerCacheSpec> cache_layers() const override { return model_->cache_layers(); }
  BlockShard cache_shard() const override { return model_->cache_shard(); }
  bool has_mtp() const override { return model_->has_mtp(); }
  // Rank 0 encodes the images; each step message carries their rows to the other ranks.
  const VisionEncoder* vision() const override { return model_->vision(); }
  bool takes_given_embeddings() const override { return model_->takes_given_embeddings(); }
  Status check_batch(const ForwardBatch& batch, const KvCache& cache) const override {
    return model_->check_batch(batch, cache);
  }
  const dist::CommStats* comm_stats() const override { return &comm_.stats(); }

  Status forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                 std::span<const int64_t> logits_rows, float* out_logits, TapSink* taps) override;
  Status forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                     std::span<const int64_t> logits_rows, float* out_logits,
                     TapSink* taps) override;
  Status forward_mtp_chain(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                           float* out_logits, TapSink* taps) override;
  void cache_created(KvCache& cache) override;
  // Made on every rank in the order given, when the next step (or cache) message goes out: under
  // context parallelism a copy between two ranks' blocks is a collective.
  void copy_block_rows(KvCache& cache, int32_t from_block, int32_t to_block,
                       int64_t num_rows) override;
  void copy_state_slot(KvCache& cache, int32_t from, int32_t to) override;

 private:
  // forward(), forward_mtp() or forward_mtp_chain() (kind, model/step_broadcast.cpp) on every
  // rank.
  Status step(int64_t kind, const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
              std::span<const int64_t> logits_rows, float* out_logits, TapSink* taps);
  // Broadcasts one step description: kind (model/step_broadcast.cpp), and what a forward needs.
  void send(int64_t kind, const KvCache* cache, const ForwardBatch* batch,
            std::span<const int64_t> logits_rows, std::span<const int64_t> groups = {});
  // The data-parallel group of each of the batch's sequences (--ep > 1).
  std::vector<int64_t> assign_groups(const ForwardBatch& batch, const KvCache& cache);

  std::unique_ptr<CausalLm> model_;
  dist::Comm& comm_;
  ParallelPlan plan_;
  // A sequence's group, keyed by its first cache block (or, without blocks, its state slot):
  // sticky for as long as the cache lives, so data written by one group is read by it.
  std::unordered_map<int64_t, int64_t> group_of_;
  uint64_t groups_cache_id_ = 0;
  int64_t next_group_ = 0;  // where the next tie between equally loaded groups goes
  // Queues a cache edit (its kind, from, to, rows) for the next message.
  void add_edit(KvCache& cache, int64_t kind, int32_t from, int32_t to, int64_t rows);

  std::vector<int64_t> pending_edits_;  // cache edits not yet sent, 4 numbers each
  KvCache* edited_cache_ = nullptr;     // the cache they edit
  std::vector<int64_t> message_;
};

// A rank other than 0: runs every step rank 0 sends through `model` (this rank's shard) on a cache
// of its own, until rank 0 says stop. Waits for a step without a deadline (a server may idle for
// hours); a collective inside a forward keeps its deadline.
void follow_steps(CausalLm& model, dist::Comm& comm, const ExecContext& ctx,
                  const ParallelPlan& plan);

}  // namespace dz::model
