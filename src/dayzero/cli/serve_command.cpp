// `dayzero serve [--model DIR] [--host 127.0.0.1] [--port 8000] [--api-key KEY]...
// [--max-queued-requests N] [--served-model-name NAME] [--max-request-bytes N] [--sse-keepalive S]
// [--metrics-prefix P]` plus the engine flags: the OpenAI-compatible server (docs/serving.md §5).
// It listens at once (GET /health answers 503 until the model is loaded), logs its URL, and stops
// cleanly on SIGINT or SIGTERM.

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/default_model.h"
#include "dayzero/cli/engine_args.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/serve/server.h"

namespace dz::cli {
namespace {

struct ServeArgs {
  ModelArgs model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string served_model_name;
  int64_t max_request_bytes = 4 << 20;
  double sse_keepalive_s = 15.0;
  std::string metrics_prefix = "vllm";
  EngineArgs engine;
};

Result<serve::ServerConfig> server_config(const ServeArgs& args) {
  serve::ServerConfig config;
  config.host = args.host;
  config.port = args.port;
  config.model_dir = args.model.model_dir;
  config.served_model_name = args.served_model_name;
  config.api_keys = args.api_keys;
  config.max_request_bytes = args.max_request_bytes;
  config.sse_keepalive_s = args.sse_keepalive_s;
  config.metrics_prefix = args.metrics_prefix;
  DZ_ASSIGN_OR_RETURN(config.engine, engine_config(args.model, args.engine));
  config.exec = exec_context(args.model);
  ModelArgs model_args = args.model;
  config.load_model = [model_args] { return load_model(model_args); };
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
  DZ_ASSIGN_OR_RETURN(const int rank, plan_rank(args.model));
  if (rank != 0) return load_model(args.model).status();
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
        spdlog::info("dayzero serve: signal {}, stopping", sig);
        server.stop();
        return;
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
  return [args] {
    Result<std::string> dir = resolve_model_dir(args->model.model_dir);
    if (!dir.ok()) return fail(dir.status());
    args->model.model_dir = *dir;
    const Status status = run(*args);
    return status.ok() ? 0 : fail(status);
  };
}

}  // namespace dz::cli
