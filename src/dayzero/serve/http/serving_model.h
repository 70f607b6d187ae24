#pragma once
// What the server holds once the checkpoint is loaded: model, tokenizer, chat format, engine, and
// the prompt building of both endpoints (chat template or DeepSeek-V3.2 encoder, tokenizing, the
// context-length checks of docs/serving.md §2.3).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "dayzero/model/causal_lm.h"
#include "dayzero/model/vision/image_input.h"
#include "dayzero/runtime/engine.h"
#include "dayzero/runtime/generation_config.h"
#include "dayzero/serve/chat/chat_template.h"
#include "dayzero/serve/openai/chat_request.h"
#include "dayzero/serve/openai/completion_request.h"
#include "dayzero/serve/server.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::serve::http {

struct ServingModel {
  // Declaration order is destruction order reversed: the engine (which reads the model and the
  // tokenizer's bytes) goes first.
  std::unique_ptr<model::CausalLm> model;
  std::unique_ptr<Tokenizer> tokenizer;
  runtime::GenerationDefaults defaults;
  std::optional<chat::ChatTemplate>
      chat_template;                // HF Jinja template, when the checkpoint has one
  bool dsv32_encoder = false;       // model_type deepseek_v32: the fixed encoder
  std::string chat_template_error;  // why chat is unavailable, if it is
  int64_t max_model_len = 0;
  // The model takes images (config.json has a vision_config): how the frontend inspects them and
  // which token marks their place (docs/serving.md §5.6).
  std::optional<model::ImageInputConfig> image_input;
  runtime::TokenBytesFn token_bytes;
  // In process: a runtime::Engine over `model`; supervised: the worker group's supervisor (and
  // `model` stays null here).
  std::unique_ptr<runtime::EngineClient> engine;
};

// Tokenizer, defaults and chat format from config.model_dir, then the engine: config.start_workers
// when set, else the model from config.load_model and an Engine over it.
// on_engine_fatal: what a supervised engine calls when it gives up (the server stops).
Result<std::unique_ptr<ServingModel>> load_serving_model(
    const ServerConfig& config, std::function<void(const Status&)> on_engine_fatal = {});

// The chat prompt's text: the DeepSeek-V3.2 encoder, or the Jinja template (tools and
// chat_template_kwargs passed through; continue_final_message leaves the last message open).
// 400 when the model has no chat format or the template refuses the messages.
std::variant<std::string, openai::ApiError> render_chat(const ServingModel& m,
                                                        const openai::ChatRequest& request);

// Tokens of a prompt (chat text with special tokens parsed; completions as `dayzero generate`
// encodes them, BOS prepended when tokenizer_config.json asks for it).
std::variant<std::vector<int32_t>, openai::ApiError> encode_prompt(const ServingModel& m,
                                                                   const std::string& text,
                                                                   bool chat, const char* param);

// max_tokens for a prompt: the request's (checked against the context) or the default (the rest of
// the context for chat, min(16, rest) for completions). 400 context_length_exceeded when the
// prompt leaves no room.
std::variant<int64_t, openai::ApiError> resolve_max_tokens(const ServingModel& m,
                                                           int64_t num_prompt_tokens,
                                                           std::optional<int64_t> requested,
                                                           bool chat, const char* param);

}  // namespace dz::serve::http
