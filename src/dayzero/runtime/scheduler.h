#pragma once
// The continuous-batching scheduler of serving.md §2.1–§2.3. Each step spends a token budget on the
// running requests first (in (priority, arrival) order; chunked prefill clips a chunk to the
// budget and to long_prefill_threshold), preempting by recompute when blocks run out (victim =
// lowest priority, then newest), then, in a step without preemption, admits waiting requests from
// a heap on (priority, arrival) with a prefix-cache lookup, stopping at the first one that cannot
// get its blocks while keeping the emergency reserve. After the forward pass, advance() moves
// num_computed_tokens, registers newly full blocks in the prefix index and saves recurrent-state
// checkpoints (hybrid models) at the positions the chunks were clipped to end at.
// Owns the requests; single-threaded.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dayzero/cache/block_pool.h"
#include "dayzero/cache/prefix_hash.h"
#include "dayzero/cache/state_pool.h"
#include "dayzero/core/status.h"
#include "dayzero/runtime/request.h"

namespace dz::runtime {

struct SchedulerConfig {
  int64_t max_num_seqs = 32;
  int64_t max_num_batched_tokens = 512;
  int64_t long_prefill_threshold = 256;  // resolved (> 0)
  int64_t max_long_partial_prefills = 1;
  int64_t max_model_len = 4096;
  bool enable_prefix_caching = true;
  // Hybrid models: checkpoints every interval tokens (a multiple of the block size), at the last
  // block boundary ≤ the prompt, and one rolling checkpoint while decoding.
  int64_t state_checkpoint_interval = 1024;
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
  int64_t prompt_tokens = 0;        // prompt tokens of first admissions
  int64_t num_preemptions = 0;
};

class Scheduler {
 public:
  // states is null for models without recurrent layers. seed starts every request's hash chain;
  // cache_format goes into every block's extra keys.
  Scheduler(SchedulerConfig config, cache::BlockPool& blocks, cache::StatePool* states,
            cache::BlockHash seed, std::string cache_format);

  const SchedulerConfig& config() const { return config_; }
  bool prefix_caching() const { return prefix_caching_; }

  // Queues a new request (the caller validated it) behind the waiting ones of its priority.
  Request& add(std::unique_ptr<Request> request);
  Request* find(int64_t request_id);
  const Request* find(int64_t request_id) const;

  SchedulerOutput schedule();
  // After a successful forward pass of `output`: num_computed_tokens += scheduled, newly full
  // blocks registered, state checkpoints saved.
  void advance(const SchedulerOutput& output);
  // Frees the request's blocks and live slot and forgets it (finished, failed or aborted).
  void finish(int64_t request_id);

  int64_t num_waiting() const { return static_cast<int64_t>(waiting_.size()); }
  int64_t num_running() const { return static_cast<int64_t>(running_.size()); }
  const std::vector<Request*>& running() const { return running_; }
  const SchedulerCounters& counters() const { return counters_; }

  // BlockPool and StatePool invariants over every running request's table and slot, plus the
  // scheduler's own: a running request's table covers its computed tokens, a waiting one holds
  // nothing. kInternal naming the first violation.
  Status check_invariants() const;

  // The first checkpoint position > from of r (multiples of the interval, the last block
  // boundary ≤ the prompt); INT64_MAX when none or when the model has no recurrent state.
  int64_t next_checkpoint(const Request& r, int64_t from) const;

 private:
  struct Admission {
    int64_t hit_blocks = 0;
    std::optional<cache::BlockHash> checkpoint;  // hybrid: the checkpoint to restore
  };

  void push_waiting(Request* r);
  Request* pop_waiting();
  void insert_running(Request* r);
  void remove_running(Request* r);
  void preempt(Request* r);
  void release_resources(Request& r);
  // Extends r.block_hashes to every full block of r.tokens.
  void update_block_hashes(Request& r);
  Admission find_prefix_hit(Request& r);
  // Clips a chunk of n tokens starting at r's computed tokens to the budget rules.
  int64_t clip_chunk(const Request& r, int64_t n) const;
  void save_checkpoints(Request& r);

  SchedulerConfig config_;
  cache::BlockPool& blocks_;
  cache::StatePool* states_;
  cache::BlockHash seed_;
  std::string cache_format_;
  bool prefix_caching_;
  bool checkpoints_;  // hybrid with prefix caching: clip chunks to checkpoint positions

  std::unordered_map<int64_t, std::unique_ptr<Request>> requests_;
  std::vector<Request*> waiting_;  // heap on (priority, arrival_seq); front = next
  std::vector<Request*> running_;  // sorted by (priority, arrival_seq)
  uint64_t next_arrival_seq_ = 0;
  SchedulerCounters counters_;
};

}  // namespace dz::runtime
