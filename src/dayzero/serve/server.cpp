#include "dayzero/serve/server.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "dayzero/serve/http/chat_prompt.h"
#include "dayzero/serve/http/completions_handler.h"
#include "dayzero/serve/http/server_metrics.h"
#include "dayzero/serve/http/serving_model.h"
#include "dayzero/serve/openai/chat_request.h"
#include "dayzero/serve/openai/response_common.h"

namespace dz::serve {
namespace {

using http::HandlerContext;
using http::send_error;
using http::send_json;
using openai::ApiError;

// Paths that need the Bearer key when keys are set (docs/serving.md §5.5); /health and /metrics
// stay public.
bool is_protected(const std::string& path) {
  return path.starts_with("/v1/") || path == "/tokenize" || path == "/detokenize";
}

// Compares in time that depends on the lengths only, never on where the first difference is.
bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

bool authorized(const std::vector<std::string>& keys, const httplib::Request& request) {
  const std::string header = request.get_header_value("Authorization");
  static constexpr std::string_view kBearer = "Bearer ";
  if (!header.starts_with(kBearer)) return false;
  const std::string_view token = std::string_view(header).substr(kBearer.size());
  bool ok = false;
  for (const std::string& key : keys) ok |= constant_time_equal(token, key);  // no early exit
  return ok;
}

std::string folder_name(const std::string& dir) {
  std::filesystem::path path(dir);
  if (!path.has_filename()) path = path.parent_path();  // "models/tiny/"
  return path.filename().string();
}

// The body of a JSON endpoint as an object, or the 400 for it.
std::variant<nlohmann::json, ApiError> json_object(const std::string& body) {
  nlohmann::json value = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return ApiError::invalid_json("The request body is not valid JSON.");
  if (!value.is_object()) return ApiError::invalid_json("The request body must be a JSON object.");
  return value;
}

}  // namespace

struct Server::State {
  ServerConfig config;
  std::string model_name;
  http::ServerMetrics metrics;
  std::unique_ptr<http::ServingModel> model;
  std::atomic<bool> stopping{false};
  std::atomic<bool> draining{false};
  std::atomic<bool> running{false};
  std::atomic<bool> listen_done{false};
  HandlerContext context;

  explicit State(ServerConfig c)
      : config(std::move(c)),
        model_name(config.served_model_name.empty() ? folder_name(config.model_dir)
                                                    : config.served_model_name),
        metrics(config.metrics_prefix, model_name, config.engine.max_model_len) {}

  void tokenize(const httplib::Request& request, httplib::Response& response) const;
  void detokenize(const httplib::Request& request, httplib::Response& response) const;
  std::optional<ApiError> check_model(const nlohmann::json& body) const {
    const auto it = body.find("model");
    if (it == body.end() || it->is_null()) return std::nullopt;
    if (!it->is_string()) return ApiError::invalid_value("model", "model must be a string");
    if (it->get<std::string>() != model_name)
      return ApiError::model_not_found(it->get<std::string>());
    return std::nullopt;
  }
};

void Server::State::tokenize(const httplib::Request& request, httplib::Response& response) const {
  auto parsed = json_object(request.body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return send_error(response, *error);
  nlohmann::json& body = std::get<nlohmann::json>(parsed);
  if (auto error = check_model(body)) return send_error(response, *error);
  std::variant<std::vector<int32_t>, ApiError> ids;
  if (body.contains("messages")) {
    body["model"] = model_name;
    auto chat = openai::parse_chat_request(body.dump(), config.limits);
    if (auto* error = std::get_if<ApiError>(&chat)) return send_error(response, *error);
    auto built = http::build_chat_prompt(*model, std::get<openai::ChatRequest>(chat), config.media);
    if (auto* error = std::get_if<ApiError>(&built)) return send_error(response, *error);
    ids = std::move(std::get<http::ChatPrompt>(built).token_ids);  // image tokens counted
  } else {
    const auto it = body.find("prompt");
    if (it == body.end() || !it->is_string())
      return send_error(
          response, ApiError::invalid_value("prompt", "prompt (a string) or messages is required"));
    ids = http::encode_prompt(*model, it->get<std::string>(), /*chat=*/false, "prompt");
  }
  if (auto* error = std::get_if<ApiError>(&ids)) return send_error(response, *error);
  const auto& tokens = std::get<std::vector<int32_t>>(ids);
  const nlohmann::json out = {
      {"count", tokens.size()}, {"max_model_len", model->max_model_len}, {"tokens", tokens}};
  send_json(response, openai::dump_json(out));
}

void Server::State::detokenize(const httplib::Request& request, httplib::Response& response) const {
  auto parsed = json_object(request.body);
  if (auto* error = std::get_if<ApiError>(&parsed)) return send_error(response, *error);
  const nlohmann::json& body = std::get<nlohmann::json>(parsed);
  if (auto error = check_model(body)) return send_error(response, *error);
  const auto it = body.find("tokens");
  if (it == body.end() || !it->is_array())
    return send_error(response,
                      ApiError::invalid_value("tokens", "tokens must be an array of token ids"));
  std::vector<int32_t> tokens;
  const int64_t vocab = model->tokenizer->vocab_size();
  for (size_t i = 0; i < it->size(); ++i) {
    const nlohmann::json& t = (*it)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      return send_error(response,
                        ApiError::invalid_value(
                            fmt::format("tokens[{}]", i),
                            fmt::format("tokens[{}] is not a token id in [0, {})", i, vocab)));
    tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  send_json(response, openai::dump_json({{"prompt", model->tokenizer->decode(tokens)}}));
}

Server::Server(ServerConfig config)
    : state_(std::make_unique<State>(std::move(config))),
      http_(std::make_unique<httplib::Server>()) {
  State& s = *state_;
  s.context = HandlerContext{.config = &s.config,
                             .model_name = s.model_name,
                             .model = nullptr,
                             .metrics = &s.metrics,
                             .stopping = &s.stopping};
  const runtime::EngineConfig& engine = s.config.engine;
  const int num_threads =
      s.config.num_http_threads > 0
          ? s.config.num_http_threads
          : static_cast<int>(std::clamp<int64_t>(
                engine.max_num_seqs + engine.max_queued_requests + 16, 32, 512));
  http_->new_task_queue = [num_threads] {
    return new httplib::ThreadPool(static_cast<size_t>(num_threads));
  };
  http_->set_payload_max_length(static_cast<size_t>(s.config.max_request_bytes));
  http_->set_read_timeout(std::chrono::seconds(10));
  http_->set_write_timeout(std::chrono::seconds(10));

  http_->set_pre_routing_handler(
      [this](const httplib::Request& request, httplib::Response& response) {
        State& st = *state_;
        if (!st.config.api_keys.empty() && is_protected(request.path) &&
            !authorized(st.config.api_keys, request)) {
          st.metrics.on_rejected("unauthorized");
          send_error(response, ApiError::unauthorized());
          return httplib::Server::HandlerResponse::Handled;
        }
        if (st.draining.load() &&
            (request.path == "/v1/completions" || request.path == "/v1/chat/completions")) {
          send_error(response, ApiError::service_unavailable("The server is shutting down."));
          return httplib::Server::HandlerResponse::Handled;
        }
        if (is_protected(request.path) && request.path != "/v1/models" && !ready()) {
          send_error(response, ApiError::service_unavailable("The model is still loading."));
          return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
      });
  // Statuses httplib sets itself (unknown path, body too large, bad request line) get OpenAI's
  // error body too.
  http_->set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& request, httplib::Response& response) {
        if (!response.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        ApiError error;
        if (response.status == 413) {
          state_->metrics.on_rejected("too_large");
          // Only the uint64_t specialisation of get_header_value<T> exists in 0.11.4 (the
          // generic one returns nothing).
          const uint64_t length = request.get_header_value<uint64_t>("Content-Length");
          error = ApiError::body_too_large(static_cast<int64_t>(length),
                                           state_->config.max_request_bytes);
        } else if (response.status == 404) {
          error =
              ApiError::not_found(fmt::format("No route for {} {}", request.method, request.path));
        } else {
          error.http_status = response.status;
          error.message = fmt::format("HTTP {}", response.status);
        }
        send_error(response, error);
        response.status = error.http_status;
        return httplib::Server::HandlerResponse::Handled;
      }));
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& response, std::exception_ptr ep) {
        std::string what = "unknown exception";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(response, ApiError::internal(fmt::format("Internal error: {}", what)));
      });

  http_->Get("/health", [this](const httplib::Request&, httplib::Response& response) {
    if (!ready())
      return send_error(response, ApiError::service_unavailable("The model is still loading."));
    if (state_->draining.load())
      return send_error(response, ApiError::service_unavailable("The server is shutting down."));
    if (!state_->model->engine->healthy())
      return send_error(response, ApiError::service_unavailable("The worker group is restarting."));
    send_json(response, "{}");
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& response) {
    static const int64_t created = static_cast<int64_t>(std::time(nullptr));
    const nlohmann::json model = {{"id", state_->model_name},
                                  {"object", "model"},
                                  {"created", created},
                                  {"owned_by", "dayzero"},
                                  {"max_model_len", state_->config.engine.max_model_len}};
    send_json(response, openai::dump_json({{"object", "list"}, {"data", {model}}}));
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& response) {
    if (ready()) state_->metrics.update_engine(state_->model->engine->metrics());
    response.set_content(state_->metrics.expose(), "text/plain; version=0.0.4; charset=utf-8");
  });
  http_->Post("/v1/chat/completions",
              [this](const httplib::Request& request, httplib::Response& response) {
                http::handle_chat_completions(state_->context, request, response);
              });
  http_->Post("/v1/completions",
              [this](const httplib::Request& request, httplib::Response& response) {
                http::handle_completions(state_->context, request, response);
              });
  http_->Post("/tokenize", [this](const httplib::Request& request, httplib::Response& response) {
    state_->tokenize(request, response);
  });
  http_->Post("/detokenize", [this](const httplib::Request& request, httplib::Response& response) {
    state_->detokenize(request, response);
  });
}

Server::~Server() {
  stop();
  if (loader_.joinable()) loader_.join();
  if (drainer_.joinable()) drainer_.join();
}

const std::string& Server::model_name() const {
  return state_->model_name;
}

Status Server::bind() {
  if (state_->config.port == 0) {
    port_ = http_->bind_to_any_port(state_->config.host);
    if (port_ > 0) return Status();
  } else if (http_->bind_to_port(state_->config.host, state_->config.port)) {
    port_ = state_->config.port;
    return Status();
  }
  return make_error(StatusCode::kIo, "cannot listen on {}:{}", state_->config.host,
                    state_->config.port);
}

void Server::load() {
  const auto start = std::chrono::steady_clock::now();
  Result<std::unique_ptr<http::ServingModel>> model =
      http::load_serving_model(state_->config, [this](const Status& status) { fail(status); });
  if (!model.ok()) {
    {
      std::lock_guard lock(load_mutex_);
      load_status_ = model.status().with_context(state_->config.model_dir);
    }
    spdlog::error("loading failed: {}", load_status_.to_string());
    stop();
    return;
  }
  state_->model = std::move(*model);
  state_->context.model = state_->model.get();
  ready_.store(true, std::memory_order_release);
  spdlog::info("model {} ready in {:.1f} s", state_->model_name,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

Status Server::run() {
  state_->running.store(true);
  if (!state_->stopping.load()) {
    loader_ = std::thread([this] { load(); });
    http_->listen_after_bind();
  }
  state_->listen_done.store(true);
  if (loader_.joinable()) loader_.join();
  // Handlers have all returned (the pool joined): the engine can go, aborting nothing in flight.
  state_->model.reset();
  std::lock_guard lock(load_mutex_);
  return load_status_;
}

void Server::fail(const Status& status) {
  {
    std::lock_guard lock(load_mutex_);
    load_status_ = status;
  }
  stop();
}

void Server::drain(double timeout_s) {
  if (state_->draining.exchange(true)) return stop();  // asked twice: at once
  spdlog::info("draining: new requests get 503; {} running may finish within {:.0f} s",
               state_->metrics.open_runs(), timeout_s);
  std::lock_guard lock(load_mutex_);
  drainer_ = std::thread([this, timeout_s] {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(timeout_s));
    while (state_->metrics.open_runs() > 0 && std::chrono::steady_clock::now() < deadline &&
           !state_->stopping.load())
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (state_->metrics.open_runs() > 0)
      spdlog::warn("drain timeout: {} requests still running are aborted",
                   state_->metrics.open_runs());
    stop();
  });
}

void Server::stop() {
  state_->stopping.store(true);
  // listen_after_bind() may not have started yet, and httplib's stop() is a no-op then: repeat
  // until it has returned (or run() was never called).
  while (state_->running.load() && !state_->listen_done.load()) {
    http_->stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http_->stop();
}

}  // namespace dz::serve
