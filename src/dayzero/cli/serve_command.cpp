// `dayzero serve --model DIR [--host 127.0.0.1] [--port 8000] [--api-key KEY]...
// [--max-queued-requests N] [--served-model-name NAME] [--max-request-bytes N] [--sse-keepalive S]
// [--metrics-prefix P]` plus the engine flags: the OpenAI-compatible server (serving.md §5). It
// listens at once (GET /health answers 503 until the model is loaded), logs its URL, and stops
// cleanly on SIGINT or SIGTERM.

#include <pthread.h>
#include <signal.h>

#include <algorithm>
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
#include "dayzero/cli/model_args.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/serve/server.h"

namespace dz::cli {
namespace {

constexpr int64_t kDefaultMaxModelLen = 4096;

struct ServeArgs {
  ModelArgs model;
  std::string host = "127.0.0.1";
  int port = 8000;
  std::vector<std::string> api_keys;
  std::string served_model_name;
  int64_t max_request_bytes = 4 << 20;
  double sse_keepalive_s = 15.0;
  std::string metrics_prefix = "vllm";
  int64_t max_queued_requests = 256;
  int64_t max_num_seqs = 32;
  int64_t max_num_batched_tokens = 512;
  int64_t num_blocks = 0;
  int64_t max_model_len = 0;
  bool no_prefix_caching = false;
};

// min(4096, max_position_embeddings of config.json, text_config when nested).
Result<int64_t> default_max_model_len(const std::string& model_dir) {
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject config,
                      formats::ConfigObject::load(model_dir + "/config.json"));
  DZ_ASSIGN_OR_RETURN(std::optional<formats::ConfigObject> text,
                      config.optional_object("text_config"));
  const formats::ConfigObject& fields = text ? *text : config;
  DZ_ASSIGN_OR_RETURN(std::optional<int64_t> max_positions,
                      fields.optional_positive_int("max_position_embeddings"));
  return std::min(kDefaultMaxModelLen, max_positions.value_or(kDefaultMaxModelLen));
}

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
  runtime::EngineConfig& engine = config.engine;
  engine.max_num_seqs = args.max_num_seqs;
  engine.max_num_batched_tokens = args.max_num_batched_tokens;
  engine.max_queued_requests = args.max_queued_requests;
  engine.block_size = args.model.block_size;
  engine.num_blocks = args.num_blocks;
  engine.enable_prefix_caching = !args.no_prefix_caching;
  if (args.max_model_len > 0) {
    engine.max_model_len = args.max_model_len;
  } else {
    DZ_ASSIGN_OR_RETURN(engine.max_model_len, default_max_model_len(args.model.model_dir));
  }
  // The checkpoint interval must be a multiple of the block size.
  engine.state_checkpoint_interval = (engine.state_checkpoint_interval + engine.block_size - 1) /
                                     engine.block_size * engine.block_size;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::weakly_canonical(args.model.model_dir, ec);
  engine.model_identity =
      (ec ? args.model.model_dir : dir.string()) + "|kv_cache_dtype=" + args.model.kv_cache_dtype;
  config.exec = exec_context(args.model);
  ModelArgs model_args = args.model;
  config.load_model = [model_args] { return load_model(model_args); };
  return config;
}

Status run(const ServeArgs& args) {
  DZ_ASSIGN_OR_RETURN(serve::ServerConfig config, server_config(args));
  // SIGINT and SIGTERM go to one waiting thread (blocked everywhere else, so set before any
  // thread starts); a write to a departed client must fail, not kill the process.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

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
  add_model_options(*command, args->model);
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
  command
      ->add_option("--max-queued-requests", args->max_queued_requests,
                   "waiting requests; beyond, 503 with Retry-After")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command->add_option("--max-num-seqs", args->max_num_seqs, "most requests running at once")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      ->add_option("--max-num-batched-tokens", args->max_num_batched_tokens,
                   "token budget of one engine step (prefill chunks + decode tokens)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      ->add_option("--num-blocks", args->num_blocks,
                   "KV cache blocks including the null block; 0: from a 1 GiB budget")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command
      ->add_option("--max-model-len", args->max_model_len,
                   "prompt + output tokens of one request; 0: min(4096, max_position_embeddings)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command->add_flag("--no-prefix-caching", args->no_prefix_caching,
                    "never reuse cached blocks of earlier prompts");
  return [args] {
    const Status status = run(*args);
    return status.ok() ? 0 : fail(status);
  };
}

}  // namespace dz::cli
