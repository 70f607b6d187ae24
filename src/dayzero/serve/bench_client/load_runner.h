#pragma once
// The load generator of `dayzero bench serve`: sends a dataset's prompts to an OpenAI-compatible
// server as streamed requests, at the arrival times of bench_dataset.h, with at most
// `max_concurrency` in flight, and times every response (stream_accumulator.h). Requests that
// arrive while every slot is busy wait on the client; that wait is reported as queue time and is
// not part of TTFT or E2EL (vLLM measures from the moment a request is sent, too).
//
// Each request opens its own connection (cpp-httplib 0.11.4's Client, plain HTTP). Each is bounded
// by `timeout_s`: reads time out after it, and a stream still running after it is cut and fails,
// so a run ends within about num_prompts / concurrency · timeout_s even against a stuck server.

#include <chrono>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/core/status.h"
#include "dayzero/serve/bench_client/bench_types.h"

namespace dz::serve {

struct LoadOptions {
  std::string url;  // "http://127.0.0.1:8000": scheme, host and port only
  std::string endpoint = "/v1/completions";
  ApiKind kind = ApiKind::kCompletions;
  std::string model;    // the "model" field of every request
  std::string api_key;  // sent as "Authorization: Bearer KEY" when not empty
  double request_rate = std::numeric_limits<double>::infinity();
  double burstiness = 1.0;
  int64_t max_concurrency = 0;  // 0: every request may be in flight at once
  bool ignore_eos = false;
  double timeout_s = 600;
  uint64_t seed = 0;  // arrival times
};

// Threads the runner uses at most: --max-concurrency above it (or unset, with more prompts) is
// clamped to it.
inline constexpr int64_t kMaxClientThreads = 1024;

struct LoadRun {
  std::vector<RequestResult> results;  // in dataset order
  double duration_s = 0;               // first dispatch → last response
};

// The JSON body of one streamed request (stream_options.include_usage on; ignore_eos when asked).
nlohmann::json request_body(const LoadOptions& options, const BenchRequest& request);

// Sends one request and times its stream; `run_start` is the origin of RequestResult::start_s.
RequestResult send_request(const LoadOptions& options, const BenchRequest& request,
                           std::chrono::steady_clock::time_point run_start);

LoadRun run_load(const LoadOptions& options, std::span<const BenchRequest> requests);

// GET `path` from the server; the body of a 200 response, else an error naming the status.
Result<std::string> http_get(const std::string& url, const std::string& path,
                             const std::string& api_key, double timeout_s);

// The id of the first model in GET /v1/models (vLLM's default for --model).
Result<std::string> first_model_id(const std::string& url, const std::string& api_key);

}  // namespace dz::serve
