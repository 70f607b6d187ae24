#pragma once
// The thread-safe engine (docs/serving.md §2, §5.5): one loop thread owns an EngineCore and runs
// its steps; any thread submits requests, reads their outputs from a RequestStream and cancels
// them. Requests and cancellations pass through an inbox under a mutex that the loop drains between
// steps, so submit() and cancel() never wait for a forward pass. The loop sleeps on a condition
// variable while there is nothing to do.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/runtime/engine_core.h"
#include "dayzero/runtime/engine_types.h"

namespace dz::runtime {

// The outputs of one request, in order, ending with one output whose `finished` is true (a
// finish reason, aborted, or an error). The engine only appends to an unbounded queue, so a slow
// or departed reader never blocks it; dropping the last reference to a stream cancels the
// request (a client that went away, §5.5).
class RequestStream {
 public:
  explicit RequestStream(int64_t id) : id_(id) {}

  int64_t id() const { return id_; }
  // The next output, waiting at most `timeout`; nullopt on timeout, and at once after the final
  // output was taken.
  std::optional<RequestOutput> next(std::chrono::milliseconds timeout);
  // Whether next() has returned the final output.
  bool finished() const;

  // The engine's side: appends an output (after a final one, nothing more is accepted).
  void push(RequestOutput output);

 private:
  const int64_t id_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> outputs_;
  bool final_pushed_ = false;
  bool final_taken_ = false;
};

// What the server needs of an engine: the in-process Engine below, or a supervisor that runs one
// in a worker process group and moves requests to a new group when the old one dies
// (serve/worker/worker_supervisor.h).
class EngineClient {
 public:
  virtual ~EngineClient() = default;
  // As Engine::submit_choices (n = 1: one stream).
  virtual Result<std::vector<std::shared_ptr<RequestStream>>> submit_choices(
      GenerationRequest request, int32_t n) = 0;
  virtual void cancel(int64_t request_id) = 0;
  virtual EngineMetrics metrics() const = 0;
  // False while the engine cannot take requests (a worker group restarting).
  virtual bool healthy() const { return true; }
};

class Engine final : public EngineClient {
 public:
  // Creates the EngineCore (errors as EngineCore::create) and starts the loop thread. model must
  // outlive the engine.
  static Result<std::unique_ptr<Engine>> create(model::CausalLm& model, ExecContext ctx,
                                                const EngineConfig& config);
  // Stops the loop, gives every outstanding request a final output with aborted = true, joins.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Assigns a fresh id and queues the request. Refused at once: an invalid request
  // (kInvalidArgument, EngineCore::validate_request), or max_queued_requests already waiting
  // (kResourceExhausted). This is the only place the queue bound is checked: an accepted request
  // enters the core even if preemptions in the step running meanwhile filled its waiting queue,
  // so a stream never ends with kResourceExhausted.
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // n > 1 choices of one prompt, one stream each, stream c sampling choice c: the prompt is
  // computed once and the choices fork from it (EngineCore::add_choices). Refused as submit, the
  // queue bound counting every choice.
  Result<std::vector<std::shared_ptr<RequestStream>>> submit_choices(GenerationRequest request,
                                                                     int32_t n) override;
  // Cancels a waiting or running request between steps; its stream then ends with aborted = true.
  // Unknown and finished ids are ignored.
  void cancel(int64_t request_id) override;

  // The core's metrics as of the end of the last step.
  EngineMetrics metrics() const override;
  // When the step running now began; nullopt between steps (a worker's heartbeat reports it, so
  // that a long prefill is not taken for a hang).
  std::optional<std::chrono::steady_clock::time_point> step_started() const;
  const EngineConfig& config() const { return core_->config(); }

 private:
  // One request, or the n choices of one (ids[c] samples choice c).
  struct Submitted {
    GenerationRequest request;
    std::vector<int64_t> ids;
    std::vector<std::shared_ptr<RequestStream>> streams;  // null once cancelled in the inbox
  };
  // What the loop keeps per request in the core.
  struct Live {
    std::weak_ptr<RequestStream> stream;
    RequestOutput last;  // counters of the latest output, for a final aborted one
  };

  Engine(ExecContext ctx, std::unique_ptr<EngineCore> core);
  void loop();
  void admit(std::vector<Submitted>& submitted);
  void deliver(std::vector<RequestOutput>& outputs);
  // Aborts in the core and ends the stream (the core's own aborted output is then dropped).
  void abort_live(int64_t request_id);
  static RequestOutput aborted_output(int64_t request_id, const RequestOutput* last);

  ExecContext ctx_;
  std::unique_ptr<EngineCore> core_;
  std::unordered_map<int64_t, Live> live_;  // loop thread only

  mutable std::mutex mutex_;  // guards everything below
  std::condition_variable wake_;
  std::vector<Submitted> inbox_;
  int64_t num_inbox_streams_ = 0;
  std::vector<int64_t> cancels_;
  int64_t next_id_ = 1;
  // The core's waiting count at the last step end plus the requests moved in since; a step in
  // progress may preempt more (already accepted requests: the bound does not refuse them).
  int64_t num_core_waiting_ = 0;
  bool core_busy_ = false;  // the core has unfinished requests
  bool stop_ = false;
  EngineMetrics metrics_;
  std::optional<std::chrono::steady_clock::time_point> step_started_;

  std::thread thread_;  // last: started once everything above exists
};

}  // namespace dz::runtime
