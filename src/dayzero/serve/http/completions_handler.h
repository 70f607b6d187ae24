#pragma once
// POST /v1/chat/completions and POST /v1/completions (docs/serving.md §5.1–§5.5): parse, render and
// tokenize, check the context, submit, then either collect the whole answer (polling the
// connection so a departed client cancels it) or stream SSE chunks from a chunked content
// provider (keep-alives while nothing arrives; a failed write or a closed peer cancels).

#include <atomic>
#include <string>

#include <httplib.h>

#include "dayzero/serve/http/server_metrics.h"
#include "dayzero/serve/http/serving_model.h"
#include "dayzero/serve/openai/api_error.h"

namespace dz::serve::http {

// What the handlers share; every pointee outlives the HTTP server's threads.
struct HandlerContext {
  const ServerConfig* config = nullptr;
  std::string model_name;
  ServingModel* model = nullptr;
  ServerMetrics* metrics = nullptr;
  const std::atomic<bool>* stopping = nullptr;
};

void handle_chat_completions(const HandlerContext& context, const httplib::Request& request,
                             httplib::Response& response);
void handle_completions(const HandlerContext& context, const httplib::Request& request,
                        httplib::Response& response);

// The error as OpenAI's JSON body with its status (and Retry-After when retry_after_s > 0).
void send_error(httplib::Response& response, const openai::ApiError& error, int retry_after_s = 0);
void send_json(httplib::Response& response, const std::string& body, int status = 200);

}  // namespace dz::serve::http
