#include "dayzero/serve/http/completions_handler.h"

#include <chrono>
#include <ctime>
#include <memory>
#include <random>
#include <variant>
#include <vector>

#include <fmt/format.h>

#include "dayzero/serve/http/chat_prompt.h"
#include "dayzero/serve/http/connection_watch.h"
#include "dayzero/serve/http/generation.h"
#include "dayzero/serve/openai/chat_request.h"
#include "dayzero/serve/openai/chat_response.h"
#include "dayzero/serve/openai/completion_request.h"
#include "dayzero/serve/openai/completion_response.h"
#include "dayzero/serve/openai/response_common.h"

namespace dz::serve::http {
namespace {

using openai::ApiError;
using std::chrono::milliseconds;

// How often a waiting handler looks at its connection (docs/serving.md §5.5: at least once a
// second).
constexpr milliseconds kPollInterval(250);

// Everything one response needs after the handler returned (the streaming provider runs later).
struct Exchange {
  HandlerContext context;
  bool chat = false;
  openai::SamplingFields fields;
  bool echo = false;
  std::vector<PromptInput> prompts;
  openai::ResponseContext response;
  std::unique_ptr<GenerationRun> run;
  ConnectionWatch watch = ConnectionWatch::find(0, "", 0);
};

bool client_gone(const Exchange& x) {
  return x.context.stopping->load(std::memory_order_relaxed) || x.watch.peer_closed();
}

// Completions: a departed client; chat: the same. Common checks before any work.
std::optional<ApiError> check_model(const HandlerContext& context, const std::string& model) {
  if (model != context.model_name) return ApiError::model_not_found(model);
  return std::nullopt;
}

void fill_seed(openai::SamplingFields& fields) {
  if (fields.seed) return;
  // Drawn at arrival: every choice of the request shares it (different choice streams).
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  fields.sampling.seed = rng();
}

openai::ResponseContext response_context(const Exchange& x, std::string_view id_prefix) {
  openai::ResponseContext rc;
  rc.id = openai::make_response_id(id_prefix);
  rc.created = static_cast<int64_t>(std::time(nullptr));
  rc.model = x.fields.model;
  rc.stream_options = x.fields.stream_options;
  rc.token_bytes = x.context.model->token_bytes;
  return rc;
}

std::optional<std::vector<runtime::SampleResult>> logprobs_of(const Exchange& x,
                                                              const ChoiceState& choice) {
  if (!x.fields.sampling.logprobs) return std::nullopt;
  return choice.samples;
}

// Waits for every choice, watching the connection; false when the client left or the server
// stops (the run's destructor cancels what is left).
bool collect(Exchange& x) {
  while (!x.run->finished()) {
    if (client_gone(x)) return false;
    x.run->poll(kPollInterval);
  }
  return true;
}

void respond_whole(Exchange& x, httplib::Response& response) {
  if (!collect(x)) {
    send_error(response, ApiError::service_unavailable("The request was cancelled."));
    return;
  }
  if (std::optional<ApiError> error = x.run->error()) {
    send_error(response, *error, x.run->retry_after_s());
    return;
  }
  const openai::Usage usage = x.run->usage();
  nlohmann::json body;
  if (x.chat) {
    std::vector<openai::ChatChoice> choices;
    for (const ChoiceState& c : x.run->choices())
      choices.push_back({.index = c.index,
                         .content = c.text,
                         .logprobs = logprobs_of(x, c),
                         .finish_reason = finish_reason_of(c.last)});
    body = openai::chat_completion_json(x.response, choices, usage);
  } else {
    std::vector<openai::CompletionChoice> choices;
    for (const ChoiceState& c : x.run->choices()) {
      const std::string& prompt = x.prompts[c.prompt_index].text;
      choices.push_back({.index = c.index,
                         .text = x.echo ? prompt + c.text : c.text,
                         .logprobs = logprobs_of(x, c),
                         .text_offset = x.echo ? openai::num_code_points(prompt) : 0,
                         .finish_reason = finish_reason_of(c.last)});
    }
    body = openai::completion_json(x.response, choices, usage);
  }
  send_json(response, openai::dump_json(body));
}

// The SSE provider: the whole stream in one call (httplib calls it again only if it returns
// true without calling sink.done()).
bool stream_events(Exchange& x, httplib::DataSink& sink) {
  using Clock = std::chrono::steady_clock;
  Clock::time_point last_write = Clock::now();
  auto write = [&](const std::string& event) {
    last_write = Clock::now();
    return sink.write(event.data(), event.size());
  };
  const openai::ResponseContext& rc = x.response;
  std::vector<int64_t> text_offsets(x.run->choices().size(), 0);
  for (size_t i = 0; i < x.run->choices().size(); ++i) {
    const ChoiceState& c = x.run->choices()[i];
    if (x.chat) {
      if (!write(openai::sse_event(openai::chat_role_chunk(rc, c.index, x.run->usage()))))
        return false;
    } else if (x.echo) {
      const std::string& prompt = x.prompts[c.prompt_index].text;
      if (!write(openai::sse_event(
              openai::completion_chunk(rc, c.index, prompt, std::nullopt, 0, "", {}))))
        return false;
      text_offsets[i] = openai::num_code_points(prompt);
    }
  }
  const milliseconds keepalive(static_cast<int64_t>(x.context.config->sse_keepalive_s * 1000.0));
  while (!x.run->finished()) {
    if (client_gone(x) || !sink.is_writable()) return false;
    for (ChoiceEvent& event : x.run->poll(std::min(kPollInterval, keepalive))) {
      const ChoiceState& c = x.run->choices()[event.choice];
      const runtime::RequestOutput& out = event.output;
      if (!out.error.ok() || out.aborted) {
        write(openai::sse_error(*x.run->error()));
        write(openai::sse_done());
        sink.done();
        return true;
      }
      const openai::Usage so_far = x.run->usage();
      const bool with_logprobs = x.fields.sampling.logprobs && !out.new_samples.empty();
      const std::string reason = out.finished ? finish_reason_of(out) : std::string();
      bool ok = true;
      if (x.chat) {
        if (!out.new_text.empty() || with_logprobs) {
          openai::ChatDelta delta{.content = out.new_text,
                                  .with_logprobs = x.fields.sampling.logprobs,
                                  .samples = out.new_samples};
          ok = write(openai::sse_event(openai::chat_delta_chunk(rc, c.index, delta, so_far)));
        }
        if (ok && out.finished)
          ok = write(openai::sse_event(openai::chat_finish_chunk(rc, c.index, reason, so_far)));
      } else if (!out.new_text.empty() || with_logprobs || out.finished) {
        std::optional<std::span<const runtime::SampleResult>> logprobs;
        if (x.fields.sampling.logprobs) logprobs = out.new_samples;
        ok = write(openai::sse_event(openai::completion_chunk(
            rc, c.index, out.new_text, logprobs, text_offsets[event.choice], reason, so_far)));
        text_offsets[event.choice] += openai::num_code_points(out.new_text);
      }
      if (!ok) return false;
    }
    if (!x.run->finished() && Clock::now() - last_write >= keepalive &&
        !write(openai::sse_keep_alive()))
      return false;
  }
  if (x.fields.stream_options.include_usage) {
    const openai::Usage usage = x.run->usage();
    const nlohmann::json chunk =
        x.chat ? openai::chat_usage_chunk(rc, usage) : openai::completion_usage_chunk(rc, usage);
    if (!write(openai::sse_event(chunk))) return false;
  }
  if (!write(openai::sse_done())) return false;
  sink.done();
  return true;
}

// Submits the prompts and answers, whole or streamed.
void run_exchange(std::shared_ptr<Exchange> x, const httplib::Request& request,
                  httplib::Response& response) {
  const openai::SamplingFields& f = x->fields;
  runtime::apply_generation_defaults(x->fields.sampling,
                                     {.temperature = f.temperature_set,
                                      .top_p = f.top_p_set,
                                      .top_k = f.top_k_set,
                                      .min_p = f.min_p_set,
                                      .repetition_penalty = f.repetition_penalty_set},
                                     x->context.model->defaults);
  fill_seed(x->fields);
  x->run = std::make_unique<GenerationRun>(*x->context.model, *x->context.metrics);
  if (std::optional<ApiError> error = x->run->submit(x->prompts, x->fields)) {
    send_error(response, *error, x->run->retry_after_s());
    return;
  }
  x->watch = ConnectionWatch::find(request.local_port, request.remote_addr, request.remote_port);
  if (!x->fields.stream) {
    respond_whole(*x, response);
    return;
  }
  response.set_header("Cache-Control", "no-cache");
  response.set_chunked_content_provider(
      "text/event-stream",
      [x](size_t /*offset*/, httplib::DataSink& sink) { return stream_events(*x, sink); },
      // Runs when the response is dropped, whether or not the stream completed: the run's
      // destructor cancels what is still running.
      [x](bool /*success*/) mutable { x->run.reset(); });
}

openai::ParseLimits limits_of(const HandlerContext& context) {
  openai::ParseLimits limits = context.config->limits;
  limits.vocab_size = context.model->tokenizer->vocab_size();
  return limits;
}

}  // namespace

void send_json(httplib::Response& response, const std::string& body, int status) {
  response.status = status;
  response.set_content(body, "application/json");
}

void send_error(httplib::Response& response, const ApiError& error, int retry_after_s) {
  if (retry_after_s > 0) response.set_header("Retry-After", std::to_string(retry_after_s));
  send_json(response, openai::dump_json(error.to_json()), error.http_status);
}

void handle_chat_completions(const HandlerContext& context, const httplib::Request& request,
                             httplib::Response& response) {
  auto parsed = openai::parse_chat_request(request.body, limits_of(context));
  if (auto* error = std::get_if<ApiError>(&parsed)) return send_error(response, *error);
  openai::ChatRequest& chat = std::get<openai::ChatRequest>(parsed);
  if (auto error = check_model(context, chat.fields.model)) return send_error(response, *error);

  auto built = build_chat_prompt(*context.model, chat, context.config->media);
  if (auto* error = std::get_if<ApiError>(&built)) return send_error(response, *error);
  ChatPrompt& chat_prompt = std::get<ChatPrompt>(built);
  PromptInput prompt{.token_ids = std::move(chat_prompt.token_ids),
                     .images = std::move(chat_prompt.images),
                     .max_tokens = 0,
                     .text = {}};
  auto max_tokens =
      resolve_max_tokens(*context.model, static_cast<int64_t>(prompt.token_ids.size()),
                         chat.fields.max_tokens, /*chat=*/true, "messages");
  if (auto* error = std::get_if<ApiError>(&max_tokens)) return send_error(response, *error);
  prompt.max_tokens = std::get<int64_t>(max_tokens);

  auto x = std::make_shared<Exchange>();
  x->context = context;
  x->chat = true;
  x->fields = std::move(chat.fields);
  x->prompts.push_back(std::move(prompt));
  x->response = response_context(*x, "chatcmpl-");
  run_exchange(std::move(x), request, response);
}

void handle_completions(const HandlerContext& context, const httplib::Request& request,
                        httplib::Response& response) {
  auto parsed = openai::parse_completion_request(request.body, limits_of(context));
  if (auto* error = std::get_if<ApiError>(&parsed)) return send_error(response, *error);
  openai::CompletionRequest& completion = std::get<openai::CompletionRequest>(parsed);
  if (auto error = check_model(context, completion.fields.model))
    return send_error(response, *error);

  auto x = std::make_shared<Exchange>();
  x->context = context;
  x->echo = completion.echo;
  for (const openai::CompletionPrompt& p : completion.prompts) {
    PromptInput prompt;
    if (const auto* text = std::get_if<std::string>(&p)) {
      auto ids = encode_prompt(*context.model, *text, /*chat=*/false, "prompt");
      if (auto* error = std::get_if<ApiError>(&ids)) return send_error(response, *error);
      prompt.token_ids = std::move(std::get<std::vector<int32_t>>(ids));
      prompt.text = *text;
    } else {
      prompt.token_ids = std::get<std::vector<int32_t>>(p);
      prompt.text = context.model->tokenizer->decode(prompt.token_ids);
    }
    auto max_tokens =
        resolve_max_tokens(*context.model, static_cast<int64_t>(prompt.token_ids.size()),
                           completion.fields.max_tokens, /*chat=*/false, "prompt");
    if (auto* error = std::get_if<ApiError>(&max_tokens)) return send_error(response, *error);
    prompt.max_tokens = std::get<int64_t>(max_tokens);
    x->prompts.push_back(std::move(prompt));
  }
  x->fields = std::move(completion.fields);
  x->response = response_context(*x, "cmpl-");
  run_exchange(std::move(x), request, response);
}

}  // namespace dz::serve::http
