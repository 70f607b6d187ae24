#pragma once
// The OpenAI-compatible HTTP server (docs/serving.md §5) on cpp-httplib 0.11.4: chat and
// completions (streaming as SSE or not), models, health, Prometheus metrics, tokenize and
// detokenize, in front of the thread-safe runtime::Engine. HTTP threads parse, render templates and
// tokenize; the engine loop runs on its own thread. The server listens before the model is loaded
// (/health answers 503 until it is), loads it on a background thread, and stops on stop().

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/runtime/engine.h"
#include "dayzero/runtime/engine_types.h"
#include "dayzero/serve/http/image_urls.h"
#include "dayzero/serve/openai/sampling_fields.h"

namespace httplib {
class Server;
}

namespace dz::serve {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see Server::port())
  std::string model_dir;
  std::string served_model_name;         // empty: the model folder's name
  std::vector<std::string> api_keys;     // non-empty: Bearer auth on /v1/*, /tokenize, /detokenize
  int64_t max_request_bytes = 32 << 20;  // bodies above: 413 (images come as base64 inside)
  double sse_keepalive_s = 15.0;         // ": keep-alive" while a stream has nothing to send
  std::string metrics_prefix = "vllm";   // Prometheus namespace
  int num_http_threads = 0;              // 0: from max_num_seqs + max_queued_requests
  openai::ParseLimits limits;            // vocab_size is filled from the tokenizer
  http::MediaOptions media;              // image URLs: --allowed-media-domains
  // eos_token_ids, token_bytes and model_identity are filled by the server when empty.
  runtime::EngineConfig engine;
  ExecContext exec;
  // Loads the checkpoint (on the loading thread).
  std::function<Result<std::unique_ptr<model::CausalLm>>()> load_model;
  // Supervised serving (docs/serving.md §5.10): starts the worker group instead of loading the
  // model here (load_model is then unused); it calls on_fatal when it gives up, which stops the
  // server with that error.
  std::function<Result<std::unique_ptr<runtime::EngineClient>>(
      std::function<void(const Status&)> on_fatal)>
      start_workers;
};

class Server {
 public:
  explicit Server(ServerConfig config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket (port 0: any free one).
  Status bind();
  // The bound port (after bind()).
  int port() const { return port_; }
  // Starts loading the model in the background, then serves until stop() or a loading failure;
  // returns the loading error, if any.
  Status run();
  // Thread-safe; makes run() return. Requests in flight are cancelled.
  void stop();
  // Thread-safe graceful stop: from now on new generation requests get 503 and /health 503; the
  // running ones may finish for up to timeout_s, then stop(). Returns at once (a thread waits).
  void drain(double timeout_s);

  bool ready() const { return ready_.load(std::memory_order_acquire); }
  const std::string& model_name() const;

 private:
  struct State;
  void load();
  // Stops the server with `status` as run()'s result (a supervised engine that gave up).
  void fail(const Status& status);

  std::unique_ptr<State> state_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  std::atomic<bool> ready_{false};
  std::thread loader_;
  std::thread drainer_;
  std::mutex load_mutex_;
  Status load_status_;
};

}  // namespace dz::serve
