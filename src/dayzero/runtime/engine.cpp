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
  DZ_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<RequestStream>> streams,
                      submit_choices(std::move(request), 1));
  return std::move(streams[0]);
}

Result<std::vector<std::shared_ptr<RequestStream>>> Engine::submit_choices(
    GenerationRequest request, int32_t n) {
  if (n < 1) return make_error(StatusCode::kInvalidArgument, "n: {} (want >= 1)", n);
  DZ_RETURN_IF_ERROR(core_->validate_request(request));
  Submitted submitted{.request = std::move(request), .ids = {}, .streams = {}};
  {
    std::lock_guard lock(mutex_);
    const int64_t max_queued = core_->config().max_queued_requests;
    if (num_inbox_streams_ + num_core_waiting_ + n > max_queued)
      return make_error(StatusCode::kResourceExhausted,
                        "the queue is full: {} requests are waiting (max_queued_requests)",
                        max_queued);
    for (int32_t c = 0; c < n; ++c) {
      submitted.ids.push_back(next_id_++);
      submitted.streams.push_back(std::make_shared<RequestStream>(submitted.ids.back()));
    }
    num_inbox_streams_ += n;
    inbox_.push_back(submitted);
  }
  wake_.notify_one();
  return std::move(submitted.streams);
}

void Engine::cancel(int64_t request_id) {
  {
    std::lock_guard lock(mutex_);
    // Still in the inbox: the core never saw it, so it ends here and now.
    for (auto it = inbox_.begin(); it != inbox_.end(); ++it) {
      const auto c = static_cast<size_t>(std::find(it->ids.begin(), it->ids.end(), request_id) -
                                         it->ids.begin());
      if (c == it->ids.size() || !it->streams[c]) continue;
      it->streams[c]->push(aborted_output(request_id, nullptr));
      if (it->ids.size() == 1) {
        inbox_.erase(it);
        --num_inbox_streams_;
      } else {
        it->streams[c].reset();  // the core still gets it, so that the others keep their choice
      }
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

std::optional<std::chrono::steady_clock::time_point> Engine::step_started() const {
  std::lock_guard lock(mutex_);
  return step_started_;
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
    const Status status = s.ids.size() == 1 ? core_->add_request(s.ids[0], std::move(s.request))
                                            : core_->add_choices(s.ids, std::move(s.request));
    for (size_t c = 0; c < s.ids.size(); ++c) {
      if (!s.streams[c]) {  // cancelled in the inbox: its stream has ended already
        if (status.ok()) core_->abort_request(s.ids[c]);
        continue;
      }
      if (!status.ok()) {
        RequestOutput output;
        output.request_id = s.ids[c];
        output.finished = true;
        output.error = status;
        output.num_prompt_tokens = num_prompt;
        s.streams[c]->push(std::move(output));
        continue;
      }
      Live live{.stream = s.streams[c], .last = {}};
      live.last.request_id = s.ids[c];
      live.last.num_prompt_tokens = num_prompt;
      live_.emplace(s.ids[c], std::move(live));
    }
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
      num_core_waiting_ += num_inbox_streams_;
      num_inbox_streams_ = 0;
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
    if (core_->has_unfinished_requests()) {
      {
        std::lock_guard lock(mutex_);
        step_started_ = std::chrono::steady_clock::now();
      }
      outputs = core_->step();
    }
    // The snapshot goes out before the outputs, so a reader who saw its final output also sees
    // the metrics of that step.
    EngineMetrics metrics = core_->metrics();
    const bool busy = core_->has_unfinished_requests();
    {
      std::lock_guard lock(mutex_);
      metrics_ = metrics;
      num_core_waiting_ = metrics.num_waiting;
      core_busy_ = busy;
      step_started_.reset();
    }
    deliver(outputs);
    if (!outputs.empty() && core_->config().on_outputs) core_->config().on_outputs();
  }

  // Shutting down: everything outstanding ends aborted.
  std::vector<Submitted> rest;
  {
    std::lock_guard lock(mutex_);
    rest.swap(inbox_);
  }
  for (Submitted& s : rest)
    for (const auto& stream : s.streams)
      if (stream) stream->push(aborted_output(stream->id(), nullptr));
  std::vector<int64_t> ids;
  for (const auto& entry : live_) ids.push_back(entry.first);
  for (int64_t id : ids) abort_live(id);
}

}  // namespace dz::runtime
