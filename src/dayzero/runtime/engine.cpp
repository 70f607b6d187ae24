#include "dayzero/runtime/engine.h"

#include <algorithm>
#include <utility>

namespace dz::runtime {

std::optional<RequestOutput> RequestStream::next(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  if (final_taken_) return std::nullopt;
  if (!ready_.wait_for(lock, timeout, [&] { return !outputs_.empty(); })) return std::nullopt;
  RequestOutput output = std::move(outputs_.front());
  outputs_.pop_front();
  if (output.finished) final_taken_ = true;
  return output;
}

bool RequestStream::finished() const {
  std::lock_guard lock(mutex_);
  return final_taken_;
}

void RequestStream::push(RequestOutput output) {
  {
    std::lock_guard lock(mutex_);
    if (final_pushed_) return;
    final_pushed_ = output.finished;
    outputs_.push_back(std::move(output));
  }
  ready_.notify_all();
}

Result<std::unique_ptr<Engine>> Engine::create(model::CausalLm& model, ExecContext ctx,
                                               const EngineConfig& config) {
  // The core gets the engine's own copy of the context, which lives as long as the core.
  auto engine = std::unique_ptr<Engine>(new Engine(ctx, nullptr));
  DZ_ASSIGN_OR_RETURN(engine->core_, EngineCore::create(model, engine->ctx_, config));
  engine->metrics_ = engine->core_->metrics();
  engine->thread_ = std::thread([e = engine.get()] { e->loop(); });
  return engine;
}

Engine::Engine(ExecContext ctx, std::unique_ptr<EngineCore> core)
    : ctx_(ctx), core_(std::move(core)) {}

Engine::~Engine() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Result<std::shared_ptr<RequestStream>> Engine::submit(GenerationRequest request) {
  DZ_RETURN_IF_ERROR(core_->validate_request(request));
  std::shared_ptr<RequestStream> stream;
  {
    std::lock_guard lock(mutex_);
    const int64_t max_queued = core_->config().max_queued_requests;
    if (static_cast<int64_t>(inbox_.size()) + num_core_waiting_ >= max_queued)
      return make_error(StatusCode::kResourceExhausted,
                        "the queue is full: {} requests are waiting (max_queued_requests)",
                        max_queued);
    stream = std::make_shared<RequestStream>(next_id_++);
    inbox_.push_back(Submitted{stream->id(), std::move(request), stream});
  }
  wake_.notify_one();
  return stream;
}

void Engine::cancel(int64_t request_id) {
  {
    std::lock_guard lock(mutex_);
    // Still in the inbox: the core never saw it, so it ends here and now.
    auto it = std::find_if(inbox_.begin(), inbox_.end(),
                           [&](const Submitted& s) { return s.id == request_id; });
    if (it != inbox_.end()) {
      it->stream->push(aborted_output(request_id, nullptr));
      inbox_.erase(it);
      return;
    }
    cancels_.push_back(request_id);
  }
  wake_.notify_one();
}

EngineMetrics Engine::metrics() const {
  std::lock_guard lock(mutex_);
  return metrics_;
}

RequestOutput Engine::aborted_output(int64_t request_id, const RequestOutput* last) {
  RequestOutput output;
  output.request_id = request_id;
  output.finished = true;
  output.aborted = true;
  if (last != nullptr) {
    output.num_prompt_tokens = last->num_prompt_tokens;
    output.num_cached_tokens = last->num_cached_tokens;
    output.num_output_tokens = last->num_output_tokens;
    output.num_preemptions = last->num_preemptions;
  }
  return output;
}

void Engine::abort_live(int64_t request_id) {
  auto it = live_.find(request_id);
  if (it == live_.end()) return;
  core_->abort_request(request_id);
  if (auto stream = it->second.stream.lock())
    stream->push(aborted_output(request_id, &it->second.last));
  live_.erase(it);
}

void Engine::admit(std::vector<Submitted>& submitted) {
  for (Submitted& s : submitted) {
    const auto num_prompt = static_cast<int64_t>(s.request.prompt_token_ids.size());
    Status status = core_->add_request(s.id, std::move(s.request));
    if (!status.ok()) {
      RequestOutput output;
      output.request_id = s.id;
      output.finished = true;
      output.error = std::move(status);
      output.num_prompt_tokens = num_prompt;
      s.stream->push(std::move(output));
      continue;
    }
    Live live{.stream = s.stream, .last = {}};
    live.last.request_id = s.id;
    live.last.num_prompt_tokens = num_prompt;
    live_.emplace(s.id, std::move(live));
  }
  submitted.clear();
}

void Engine::deliver(std::vector<RequestOutput>& outputs) {
  for (RequestOutput& output : outputs) {
    auto it = live_.find(output.request_id);
    if (it == live_.end()) continue;  // ended here already (aborted)
    std::shared_ptr<RequestStream> stream = it->second.stream.lock();
    if (!stream) {  // its reader went away
      if (!output.finished) core_->abort_request(output.request_id);
      live_.erase(it);
      continue;
    }
    const bool finished = output.finished;
    it->second.last.num_prompt_tokens = output.num_prompt_tokens;
    it->second.last.num_cached_tokens = output.num_cached_tokens;
    it->second.last.num_output_tokens = output.num_output_tokens;
    it->second.last.num_preemptions = output.num_preemptions;
    stream->push(std::move(output));
    if (finished) live_.erase(it);
  }
}

void Engine::loop() {
  std::vector<Submitted> submitted;
  std::vector<int64_t> cancels;
  std::vector<int64_t> departed;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || core_busy_ || !inbox_.empty() || !cancels_.empty(); });
      if (stop_) break;
      submitted.swap(inbox_);
      cancels.swap(cancels_);
      // Until the next snapshot, count the moved requests as waiting in the core.
      num_core_waiting_ += static_cast<int64_t>(submitted.size());
    }
    admit(submitted);
    for (int64_t id : cancels) abort_live(id);
    cancels.clear();
    for (const auto& [id, live] : live_)
      if (live.stream.expired()) departed.push_back(id);
    for (int64_t id : departed) {
      core_->abort_request(id);
      live_.erase(id);
    }
    departed.clear();

    std::vector<RequestOutput> outputs;
    if (core_->has_unfinished_requests()) outputs = core_->step();
    // The snapshot goes out before the outputs, so a reader who saw its final output also sees
    // the metrics of that step.
    EngineMetrics metrics = core_->metrics();
    const bool busy = core_->has_unfinished_requests();
    {
      std::lock_guard lock(mutex_);
      metrics_ = metrics;
      num_core_waiting_ = metrics.num_waiting;
      core_busy_ = busy;
    }
    deliver(outputs);
  }

  // Shutting down: everything outstanding ends aborted.
  std::vector<Submitted> rest;
  {
    std::lock_guard lock(mutex_);
    rest.swap(inbox_);
  }
  for (Submitted& s : rest) s.stream->push(aborted_output(s.id, nullptr));
  std::vector<int64_t> ids;
  for (const auto& entry : live_) ids.push_back(entry.first);
  for (int64_t id : ids) abort_live(id);
}

}  // namespace dz::runtime
