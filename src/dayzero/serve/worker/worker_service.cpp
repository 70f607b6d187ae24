#include "dayzero/serve/worker/worker_service.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <spdlog/spdlog.h>

#include "dayzero/core/check.h"
#include "dayzero/serve/http/serving_model.h"
#include "dayzero/serve/worker/worker_protocol.h"

namespace dz::serve::worker {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr auto kHeartbeatInterval = std::chrono::milliseconds(250);

Result<int> connect_to(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path))
    return make_error(StatusCode::kInvalidArgument, "--worker-socket: path too long: {}", path);
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return make_error(StatusCode::kIo, "socket: {}", std::strerror(errno));
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    const int err = errno;
    ::close(fd);
    return make_error(StatusCode::kIo, "--worker-socket {}: connect: {}", path, std::strerror(err));
  }
  return fd;
}

class Service {
 public:
  explicit Service(int fd) : fd_(fd) {}

  Status send(const json& message) {
    std::lock_guard lock(write_mutex_);
    return send_message(fd_, message);
  }

  void notify() {
    {
      std::lock_guard lock(mutex_);
      outputs_ready_ = true;
    }
    wake_.notify_one();
  }

  Status serve(runtime::Engine& engine);

 private:
  void submit(runtime::Engine& engine, const json& message);
  void pump(const runtime::Engine& engine);
  void heartbeat(const runtime::Engine& engine);
  static nlohmann::json heartbeat_message(const runtime::Engine& engine);

  const int fd_;
  std::mutex write_mutex_;
  std::mutex mutex_;  // guards the members below
  std::condition_variable wake_;
  bool outputs_ready_ = false;
  bool done_ = false;
  // The frontend's request id → the engine's stream of it.
  std::unordered_map<int64_t, std::shared_ptr<runtime::RequestStream>> streams_;
};

void Service::submit(runtime::Engine& engine, const json& message) {
  json reply = {{"type", "submitted"}, {"tag", message.value("tag", int64_t{0})}};
  Result<runtime::GenerationRequest> request = decode_request(message.at("request"));
  const std::vector<int64_t> ids = message.at("ids").get<std::vector<int64_t>>();
  Result<std::vector<std::shared_ptr<runtime::RequestStream>>> streams =
      request.ok() ? engine.submit_choices(std::move(*request), static_cast<int32_t>(ids.size()))
                   : Result<std::vector<std::shared_ptr<runtime::RequestStream>>>(request.status());
  if (!streams.ok()) reply["error"] = encode_status(streams.status());
  // The reply goes out before the pump may send any output of these ids.
  if (!send(reply).ok() || !streams.ok()) return;
  {
    std::lock_guard lock(mutex_);
    for (size_t c = 0; c < ids.size(); ++c) streams_[ids[c]] = (*streams)[c];
    outputs_ready_ = true;
  }
  wake_.notify_one();
}

nlohmann::json Service::heartbeat_message(const runtime::Engine& engine) {
  const std::optional<Clock::time_point> step = engine.step_started();
  const double step_s = step ? std::chrono::duration<double>(Clock::now() - *step).count() : 0.0;
  return {{"type", "heartbeat"}, {"step_s", step_s}, {"metrics", encode_metrics(engine.metrics())}};
}

void Service::pump(const runtime::Engine& engine) {
  std::unique_lock lock(mutex_);
  while (!done_) {
    wake_.wait_for(lock, std::chrono::milliseconds(50), [&] { return outputs_ready_ || done_; });
    outputs_ready_ = false;
    // The metrics go first, so that a client that saw its last token also sees them; they are
    // read after the outputs are taken (the engine stores a step's metrics before it delivers
    // the step's outputs), or a step ending between the two would send older metrics with its
    // outputs.
    std::vector<json> messages = {json()};
    for (auto it = streams_.begin(); it != streams_.end();) {
      bool finished = false;
      while (std::optional<runtime::RequestOutput> output =
                 it->second->next(std::chrono::milliseconds(0))) {
        output->request_id = it->first;
        finished = output->finished;
        json message = encode_output(*output);
        message["type"] = "output";
        messages.push_back(std::move(message));
      }
      it = finished ? streams_.erase(it) : std::next(it);
    }
    messages.front() = heartbeat_message(engine);
    lock.unlock();
    if (messages.size() > 1)
      for (const json& message : messages)
        if (!send(message).ok()) break;  // the frontend is gone: the reader ends the service
    lock.lock();
  }
}

void Service::heartbeat(const runtime::Engine& engine) {
  std::unique_lock lock(mutex_);
  while (!done_) {
    lock.unlock();
    if (!send(heartbeat_message(engine)).ok()) return;
    lock.lock();
    wake_.wait_for(lock, kHeartbeatInterval, [&] { return done_; });
  }
}

Status Service::serve(runtime::Engine& engine) {
  std::thread pump_thread([this, &engine] { pump(engine); });
  std::thread heartbeat_thread([this, &engine] { heartbeat(engine); });
  Status status;
  for (;;) {
    Result<std::optional<json>> message = read_message(fd_);
    if (!message.ok()) {
      status = message.status();
      break;
    }
    if (!message->has_value()) break;  // the frontend closed: it is gone or restarting us
    const json& m = **message;
    const std::string type = m.at("type").get<std::string>();
    if (type == "shutdown") break;
    if (type == "submit") {
      try {
        submit(engine, m);
      } catch (const json::exception& e) {
        status = make_error(StatusCode::kCorrupt, "worker: bad submit message: {}", e.what());
        break;
      }
    } else if (type == "cancel") {
      const int64_t id = m.value("id", int64_t{0});
      std::shared_ptr<runtime::RequestStream> stream;
      {
        std::lock_guard lock(mutex_);
        if (auto it = streams_.find(id); it != streams_.end()) stream = it->second;
      }
      if (stream) engine.cancel(stream->id());
    }
  }
  {
    std::lock_guard lock(mutex_);
    done_ = true;
  }
  wake_.notify_all();
  pump_thread.join();
  heartbeat_thread.join();
  return status;
}

}  // namespace

Status run_worker(const std::string& socket_path, ServerConfig config,
                  const std::vector<int64_t>& rank_pids) {
  DZ_ASSIGN_OR_RETURN(const int fd, connect_to(socket_path));
  auto service = std::make_unique<Service>(fd);
  Status status = service->send(
      {{"type", "hello"}, {"pid", static_cast<int64_t>(::getpid())}, {"rank_pids", rank_pids}});
  if (status.ok()) {
    const auto start = Clock::now();
    config.engine.on_outputs = [s = service.get()] { s->notify(); };
    Result<std::unique_ptr<http::ServingModel>> model = http::load_serving_model(config);
    if (!model.ok()) {
      status = model.status();
      static_cast<void>(service->send({{"type", "load_failed"}, {"error", encode_status(status)}}));
    } else {
      const double load_s = std::chrono::duration<double>(Clock::now() - start).count();
      spdlog::info("worker {}: model loaded in {:.2f} s", ::getpid(), load_s);
      auto* engine = dynamic_cast<runtime::Engine*>((*model)->engine.get());
      DZ_CHECK(engine != nullptr, "a worker's engine runs in its process");
      status = service->send({{"type", "ready"}, {"load_s", load_s}});
      if (status.ok()) status = service->serve(*engine);
      // The engine (and a plan's leader, which stops the other ranks) goes before the service.
      model->reset();
    }
  }
  service.reset();
  ::close(fd);
  return status;
}

}  // namespace dz::serve::worker
