#include "dayzero/serve/openai/response_common.h"

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "dayzero/runtime/utf8_stream.h"

namespace dz::serve::openai {

nlohmann::json usage_json(const Usage& usage) {
  return {{"prompt_tokens", usage.prompt_tokens},
          {"completion_tokens", usage.completion_tokens},
          {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", usage.cached_tokens}}}};
}

std::string make_response_id(std::string_view prefix) {
  // A fresh random_device per id: no shared generator to lock, and ids need no reproducibility.
  std::random_device device;
  std::string id(prefix);
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", device());
  return id;
}

TokenText token_text(const runtime::TokenBytesFn& token_bytes, int32_t token) {
  std::optional<std::string> bytes = token_bytes ? token_bytes(token) : std::nullopt;
  if (!bytes) return {};
  return {.text = runtime::replace_invalid_utf8(*bytes), .bytes = std::move(*bytes)};
}

double json_logprob(float logprob) {
  if (std::isnan(logprob) || logprob < -9999.0f) return -9999.0;
  return static_cast<double>(logprob);
}

int64_t num_code_points(std::string_view text) {
  int64_t count = 0;
  for (char c : text) count += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  return count;
}

void add_chunk_usage(nlohmann::json& chunk, const StreamOptions& options, const Usage& so_far) {
  if (!options.include_usage) return;
  chunk["usage"] = options.continuous_usage_stats ? usage_json(so_far) : nlohmann::json(nullptr);
}

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string sse_event(const nlohmann::json& data) {
  return "data: " + dump_json(data) + "\n\n";
}

std::string sse_done() {
  return "data: [DONE]\n\n";
}

std::string sse_keep_alive() {
  return ": keep-alive\n\n";
}

std::string sse_error(const ApiError& error) {
  return sse_event(error.to_json());
}

}  // namespace dz::serve::openai
