#include "dayzero/serve/worker/worker_supervisor.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "dayzero/serve/worker/worker_protocol.h"

extern char** environ;

namespace dz::serve::worker {
namespace {

using nlohmann::json;

constexpr int kPollMs = 50;
// A worker that stops reading its socket fails the write after this, instead of hanging us.
constexpr int kSendTimeoutS = 5;
// How long a group told to shut down gets before it is killed.
constexpr auto kShutdownGrace = std::chrono::seconds(10);

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return fmt::format("exited with code {}", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                       strsignal(WTERMSIG(status)));
  return fmt::format("ended (wait status {})", status);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

WorkerSupervisor::WorkerSupervisor(SupervisorConfig config) : config_(std::move(config)) {}

Result<std::unique_ptr<WorkerSupervisor>> WorkerSupervisor::start(SupervisorConfig config) {
  if (config.command.empty())
    return make_error(StatusCode::kInvalidArgument, "worker supervisor: no worker command");
  std::unique_ptr<WorkerSupervisor> s(new WorkerSupervisor(std::move(config)));
  DZ_RETURN_IF_ERROR(s->listen());
  DZ_RETURN_IF_ERROR(s->spawn());
  Result<double> load_s = s->wait_ready();
  if (!load_s.ok()) {
    const std::string exit = s->reap();
    return load_s.status().with_context(fmt::format("the worker group (it {})", exit));
  }
  s->last_heartbeat_ = Clock::now();
  s->generation_ = s->group_.generation;
  s->thread_ = std::thread([p = s.get()] { p->run(); });
  return s;
}

WorkerSupervisor::~WorkerSupervisor() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
    if (state_ != State::kFailed) state_ = State::kStopping;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (group_.pid > 0) {
    static_cast<void>(send({{"type", "shutdown"}}, group_.generation));
    const auto deadline = Clock::now() + kShutdownGrace;
    int status = 0;
    while (::waitpid(group_.pid, &status, WNOHANG) == 0 && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
    reap();
  }
  std::lock_guard lock(mutex_);
  for (auto& [id, entry] : entries_) {
    runtime::RequestOutput out = entry.last;
    out.request_id = id;
    out.new_token_ids.clear();
    out.new_samples.clear();
    out.new_text.clear();
    out.finished = true;
    out.aborted = true;
    end(entry, std::move(out));
  }
  entries_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

Status WorkerSupervisor::listen() {
  std::string pattern = (std::filesystem::temp_directory_path() / "dayzero-serve-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr)
    return make_error(StatusCode::kIo, "mkdtemp {}: {}", pattern, std::strerror(errno));
  dir_ = pattern;
  socket_path_ = dir_ + "/worker.sock";
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof(address.sun_path))
    return make_error(StatusCode::kInvalidArgument, "socket path too long: {}", socket_path_);
  std::memcpy(address.sun_path, socket_path_.c_str(), socket_path_.size() + 1);
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 ||
      ::bind(listen_fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0 ||
      ::listen(listen_fd_, 4) != 0)
    return make_error(StatusCode::kIo, "listening on {}: {}", socket_path_, std::strerror(errno));
  return Status::ok_status();
}

Status WorkerSupervisor::spawn() {
  std::vector<std::string> args = config_.command;
  args.push_back("--worker-socket");
  args.push_back(socket_path_);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so that killing the group reaches mpirun's ranks too; the signal mask
  // and SIGPIPE back to defaults (the server blocks SIGTERM and ignores SIGPIPE).
  sigset_t none, pipe;
  sigemptyset(&none);
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &pipe);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  const int err = ::posix_spawnp(&pid, argv[0], nullptr, &attr, argv.data(), environ);
  posix_spawnattr_destroy(&attr);
  if (err != 0)
    return make_error(StatusCode::kIo, "starting the worker group ({}): {}", args[0],
                      std::strerror(err));
  std::lock_guard lock(write_mutex_);
  group_ = Group{
      .pid = pid, .pgid = pid, .fd = -1, .generation = group_.generation + 1, .rank_pids = {}};
  spdlog::info("worker group {} started: pid {}", group_.generation, pid);
  return Status::ok_status();
}

Result<double> WorkerSupervisor::wait_ready() {
  auto stopping = [&] {
    std::lock_guard lock(mutex_);
    return stop_;
  };
  auto exited = [&]() -> std::optional<std::string> {
    int status = 0;
    if (::waitpid(group_.pid, &status, WNOHANG) != group_.pid) return std::nullopt;
    group_.pid = -1;
    return describe_exit(status);
  };
  while (group_.fd < 0) {
    if (stopping()) return make_error(StatusCode::kInternal, "the server is stopping");
    if (auto how = exited())
      return make_error(StatusCode::kInternal, "the worker group {} before it connected", *how);
    pollfd p{.fd = listen_fd_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, kPollMs) <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    const timeval send_timeout{.tv_sec = kSendTimeoutS, .tv_usec = 0};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
    // A worker stopped in the middle of writing a message must not hold the supervisor in read():
    // the rest of a message is due within the heartbeat timeout.
    const auto usec = static_cast<int64_t>(config_.heartbeat_timeout_s * 1e6);
    const timeval receive_timeout{.tv_sec = usec / 1000000, .tv_usec = usec % 1000000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &receive_timeout, sizeof(receive_timeout));
    std::lock_guard lock(write_mutex_);
    group_.fd = fd;
  }
  for (;;) {
    if (stopping()) return make_error(StatusCode::kInternal, "the server is stopping");
    pollfd p{.fd = group_.fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, kPollMs) <= 0) {
      if (auto how = exited())
        return make_error(StatusCode::kInternal, "the worker group {} while loading", *how);
      continue;
    }
    Result<std::optional<json>> message = read_message(group_.fd);
    if (!message.ok()) return message.status();
    if (!message->has_value())
      return make_error(StatusCode::kInternal, "the worker closed its socket while loading");
    const json& m = **message;
    const std::string type = m.value("type", "");
    if (type == "hello") {
      group_.rank_pids = m.value("rank_pids", std::vector<int64_t>{});
      spdlog::info("worker group {}: rank pids {}", group_.generation,
                   fmt::join(group_.rank_pids, ", "));
    } else if (type == "load_failed")
      return decode_status(m.value("error", json::object()));
    else if (type == "ready")
      return m.value("load_s", 0.0);
  }
}

std::optional<std::string> WorkerSupervisor::dead_rank() const {
  for (size_t r = 0; r < group_.rank_pids.size(); ++r) {
    const int64_t pid = group_.rank_pids[r];
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string line;
    std::getline(stat, line);
    // "pid (comm) S ...": the state follows the last ')'.
    const size_t paren = line.rfind(')');
    const char state =
        paren != std::string::npos && paren + 2 < line.size() ? line[paren + 2] : 'X';
    if (state == 'Z' || state == 'X') return fmt::format("rank {} (pid {}) has exited", r, pid);
  }
  return std::nullopt;
}

std::string WorkerSupervisor::reap() {
  std::string how = "had already been reaped";
  if (group_.pid > 0) {
    // A leader that is ending by itself gets a moment, so that its own exit status is reported.
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 5 && (done = ::waitpid(group_.pid, &status, WNOHANG)) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(-group_.pgid, SIGKILL);
    if (done != group_.pid)
      while (::waitpid(group_.pid, &status, 0) < 0 && errno == EINTR) {
      }
    how = describe_exit(status);
  }
  if (group_.pgid > 0) ::kill(-group_.pgid, SIGKILL);  // what is left of it (mpirun's ranks)
  std::lock_guard lock(write_mutex_);
  if (group_.fd >= 0) ::close(group_.fd);
  group_.fd = -1;
  group_.pid = -1;
  group_.pgid = -1;
  return how;
}

bool WorkerSupervisor::send(const json& message, int64_t generation) {
  std::lock_guard lock(write_mutex_);
  if (group_.fd < 0 || group_.generation != generation) return false;
  return send_message(group_.fd, message).ok();
}

void WorkerSupervisor::end(Entry& entry, runtime::RequestOutput output) {
  if (auto stream = entry.stream.lock()) stream->push(std::move(output));
}

Result<std::vector<std::shared_ptr<runtime::RequestStream>>> WorkerSupervisor::submit_choices(
    runtime::GenerationRequest request, int32_t n) {
  if (n < 1) return make_error(StatusCode::kInvalidArgument, "n: {} (want >= 1)", n);
  std::unique_lock lock(mutex_);
  const bool ready = changed_.wait_for(lock, std::chrono::duration<double>(config_.submit_wait_s),
                                       [&] { return state_ != State::kRecovering; });
  if (state_ == State::kFailed)
    return make_error(StatusCode::kResourceExhausted, "{}", fatal_.message());
  if (!ready || state_ != State::kRunning)
    return make_error(StatusCode::kResourceExhausted,
                      "the worker group is restarting; try again later");
  const int64_t generation = generation_;
  const int64_t tag = next_tag_++;
  PendingSubmit& pending = pending_[tag];
  pending.waiter = true;
  std::vector<std::shared_ptr<runtime::RequestStream>> streams;
  for (int32_t c = 0; c < n; ++c) {
    const int64_t id = next_id_++;
    pending.ids.push_back(id);
    streams.push_back(std::make_shared<runtime::RequestStream>(id));
    Entry& entry = entries_[id];
    entry.request = request;
    entry.request.choice_index = static_cast<uint32_t>(c);
    entry.stream = streams.back();
    entry.last.request_id = id;
    entry.last.num_prompt_tokens = static_cast<int64_t>(request.prompt_token_ids.size());
  }
  const json message = {
      {"type", "submit"}, {"tag", tag}, {"ids", pending.ids}, {"request", encode_request(request)}};
  lock.unlock();
  static_cast<void>(send(message, generation));  // a failed send is a failed group: see watch()
  lock.lock();
  // The reply, or a failure of the group (the requests are then re-submitted with the others).
  changed_.wait(lock, [&] {
    const auto it = pending_.find(tag);
    return it == pending_.end() || it->second.reply.has_value();
  });
  const auto it = pending_.find(tag);
  if (it != pending_.end()) {
    const Status reply = *it->second.reply;
    const std::vector<int64_t> ids = std::move(it->second.ids);
    pending_.erase(it);
    if (!reply.ok()) {
      for (int64_t id : ids) entries_.erase(id);
      return reply;
    }
  }
  return streams;
}

void WorkerSupervisor::cancel(int64_t request_id) {
  std::unique_lock lock(mutex_);
  const auto it = entries_.find(request_id);
  if (it == entries_.end()) return;
  const bool submitted = !it->second.quarantined || probation_ == request_id;
  if (state_ != State::kRunning || !submitted) {  // no group to ask: it ends here
    runtime::RequestOutput out = it->second.last;
    out.finished = true;
    out.aborted = true;
    end(it->second, std::move(out));
    entries_.erase(it);
    return;
  }
  it->second.cancel_sent = true;
  const int64_t generation = generation_;
  lock.unlock();
  static_cast<void>(send({{"type", "cancel"}, {"id", request_id}}, generation));
}

runtime::EngineMetrics WorkerSupervisor::metrics() const {
  std::lock_guard lock(mutex_);
  runtime::EngineMetrics m = metrics_;
  m.worker_restarts = restarts_;
  m.requests_migrated = migrated_;
  return m;
}

bool WorkerSupervisor::healthy() const {
  std::lock_guard lock(mutex_);
  return state_ == State::kRunning;
}

json WorkerSupervisor::resubmit_message(int64_t id, const Entry& entry) {
  runtime::GenerationRequest request = entry.request;
  request.resumed_output_token_ids = entry.generated;
  const int64_t tag = next_tag_++;
  pending_[tag] = PendingSubmit{.ids = {id}, .waiter = false, .reply = std::nullopt};
  return {{"type", "submit"}, {"tag", tag}, {"ids", {id}}, {"request", encode_request(request)}};
}

void WorkerSupervisor::start_probation(std::vector<json>& replies) {
  if (probation_) return;
  for (auto& [id, entry] : entries_) {
    if (!entry.quarantined) continue;
    spdlog::warn("request {} goes on probation: it runs alone among the suspects", id);
    probation_ = id;
    replies.push_back(resubmit_message(id, entry));
    return;
  }
}

void WorkerSupervisor::erase_entry(std::map<int64_t, Entry>::iterator it,
                                   std::vector<json>& replies) {
  const bool on_probation = probation_ == it->first;
  entries_.erase(it);
  if (!on_probation) return;
  probation_.reset();
  start_probation(replies);
}

void WorkerSupervisor::handle(const json& message, std::vector<json>& replies) {
  const std::string type = message.value("type", "");
  std::lock_guard lock(mutex_);
  if (type == "heartbeat") {
    last_heartbeat_ = Clock::now();
    step_s_ = message.value("step_s", 0.0);
    if (Result<runtime::EngineMetrics> m = decode_metrics(message.value("metrics", json::object()));
        m.ok())
      metrics_ = std::move(*m);
    return;
  }
  if (type == "submitted") {
    const auto it = pending_.find(message.value("tag", int64_t{0}));
    if (it == pending_.end()) return;
    const Status reply = message.contains("error") ? decode_status(message.at("error")) : Status();
    if (it->second.waiter) {
      it->second.reply = reply;
      changed_.notify_all();
      return;
    }
    // A re-submitted request the new group refused: it ends with that error.
    for (int64_t id : it->second.ids) {
      const auto e = entries_.find(id);
      if (reply.ok() || e == entries_.end()) continue;
      runtime::RequestOutput out = e->second.last;
      out.finished = true;
      out.error = reply;
      end(e->second, std::move(out));
      erase_entry(e, replies);
    }
    pending_.erase(it);
    return;
  }
  if (type != "output") return;
  Result<runtime::RequestOutput> output = decode_output(message);
  if (!output.ok()) {
    spdlog::warn("worker output dropped: {}", output.status().to_string());
    return;
  }
  const auto it = entries_.find(output->request_id);
  if (it == entries_.end()) return;
  Entry& entry = it->second;
  if (!output->new_token_ids.empty()) {
    entry.generated.insert(entry.generated.end(), output->new_token_ids.begin(),
                           output->new_token_ids.end());
    entry.progressed = true;
    entry.failures = 0;
    if (entry.quarantined) {  // cleared: the next suspect may run
      entry.quarantined = false;
      if (probation_ == it->first) {
        probation_.reset();
        start_probation(replies);
      }
    }
    if (awaiting_first_token_) {
      spdlog::info("worker group {}: first token {:.3f} s after ready", generation_,
                   seconds_since(*awaiting_first_token_));
      awaiting_first_token_.reset();
    }
  }
  entry.last.num_prompt_tokens = output->num_prompt_tokens;
  entry.last.num_cached_tokens = output->num_cached_tokens;
  entry.last.num_output_tokens = output->num_output_tokens;
  entry.last.num_preemptions = output->num_preemptions;
  entry.last.first_scheduled = output->first_scheduled;
  const bool finished = output->finished;
  end(entry, std::move(*output));
  if (finished) erase_entry(it, replies);
}

void WorkerSupervisor::cancel_departed() {
  std::vector<int64_t> departed;
  int64_t generation = 0;
  {
    std::lock_guard lock(mutex_);
    generation = generation_;
    for (auto it = entries_.begin(); it != entries_.end();) {
      Entry& entry = it->second;
      if (entry.cancel_sent || !entry.stream.expired()) {
        ++it;
      } else if (entry.quarantined && probation_ != it->first) {
        it = entries_.erase(it);  // never submitted: nothing to cancel
      } else {
        entry.cancel_sent = true;
        departed.push_back(it->first);
        ++it;
      }
    }
  }
  for (int64_t id : departed) static_cast<void>(send({{"type", "cancel"}, {"id", id}}, generation));
}

Status WorkerSupervisor::watch() {
  auto last_departed_check = Clock::now();
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stop_) return Status::ok_status();
      if (seconds_since(last_heartbeat_) > config_.heartbeat_timeout_s)
        return make_error(StatusCode::kInternal, "no heartbeat from the worker for {:.1f} s",
                          seconds_since(last_heartbeat_));
      if (step_s_ > config_.step_timeout_s)
        return make_error(StatusCode::kInternal, "one step has run for {:.0f} s (limit {:.0f} s)",
                          step_s_, config_.step_timeout_s);
    }
    pollfd p{.fd = group_.fd, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, kPollMs) > 0) {
      Result<std::optional<json>> message = read_message(group_.fd);
      if (!message.ok()) return message.status();
      if (!message->has_value())
        return make_error(StatusCode::kInternal, "the worker closed its socket");
      std::vector<json> replies;
      handle(**message, replies);
      int64_t generation = 0;
      {
        std::lock_guard lock(mutex_);
        generation = generation_;
      }
      for (const json& reply : replies) static_cast<void>(send(reply, generation));
      continue;
    }
    int status = 0;
    if (::waitpid(group_.pid, &status, WNOHANG) == group_.pid) {
      group_.pid = -1;
      return make_error(StatusCode::kInternal, "the worker group {}", describe_exit(status));
    }
    if (std::optional<std::string> dead = dead_rank())
      return make_error(StatusCode::kInternal, "{}", *dead);
    if (seconds_since(last_departed_check) > 0.25) {
      cancel_departed();
      last_departed_check = Clock::now();
    }
  }
}

bool WorkerSupervisor::note_failure(const Status& why) {
  const auto now = Clock::now();
  std::lock_guard lock(mutex_);
  failures_.push_back(now);
  while (!failures_.empty() &&
         std::chrono::duration<double>(now - failures_.front()).count() > config_.restart_window_s)
    failures_.pop_front();
  if (static_cast<int>(failures_.size()) <= config_.max_restarts) return true;
  fatal_ =
      make_error(StatusCode::kResourceExhausted,
                 "the worker group failed {} times within {:.0f} s (--max-restarts {}); "
                 "the server stops. Last failure: {}",
                 failures_.size(), config_.restart_window_s, config_.max_restarts, why.message());
  return false;
}

void WorkerSupervisor::give_up(const Status& why) {
  spdlog::error("{}", why.message());
  {
    std::lock_guard lock(mutex_);
    state_ = State::kFailed;
    for (auto& [id, entry] : entries_) {
      runtime::RequestOutput out = entry.last;
      out.finished = true;
      out.error = why;
      end(entry, std::move(out));
    }
    entries_.clear();
    pending_.clear();
  }
  changed_.notify_all();
  if (config_.on_fatal) config_.on_fatal(why);
}

void WorkerSupervisor::recover(const Status& why) {
  const auto failed_at = Clock::now();
  {
    std::lock_guard lock(mutex_);
    state_ = State::kRecovering;
    // Waiting submits return their streams: those requests move with the others.
    pending_.clear();
    awaiting_first_token_.reset();
  }
  changed_.notify_all();
  const std::string exit = reap();
  spdlog::warn("worker group {} failed: {} (it {}); reaped in {:.3f} s", group_.generation,
               why.message(), exit, seconds_since(failed_at));
  Status failure = why;
  for (;;) {
    if (!note_failure(failure)) {
      Status fatal;
      {
        std::lock_guard lock(mutex_);
        fatal = fatal_;
      }
      give_up(fatal);
      return;
    }
    {
      // Requests that keep failing without progress are not retried again.
      std::lock_guard lock(mutex_);
      if (stop_) return;
      const std::optional<int64_t> culprit = probation_;
      probation_.reset();
      for (auto it = entries_.begin(); it != entries_.end();) {
        Entry& entry = it->second;
        const bool submitted = !entry.quarantined || culprit == it->first;
        if (submitted) entry.failures = entry.progressed ? 1 : entry.failures + 1;
        entry.progressed = false;
        if (entry.failures >= config_.poison_limit) entry.quarantined = true;
        if (entry.cancel_sent || culprit == it->first) {
          runtime::RequestOutput out = entry.last;
          out.finished = true;
          if (entry.cancel_sent)
            out.aborted = true;
          else
            out.error = make_error(StatusCode::kInternal,
                                   "the worker group failed {} times in a row while this request "
                                   "ran with no token between, the last time with no other "
                                   "suspect request beside it; it is not retried (--poison-limit "
                                   "{}). Last failure: {}",
                                   entry.failures, config_.poison_limit, failure.message());
          end(entry, std::move(out));
          it = entries_.erase(it);
        } else {
          ++it;
        }
      }
    }
    const auto restart_at = Clock::now();
    Status started = spawn();
    Result<double> load_s = started.ok() ? wait_ready() : Result<double>(started);
    if (load_s.ok()) {
      const double connect_s = seconds_since(restart_at);
      std::vector<json> resubmits;
      {
        std::lock_guard lock(mutex_);
        generation_ = group_.generation;
        last_heartbeat_ = Clock::now();
        step_s_ = 0.0;
        for (auto& [id, entry] : entries_)
          if (!entry.quarantined) resubmits.push_back(resubmit_message(id, entry));
        start_probation(resubmits);
        ++restarts_;
        migrated_ += static_cast<int64_t>(resubmits.size());
      }
      for (const json& m : resubmits) static_cast<void>(send(m, group_.generation));
      spdlog::warn(
          "worker group {} ready: {:.3f} s after the failure (restart and load {:.3f} s, of "
          "which the model load {:.3f} s); {} requests re-submitted",
          group_.generation, seconds_since(failed_at), connect_s, *load_s, resubmits.size());
      {
        std::lock_guard lock(mutex_);
        state_ = State::kRunning;
        if (!resubmits.empty()) awaiting_first_token_ = Clock::now();
      }
      changed_.notify_all();
      return;
    }
    failure = load_s.status();
    const std::string how = reap();
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    spdlog::error("worker group {} did not start: {} (it {})", group_.generation, failure.message(),
                  how);
  }
}

void WorkerSupervisor::run() {
  for (;;) {
    const Status why = watch();
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
    }
    recover(why);
    std::lock_guard lock(mutex_);
    if (stop_ || state_ == State::kFailed) return;
  }
}

}  // namespace dz::serve::worker
