// libFuzzer target: arbitrary bytes as the body of POST /v1/chat/completions and /v1/completions
// (docs/serving.md §5.2, §5.4). Every input must come back as a request or an ApiError with a 4xx
// status, and either must serialise: never a crash, an exception, a hang or an unbounded
// allocation.

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include "dayzero/serve/openai/chat_request.h"
#include "dayzero/serve/openai/completion_request.h"

namespace {

using dz::serve::openai::ApiError;

void check_error(const ApiError& error) {
  if (error.http_status != 400 || error.message.empty()) __builtin_trap();
  (void)error.to_json().dump();  // throws (and so aborts) on invalid UTF-8
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  // Small limits so the fuzzer reaches every limit check; a vocabulary to check token ids.
  const dz::serve::openai::ParseLimits limits{.max_messages = 8,
                                              .max_tools = 4,
                                              .max_prompts = 4,
                                              .max_n = 4,
                                              .max_stop_strings = 4,
                                              .max_stop_string_bytes = 16,
                                              .max_stop_token_ids = 8,
                                              .max_logit_bias = 8,
                                              .max_json_depth = 32,
                                              .vocab_size = 1000};

  auto chat = dz::serve::openai::parse_chat_request(body, limits);
  if (const auto* error = std::get_if<ApiError>(&chat)) {
    check_error(*error);
  } else {
    const auto& request = std::get<dz::serve::openai::ChatRequest>(chat);
    if (request.messages.empty() ||
        static_cast<int64_t>(request.messages.size()) > limits.max_messages)
      __builtin_trap();
    if (request.fields.n < 1 || request.fields.n > limits.max_n) __builtin_trap();
    (void)dz::serve::openai::messages_to_json(request.messages).dump();
  }

  auto completion = dz::serve::openai::parse_completion_request(body, limits);
  if (const auto* error = std::get_if<ApiError>(&completion)) {
    check_error(*error);
  } else {
    const auto& request = std::get<dz::serve::openai::CompletionRequest>(completion);
    if (request.prompts.empty()) __builtin_trap();
    for (const auto& prompt : request.prompts)
      if (const auto* ids = std::get_if<std::vector<int32_t>>(&prompt))
        for (int32_t id : *ids)
          if (id < 0 || id >= limits.vocab_size) __builtin_trap();
  }
  return 0;
}
