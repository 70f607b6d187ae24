#pragma once
// The continuous-batching scheduler of docs/serving.md §2.1–§2.3. Each step spends a token budget
// on the running requests first (in (priority, arrival) order; chunked prefill clips a chunk to the
// budget and to long_prefill_threshold), preempting by recompute when blocks run out (victim =
// lowest priority, then newest), then, in a step without preemption, admits waiting requests from
// a heap on (priority, arrival) with a prefix-cache lookup, stopping at the first one that cannot
// get its blocks while keeping the emergency reserve. After the forward pass, advance() moves
// num_computed_tokens and lets the cache register what the step computed. The choices of an n > 1
// request wait until the first one's prompt is computed, then fork from it (fork_pending). Every
// question about blocks, slots and the prefix index goes to cache::CacheCoordinator; this class
// keeps the queues. Owns the requests; single-threaded.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dayzero/cache/cache_coordinator.h"
#include "dayzero/core/status.h"
#include "dayzero/runtime/encoder_cache.h"
#include "dayzero/runtime/request.h"

namespace dz::runtime {

struct SchedulerConfig {
  int64_t max_num_seqs = 32;
  int64_t max_num_batched_tokens = 512;
  int64_t long_prefill_threshold = 256;  // resolved (> 0)
  int64_t max_long_partial_prefills = 1;
  int64_t max_model_len = 4096;
  // Slots held past a chunk's last token: the chained MTP head writes its record there.
  int64_t num_lookahead_slots = 0;
  // Image tokens encoded per step (resolved, >= every image's tokens); images already in the
  // encoder cache cost nothing.
  int64_t max_num_encoder_tokens = 0;
};

struct ScheduledChunk {
  Request* request = nullptr;
  int64_t num_tokens = 0;  // tokens [num_computed_tokens, num_computed_tokens + num_tokens)
};

struct SchedulerOutput {
  std::vector<ScheduledChunk> chunks;  // in scheduling order (running first, then admitted)
  std::vector<int64_t> preempted_ids;
  std::vector<int64_t> admitted_ids;
  int64_t num_scheduled_tokens = 0;
};

struct SchedulerCounters {
  int64_t prefix_query_tokens = 0;  // tokens of admitted requests looked up
  int64_t prefix_hit_tokens = 0;    // of those, served by the prefix cache
  int64_t prompt_tokens = 0;        // prompt tokens of first admissions and of forks
  int64_t num_preemptions = 0;
};

class Scheduler {
 public:
  // cache (and encoder_cache, given for a model that takes images) must outlive the scheduler.
  Scheduler(SchedulerConfig config, cache::CacheCoordinator& cache,
            const EncoderCache* encoder_cache = nullptr);

  const SchedulerConfig& config() const { return config_; }

  // Queues a new request (the caller validated it) behind the waiting ones of its priority.
  Request& add(std::unique_ptr<Request> request);
  // Adds another choice of `parent` (just added, same prompt): it waits until parent's prompt is
  // computed, then forks from it (or, without room for a fork then, queues as a request of its
  // own).
  Request& add_fork(std::unique_ptr<Request> request, Request& parent);
  Request* find(int64_t request_id);
  const Request* find(int64_t request_id) const;

  SchedulerOutput schedule();
  // After a successful forward pass of `output`: num_computed_tokens += scheduled, newly full
  // blocks registered, state checkpoints saved; chunks with drafts wait for commit_verified().
  void advance(const SchedulerOutput& output);
  // After the verification of a chunk with drafts, which advance() skips: the request has computed
  // num_computed_tokens (its accepted drafts included; after a recurrent-state rollback, the
  // chunk's start), its drafts are cleared, the blocks past its tokens are freed and the newly
  // full blocks of committed tokens registered.
  // `snapshots`: the row's kept states, for the checkpoint of a block boundary inside it.
  void commit_verified(Request& r, int64_t num_computed_tokens,
                       const cache::StateSnapshots& snapshots = {});
  // After advance(), for a request whose prompt is now computed for the first time: its pending
  // choices that could fork (blocks shared, partial block and state copied) now run with the
  // prompt computed and sample from the same logits; the others queue as requests of their own.
  // Returns the forked ones.
  std::vector<Request*> fork_pending(Request& parent);
  // Frees the request's blocks and live slot and forgets it (finished, failed or aborted); its
  // pending choices queue as requests of their own.
  void finish(int64_t request_id);

  // Waiting or pending a fork.
  int64_t num_waiting() const { return static_cast<int64_t>(requests_.size() - running_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const std::vector<Request*>& running() const { return running_; }
  const SchedulerCounters& counters() const { return counters_; }

  // The cache's invariants over every running request's holdings, plus the scheduler's own: a
  // running request's table covers its computed tokens, a waiting one holds nothing.
  // kInternal naming the first violation.
  Status check_invariants() const;

 private:
  void push_waiting(Request* r);
  Request* pop_waiting();
  void insert_running(Request* r);
  void remove_running(Request* r);
  void preempt(Request* r);
  void queue_pending_forks(Request& parent);
  // Clips a chunk of n tokens starting at position `from` of r to the budget rules.
  int64_t clip_chunk(const Request& r, int64_t from, int64_t n) const;
  // The images this step encodes so far, against max_num_encoder_tokens.
  struct EncoderBudget {
    int64_t tokens = 0;
    std::vector<cache::BlockHash> hashes;
  };
  // Clips the chunk to stop before the first image it reaches that is neither in the encoder
  // cache nor already in this step and does not fit the rest of the budget, which it spends on
  // those that fit (docs/vision.md §4). 0 when the chunk starts inside such an image.
  int64_t clip_to_encoder_budget(const Request& r, int64_t from, int64_t n,
                                 EncoderBudget& budget) const;

  SchedulerConfig config_;
  cache::CacheCoordinator& cache_;
  const EncoderCache* encoder_cache_;

  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> waiting_;  // heap on (priority, arrival_seq); front = next
  std::vector<Request*> running_;  // sorted by (priority, arrival_seq)
  uint64_t next_arrival_seq_ = 0;
  SchedulerCounters counters_;
};

}  // namespace dz::runtime
