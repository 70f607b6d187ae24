#pragma once
// The engine without threads (docs/serving.md §2): owns the KV cache, the cache coordinator (block
// and state pools) and the scheduler; step() schedules one ForwardBatch mixing decode tokens and
// prefill chunks of many requests, runs it through the model, samples, and returns every request's
// new output. Single-threaded: Engine (engine.h) wraps it for concurrent callers.

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/runtime/engine_types.h"

namespace dz::runtime {

class EngineCore {
 public:
  // Sizes the caches from config (num_blocks or kv_cache_bytes) and checks the config against
  // the model (kInvalidArgument naming the field). model must outlive the engine.
  static Result<std::unique_ptr<EngineCore>> create(model::CausalLm& model, const ExecContext& ctx,
                                                    const EngineConfig& config);
  ~EngineCore();

  // Validates the request (prompt non-empty and in the vocabulary, sampling params, max_tokens,
  // prompt + max_tokens ≤ max_model_len, stop strings need token_bytes: kInvalidArgument) and
  // queues it; kAlreadyExists for a request id in use. The queue bound (max_queued_requests) is
  // Engine::submit's alone: a request the engine accepted must never be refused here later.
  Status add_request(int64_t request_id, GenerationRequest request);
  // n > 1 choices of one prompt: request_ids[c] samples choice c (choice_index c, whatever
  // request.choice_index says), each with its own outputs. The prompt is computed once, by the
  // first; the others fork from it then (prompt blocks shared, the partial last block and the
  // recurrent state copied) and sample from the same logits, so every choice gets what it would
  // alone. A choice without room for a fork then runs as a request of its own. Checks as
  // add_request; kAlreadyExists for an id in use or given twice.
  Status add_choices(std::span<const int64_t> request_ids, GenerationRequest request);
  // The checks of add_request that do not depend on the engine's state (thread-safe: reads only
  // the config and the model's vocabulary), so Engine can answer a submit at once.
  Status validate_request(const GenerationRequest& request) const;
  // Of those, the images' placement over the prompt's placeholders (the pixels themselves are
  // checked by add_request, which preprocesses them).
  Status validate_images(const GenerationRequest& request) const;
  // Removes a waiting request at once, or a running one (its blocks and slot freed); its last
  // output (aborted = true) comes from the next step(). False when the id is unknown or finished.
  bool abort_request(int64_t request_id);

  // One scheduler step and forward pass; the outputs of every request that advanced, finished or
  // was aborted. Does nothing (empty) when no request is waiting or running. An error of the
  // forward pass fails the requests of that batch (RequestOutput::error), not the engine.
  std::vector<RequestOutput> step();

  bool has_unfinished_requests() const;
  EngineMetrics metrics() const;
  const EngineConfig& config() const { return config_; }
  // The cache invariants of docs/serving.md §1.9 over the block pool, the state pool and every
  // running request's table and slot; kInternal naming the first violation.
  Status check_invariants() const;

 private:
  struct Impl;
  EngineCore(EngineConfig config, std::unique_ptr<Impl> impl);

  EngineConfig config_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dz::runtime
