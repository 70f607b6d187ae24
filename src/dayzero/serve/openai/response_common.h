#pragma once
// Pieces shared by the chat and completions responses (docs/serving.md §5.2–§5.3): the per-response
// context, usage, token strings for logprobs, and the SSE framing.

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "dayzero/runtime/engine_types.h"
#include "dayzero/serve/openai/api_error.h"
#include "dayzero/serve/openai/sampling_fields.h"

namespace dz::serve::openai {

// What every body and chunk of one response repeats, plus how to spell tokens.
struct ResponseContext {
  std::string id = {};     // make_response_id("chatcmpl-") or ("cmpl-"); one id for all chunks
  int64_t created = 0;     // Unix seconds at arrival
  std::string model = {};  // as the client named it
  // Chunks only: include_usage puts "usage": null on every chunk (the running usage with
  // continuous_usage_stats); without it chunks have no "usage" key at all, since strict clients
  // reject one they did not ask for.
  StreamOptions stream_options = {};
  runtime::TokenBytesFn token_bytes =
      {};  // logprobs' token strings and bytes; may be empty otherwise
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served by the prefix cache
};

// {"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details":{"cached_tokens"}}
nlohmann::json usage_json(const Usage& usage);

// prefix followed by 32 random hex digits ("chatcmpl-3f0c…").
std::string make_response_id(std::string_view prefix);

// A token as logprobs show it: its bytes as text (invalid UTF-8, e.g. half a character, becomes
// U+FFFD) and the exact bytes. An id without bytes gives "" and no bytes.
struct TokenText {
  std::string text = {};
  std::string bytes = {};
};
TokenText token_text(const runtime::TokenBytesFn& token_bytes, int32_t token);

// A log-probability JSON can carry: -inf (a token of probability 0) becomes -9999, as vLLM does.
double json_logprob(float logprob);

// Number of Unicode code points in UTF-8 text (Python's len), the unit of completions'
// text_offset.
int64_t num_code_points(std::string_view text);

// Adds the "usage" key of a streamed chunk as ResponseContext::stream_options asks.
void add_chunk_usage(nlohmann::json& chunk, const StreamOptions& options, const Usage& so_far);

// SSE framing (§5.3). Invalid UTF-8 in strings is replaced, never thrown on.
std::string sse_event(const nlohmann::json& data);  // "data: <json>\n\n"
std::string sse_done();                             // "data: [DONE]\n\n"
std::string sse_keep_alive();                       // ": keep-alive\n\n"
// An error after the stream began: its {"error":{...}} as one event (then send sse_done()).
std::string sse_error(const ApiError& error);

// A JSON body as text; invalid UTF-8 in strings is replaced, never thrown on.
std::string dump_json(const nlohmann::json& value);

}  // namespace dz::serve::openai
