// `dayzero serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY]...
// [--max-queued-requests N] [--served-model-name NAME] [--max-request-bytes N]
// [--allowed-media-domains HOST...] [--sse-keepalive S]
// [--metrics-prefix P]` plus the engine flags: the OpenAI-compatible server (docs/serving.md §5).
// It listens at once (GET /health answers 503 until the model is loaded), logs its URL, and on
// SIGINT or SIGTERM drains (new requests 503, running ones finish within --drain-timeout); a
// second signal stops at once.
//
// Three ways to run (docs/serving.md §5.10): by default the process is a frontend (HTTP,
// tokenizer, request table) that starts the engine as a worker group, one process or `mpirun` of
// the plan's ranks, and restarts it when it fails, moving the unfinished requests; with
// --in-process, or when started by mpirun, the engine runs inside the server (no recovery); with
// --worker-socket (given by the frontend) the process is such a worker.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/default_model.h"
#include "dayzero/cli/engine_args.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/dist/mpi_comm.h"
#include "dayzero/serve/server.h"
#include "dayzero/serve/worker/worker_service.h"
#include "dayzero/serve/worker/worker_supervisor.h"

namespace dz::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string served_model_name;
  int64_t max_request_bytes = 32 << 20;  // images travel inside as base64 data URLs
  std::vector<std::string> allowed_media_domains;
  double sse_keepalive_s = 15.0;
  std::string metrics_prefix = "vllm";
  EngineArgs engine;
  double drain_timeout_s = 30.0;
  bool in_process = false;
  std::string worker_socket;  // set by the frontend for its workers
  std::string mpirun = "mpirun";
  std::string mpirun_args = "--bind-to none";
  serve::worker::SupervisorConfig supervisor;
};

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text) {
    if (c == ' ' || c == '\t') {
      if (!word.empty()) words.push_back(std::move(word));
      word.clear();
    } else {
      word += c;
    }
  }
  if (!word.empty()) words.push_back(std::move(word));
  return words;
}

// The worker group's command: this binary with this command line (the worker ignores the HTTP
// options), under mpirun when the plan has more than one rank.
std::vector<std::string> worker_command(const ServeArgs& args) {
  std::vector<std::string> command;
  const int ranks = args.model.parallel.tp * args.model.parallel.ep * args.model.parallel.cp;
  if (ranks > 1) {
    command = {args.mpirun, "-np", std::to_string(ranks)};
    for (std::string& word : split_words(args.mpirun_args)) command.push_back(std::move(word));
  }
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  const std::vector<std::string>& line = command_line();
  command.push_back(error ? line.at(0) : self.string());
  command.insert(command.end(), line.begin() + 1, line.end());
  return command;
}

// Every rank's process id, in rank order (this process's alone in one process).
std::vector<int64_t> every_rank_pid() {
  dist::Comm* comm = plan_comm();
  if (comm == nullptr) return {static_cast<int64_t>(getpid())};
  const auto size = static_cast<size_t>(comm->size());
  const int32_t pid = getpid();
  std::vector<int32_t> pids(size);
  const std::vector<int64_t> counts(size, 1);
  comm->all_gather(std::as_bytes(std::span(&pid, 1)), std::as_writable_bytes(std::span(pids)),
                   counts, dist::WireType::kI32, dist::kStepLayer);
  return {pids.begin(), pids.end()};
}

// The frontend of a worker group it starts itself (docs/serving.md §5.10).
bool supervised(const ServeArgs& args) {
  return !args.in_process && args.worker_socket.empty() && !dist::launched_by_mpi();
}

Result<serve::ServerConfig> server_config(const ServeArgs& args) {
  serve::ServerConfig config;
  config.host = args.host;
  config.port = args.port;
  config.model_dir = args.model.model_dir;
  config.served_model_name = args.served_model_name;
  config.api_keys = args.api_keys;
  config.max_request_bytes = args.max_request_bytes;
  config.media.allowed_domains = args.allowed_media_domains;
  config.sse_keepalive_s = args.sse_keepalive_s;
  config.metrics_prefix = args.metrics_prefix;
  DZ_ASSIGN_OR_RETURN(config.engine, engine_config(args.model, args.engine));
  config.exec = exec_context(args.model);
  ModelArgs model_args = args.model;
  config.load_model = [model_args] { return load_model(model_args); };
  if (supervised(args)) {
    serve::worker::SupervisorConfig supervisor = args.supervisor;
    supervisor.command = worker_command(args);
    config.start_workers = [supervisor](std::function<void(const Status&)> on_fatal)
        -> Result<std::unique_ptr<runtime::EngineClient>> {
      serve::worker::SupervisorConfig c = supervisor;
      c.on_fatal = std::move(on_fatal);
      DZ_ASSIGN_OR_RETURN(std::unique_ptr<serve::worker::WorkerSupervisor> started,
                          serve::worker::WorkerSupervisor::start(std::move(c)));
      return std::unique_ptr<runtime::EngineClient>(std::move(started));
    };
  }
  return config;
}

Status run(const ServeArgs& args) {
  DZ_ASSIGN_OR_RETURN(serve::ServerConfig config, server_config(args));
  // SIGINT and SIGTERM go to one waiting thread (blocked everywhere else, so set before any
  // thread starts, MPI's included); a write to a departed client must fail, not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Under a plan only rank 0 serves HTTP; the others run the steps it sends until it stops (and
  // ignore the signals, which mpirun passes to every rank).
  DZ_ASSIGN_OR_RETURN(const int rank, supervised(args) ? 0 : plan_rank(args.model));
  const std::vector<int64_t> rank_pids = every_rank_pid();
  if (rank != 0) return load_model(args.model).status();
  if (!args.worker_socket.empty())
    return serve::worker::run_worker(args.worker_socket, config, rank_pids);
  if (plan_comm() != nullptr)
    spdlog::info(
        "dayzero serve: rank 0 is pid {}: SIGTERM it to drain and stop every rank "
        "(SIGTERM to mpirun ends every rank at once)",
        getpid());

  serve::Server server(std::move(config));
  DZ_RETURN_IF_ERROR(server.bind());
  spdlog::info(
      "dayzero serve: listening on http://{}:{} (model \"{}\"; /health is 503 until "
      "it is loaded)",
      args.host, server.port(), server.model_name());
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    const timespec slice{.tv_sec = 0, .tv_nsec = 200'000'000};
    while (!done.load()) {
      const int sig = sigtimedwait(&stop_signals, nullptr, &slice);
      if (sig == SIGINT || sig == SIGTERM) {
        spdlog::info("dayzero serve: signal {}, draining", sig);
        server.drain(args.drain_timeout_s);
      }
    }
  });
  const Status status = server.run();
  done.store(true);
  waiter.join();
  if (status.ok()) spdlog::info("dayzero serve: stopped");
  return status;
}

}  // namespace

RunCommand add_serve_command(CLI::App& app) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* command = app.add_subcommand(
      "serve",
      "OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /v1/models, "
      "/health, /metrics, /tokenize, /detokenize");
  add_model_options(*command, args->model, /*model_has_default=*/true);
  add_parallel_options(*command, args->model.parallel);
  command->add_option("--host", args->host, "address to listen on")->capture_default_str();
  command->add_option("--port", args->port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  command->add_option("--api-key", args->api_keys,
                      "accepted Bearer key for /v1/*, /tokenize, /detokenize (repeatable)");
  command->add_option("--served-model-name", args->served_model_name,
                      "the model id clients send (default: the model folder's name)");
  command
      ->add_option("--max-request-bytes", args->max_request_bytes,
                   "largest request body; larger ones get 413")
      ->check(integer_at_least(1024))
      ->capture_default_str();
  command
      ->add_option("--allowed-media-domains", args->allowed_media_domains,
                   "hosts whose http(s) image URLs are fetched (default: none; data: URLs always "
                   "work)")
      ->expected(1, -1);
  command
      ->add_option("--sse-keepalive", args->sse_keepalive_s,
                   "seconds between ': keep-alive' comments while a stream has nothing to send")
      ->check(CLI::Range(0.05, 3600.0))
      ->capture_default_str();
  command
      ->add_option("--metrics-prefix", args->metrics_prefix,
                   "Prometheus namespace of /metrics (vllm: drop-in for vLLM dashboards)")
      ->capture_default_str();
  add_engine_options(*command, args->engine);
  command
      ->add_option("--max-queued-requests", args->engine.max_queued_requests,
                   "waiting requests; beyond, 503 with Retry-After")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      ->add_option("--drain-timeout", args->drain_timeout_s,
                   "seconds running requests may take to finish after SIGTERM")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  // Supervision (docs/serving.md §5.10).
  command->add_flag("--in-process", args->in_process,
                    "run the engine inside this process (no worker restart)");
  command
      ->add_option("--max-restarts", args->supervisor.max_restarts,
                   "worker group failures tolerated within --restart-window; one more stops the "
                   "server")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command
      ->add_option("--restart-window", args->supervisor.restart_window_s,
                   "seconds over which --max-restarts counts")
      ->check(CLI::Range(1.0, 1e7))
      ->capture_default_str();
  command
      ->add_option("--poison-limit", args->supervisor.poison_limit,
                   "a request running through this many worker failures in a row, with no token "
                   "between, fails with 500 instead of being re-submitted")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      ->add_option("--heartbeat-timeout", args->supervisor.heartbeat_timeout_s,
                   "seconds without a heartbeat after which the worker group is restarted")
      ->check(CLI::Range(0.5, 86400.0))
      ->capture_default_str();
  command
      ->add_option("--step-timeout", args->supervisor.step_timeout_s,
                   "seconds one engine step may run before the worker group is restarted")
      ->check(CLI::Range(1.0, 1e7))
      ->capture_default_str();
  command->add_option("--mpirun", args->mpirun, "launcher of a multi-rank worker group")
      ->capture_default_str();
  command
      ->add_option("--mpirun-args", args->mpirun_args,
                   "options for the launcher, before the worker command (one string)")
      ->capture_default_str();
  command->add_option("--worker-socket", args->worker_socket, "run as the frontend's worker")
      ->group("");
  return [args] {
    Result<std::string> dir = resolve_model_dir(args->model.model_dir);
    if (!dir.ok()) return fail(dir.status());
    args->model.model_dir = *dir;
    const Status status = run(*args);
    return status.ok() ? 0 : fail(status);
  };
}

}  // namespace dz::cli
