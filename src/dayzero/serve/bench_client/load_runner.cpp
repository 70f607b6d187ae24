#include "dayzero/serve/bench_client/load_runner.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <httplib.h>

#include "dayzero/serve/bench_client/bench_dataset.h"
#include "dayzero/serve/bench_client/sse_parser.h"
#include "dayzero/serve/bench_client/stream_accumulator.h"

namespace dz::serve {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBodyBytes = 2048;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

void set_timeouts(httplib::Client& client, double timeout_s) {
  auto timeout = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::duration<double>(timeout_s));
  client.set_connection_timeout(std::min(timeout, std::chrono::microseconds(10'000'000)));
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
}

httplib::Headers auth_headers(const std::string& api_key) {
  httplib::Headers headers;
  if (!api_key.empty()) headers.emplace("Authorization", "Bearer " + api_key);
  return headers;
}

}  // namespace

nlohmann::json request_body(const LoadOptions& options, const BenchRequest& request) {
  nlohmann::json body = {
      {"model", options.model}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  if (options.kind == ApiKind::kCompletions) {
    body["prompt"] = request.prompt_ids;
    body["max_tokens"] = request.output_len;
  } else {
    body["messages"] =
        nlohmann::json::array({{{"role", "user"}, {"content", request.prompt_text}}});
    body["max_completion_tokens"] = request.output_len;
  }
  if (options.ignore_eos) body["ignore_eos"] = true;
  return body;
}

RequestResult send_request(const LoadOptions& options, const BenchRequest& request,
                           Clock::time_point run_start) {
  RequestResult result;
  result.prompt_len = request.prompt_len;
  httplib::Client client(options.url);
  set_timeouts(client, options.timeout_s);

  httplib::Request http_request;
  http_request.method = "POST";
  http_request.path = options.endpoint;
  http_request.headers = auth_headers(options.api_key);
  http_request.headers.emplace("Accept", "text/event-stream");
  http_request.headers.emplace("Content-Type", "application/json");
  http_request.body =
      request_body(options, request).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);

  Clock::time_point sent = Clock::now();
  auto deadline = sent + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(options.timeout_s));
  SseParser parser;
  StreamAccumulator stream(options.kind, sent);
  std::string error_body;
  int status = 0;
  bool timed_out = false;
  http_request.response_handler = [&](const httplib::Response& response) {
    status = response.status;
    return true;
  };
  http_request.content_receiver = [&](const char* data, size_t size, uint64_t, uint64_t) {
    Clock::time_point now = Clock::now();  // the arrival time of every event in these bytes
    if (status != 200) {
      error_body.append(data, std::min(size, kMaxErrorBodyBytes -
                                                 std::min(kMaxErrorBodyBytes, error_body.size())));
      return true;
    }
    parser.feed(std::string_view(data, size),
                [&](SseEvent&& event) { stream.on_event(event, now); });
    if (stream.failed()) return false;  // an error event: nothing more to measure
    if (now > deadline) {
      timed_out = true;
      return false;
    }
    return true;
  };

  httplib::Response response;
  httplib::Error error = httplib::Error::Success;
  bool ok = client.send(http_request, response, error);
  result.start_s = seconds(sent - run_start);
  result.http_status = status;
  if (status != 0 && status != 200) {
    result.error = fmt::format("HTTP {}: {}", status, error_body);
    return result;
  }
  if (status == 200) {
    Clock::time_point end = Clock::now();
    parser.finish([&](SseEvent&& event) { stream.on_event(event, end); });
  }
  if (timed_out) {
    stream.fail(fmt::format("timed out after {} s (--timeout)", options.timeout_s));
  } else if (!ok && !stream.failed()) {
    stream.fail("transport error: " + httplib::to_string(error));
  }
  stream.finish(result);
  return result;
}

LoadRun run_load(const LoadOptions& options, std::span<const BenchRequest> requests) {
  LoadRun run;
  run.results.resize(requests.size());
  if (requests.empty()) return run;
  std::vector<double> arrivals =
      arrival_times(static_cast<int64_t>(requests.size()), options.request_rate, options.burstiness,
                    options.seed);
  auto num_requests = static_cast<int64_t>(requests.size());
  int64_t slots =
      options.max_concurrency > 0 ? std::min(options.max_concurrency, num_requests) : num_requests;
  slots = std::min(slots, kMaxClientThreads);

  std::mutex mutex;
  std::condition_variable arrived;
  std::deque<std::pair<size_t, Clock::time_point>> queue;  // (request, arrival) waiting for a slot
  bool all_dispatched = false;
  Clock::time_point start = Clock::now();
  // One thread per slot: a slot takes the oldest waiting request, so at most `slots` are sent.
  std::vector<std::thread> workers;
  for (int64_t w = 0; w < slots; ++w) {
    workers.emplace_back([&] {
      for (;;) {
        std::pair<size_t, Clock::time_point> next;
        {
          std::unique_lock lock(mutex);
          arrived.wait(lock, [&] { return !queue.empty() || all_dispatched; });
          if (queue.empty()) return;
          next = queue.front();
          queue.pop_front();
        }
        RequestResult result = send_request(options, requests[next.first], start);
        result.queue_s = std::max(0.0, result.start_s - seconds(next.second - start));
        run.results[next.first] = std::move(result);  // each index written by one thread
      }
    });
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    {
      std::lock_guard lock(mutex);
      queue.emplace_back(i, Clock::now());
    }
    arrived.notify_one();
  }
  {
    std::lock_guard lock(mutex);
    all_dispatched = true;
  }
  arrived.notify_all();
  for (std::thread& worker : workers) worker.join();
  run.duration_s = seconds(Clock::now() - start);
  return run;
}

Result<std::string> http_get(const std::string& url, const std::string& path,
                             const std::string& api_key, double timeout_s) {
  httplib::Client client(url);
  set_timeouts(client, timeout_s);
  httplib::Result response = client.Get(path, auth_headers(api_key));
  if (!response)
    return make_error(StatusCode::kIo, "GET {}{}: {}", url, path,
                      httplib::to_string(response.error()));
  if (response->status != 200)
    return make_error(StatusCode::kIo, "GET {}{}: HTTP {}: {}", url, path, response->status,
                      response->body.substr(0, kMaxErrorBodyBytes));
  return response->body;
}

Result<std::string> first_model_id(const std::string& url, const std::string& api_key) {
  DZ_ASSIGN_OR_RETURN(std::string body, http_get(url, "/v1/models", api_key, 30.0));
  nlohmann::json models = nlohmann::json::parse(body, nullptr, false);
  if (models.is_discarded() || !models.contains("data") || !models["data"].is_array() ||
      models["data"].empty() || !models["data"][0].contains("id") ||
      !models["data"][0]["id"].is_string())
    return make_error(StatusCode::kIo, "GET {}/v1/models: no model id in {}", url,
                      body.substr(0, 200));
  return models["data"][0]["id"].get<std::string>();
}

}  // namespace dz::serve
