#pragma once
// The frontend's side of supervised serving (docs/serving.md §5.10): starts the worker group (one
// `dayzero serve --worker-socket` process, or `mpirun` of one per rank) in its own process group,
// keeps every request's prompt, sampling parameters and the tokens forwarded so far, and forwards
// the group's outputs to each request's stream. When the group fails (a process exits or is
// killed, the socket closes, no heartbeat for heartbeat_timeout_s, one step running longer than
// step_timeout_s) it kills what is left of the group, starts a new one and re-submits every
// unfinished request with its generated tokens (recomputed as a prefix,
// runtime::GenerationRequest:: resumed_output_token_ids), so that streams pause and go on with no
// token lost or repeated. New requests wait meanwhile. A request that saw poison_limit failures in
// a row without a new token becomes a suspect: suspects are re-submitted one at a time, each until
// its first token, and one that fails the group while it runs so fails with 500 (the others go on).
// More than max_restarts failures within restart_window_s end the server.

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/core/status.h"
#include "dayzero/runtime/engine.h"

namespace dz::serve::worker {

struct SupervisorConfig {
  // The group's command line (argv[0] looked up in PATH); "--worker-socket PATH" is appended.
  std::vector<std::string> command;
  double heartbeat_timeout_s = 10.0;
  double step_timeout_s = 600.0;
  int max_restarts = 5;
  double restart_window_s = 300.0;
  int poison_limit = 2;
  // How long a new request waits for a restarting group before it gets 503.
  double submit_wait_s = 300.0;
  // Called once, from the supervisor's thread, when it gives up (too many failures): the server
  // stops with this error.
  std::function<void(const Status&)> on_fatal;
};

class WorkerSupervisor final : public runtime::EngineClient {
 public:
  // Starts the first group and waits until it has loaded; a group that fails to load (or exits
  // first) returns its error and is not restarted.
  static Result<std::unique_ptr<WorkerSupervisor>> start(SupervisorConfig config);
  // Tells the group to shut down and reaps it (killed after a grace period); every unfinished
  // request ends aborted.
  ~WorkerSupervisor() override;
  WorkerSupervisor(const WorkerSupervisor&) = delete;
  WorkerSupervisor& operator=(const WorkerSupervisor&) = delete;

  Result<std::vector<std::shared_ptr<runtime::RequestStream>>> submit_choices(
      runtime::GenerationRequest request, int32_t n) override;
  void cancel(int64_t request_id) override;
  runtime::EngineMetrics metrics() const override;
  bool healthy() const override;

 private:
  using Clock = std::chrono::steady_clock;
  enum class State { kRunning, kRecovering, kFailed, kStopping };

  // One request (one choice of an n > 1 request) as the frontend keeps it.
  struct Entry {
    runtime::GenerationRequest request;  // choice_index set
    std::vector<int32_t> generated;      // forwarded so far
    std::weak_ptr<runtime::RequestStream> stream;
    runtime::RequestOutput last;  // counters of the latest output
    bool cancel_sent = false;
    bool progressed = false;  // a token arrived since the last failure
    int failures = 0;         // group failures seen in a row without a token between
    // A suspect (poison_limit failures without a token): re-submitted only alone among the
    // suspects, on probation until its first token.
    bool quarantined = false;
  };
  struct PendingSubmit {
    std::vector<int64_t> ids;
    bool waiter = false;  // a submit_choices call waits for the reply
    std::optional<Status> reply;
  };
  // A started group: the process (group leader) and, once it connected, the socket.
  struct Group {
    pid_t pid = -1;   // the leader while it is not reaped
    pid_t pgid = -1;  // its process group, killed whole in any case
    int fd = -1;
    int64_t generation = 0;
    std::vector<int64_t> rank_pids;  // from the group's hello
  };

  explicit WorkerSupervisor(SupervisorConfig config);
  Status listen();
  Status spawn();
  // Accepts the group's connection and waits for "ready"; the worker's load time in seconds.
  Result<double> wait_ready();
  // Watches the running group; returns why it failed (or ok when stopping).
  Status watch();
  // Applies one message of the group; what must be sent in answer (under no lock) is appended.
  void handle(const nlohmann::json& message, std::vector<nlohmann::json>& replies);
  // Erases an entry that ended; the next suspect goes on probation if it was on it.
  void erase_entry(std::map<int64_t, Entry>::iterator it, std::vector<nlohmann::json>& replies);
  // Submits the oldest quarantined request when none is on probation (mutex_ held).
  void start_probation(std::vector<nlohmann::json>& replies);
  nlohmann::json resubmit_message(int64_t id, const Entry& entry);
  // "rank r (pid p) has exited" for the first rank process that is gone or a zombie.
  std::optional<std::string> dead_rank() const;
  // Kills what is left of the group and reaps it; the exit status as words.
  std::string reap();
  // After a failure: restarts until a group is ready (then re-submits) or gives up.
  void recover(const Status& why);
  void give_up(const Status& why);
  bool note_failure(const Status& why);  // false when the restart budget is spent
  void run();
  // Sends on the current connection if it is still `generation`'s; false when it is not.
  bool send(const nlohmann::json& message, int64_t generation);
  void cancel_departed();
  static void end(Entry& entry, runtime::RequestOutput output);

  SupervisorConfig config_;
  std::string dir_;  // holds the socket
  std::string socket_path_;
  int listen_fd_ = -1;
  Group group_;  // the supervisor's thread changes it (under both mutexes)

  mutable std::mutex mutex_;  // guards the members below
  std::condition_variable changed_;
  State state_ = State::kRunning;
  Status fatal_;
  int64_t generation_ = 0;  // of the connected group
  std::map<int64_t, Entry> entries_;
  std::map<int64_t, PendingSubmit> pending_;  // by tag
  int64_t next_id_ = 1;
  int64_t next_tag_ = 1;
  runtime::EngineMetrics metrics_;
  Clock::time_point last_heartbeat_;
  double step_s_ = 0.0;
  int64_t restarts_ = 0;
  int64_t migrated_ = 0;
  std::deque<Clock::time_point> failures_;
  bool stop_ = false;
  std::optional<int64_t> probation_;  // the suspect submitted alone
  // Recovery timing, for the log (docs/serving.md §5.10).
  std::optional<Clock::time_point> awaiting_first_token_;

  std::mutex
      write_mutex_;  // one writer on the socket at a time; never taken before mutex_ is let go
  std::thread thread_;
};

}  // namespace dz::serve::worker
