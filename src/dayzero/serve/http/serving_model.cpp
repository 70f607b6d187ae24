#include "dayzero/serve/http/serving_model.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dayzero/core/logging.h"
#include "dayzero/model/registry.h"
#include "dayzero/serve/chat/dsv32_encoder.h"

namespace dz::serve::http {
namespace {

using openai::ApiError;

constexpr int64_t kDefaultCompletionMaxTokens = 16;  // OpenAI's default for /v1/completions

nlohmann::ordered_json to_ordered(const nlohmann::json& value) {
  return nlohmann::ordered_json::parse(
      value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

}  // namespace

Result<std::unique_ptr<ServingModel>> load_serving_model(
    const ServerConfig& config, std::function<void(const Status&)> on_engine_fatal) {
  auto m = std::make_unique<ServingModel>();
  DZ_ASSIGN_OR_RETURN(m->tokenizer, load_tokenizer(config.model_dir));
  DZ_ASSIGN_OR_RETURN(m->defaults, runtime::load_generation_defaults(config.model_dir));
  if (model::chat_encoding_of(config.model_dir) == model::ChatEncoding::kDeepseekV32) {
    m->dsv32_encoder = true;
  } else {
    Result<chat::ChatTemplate> tmpl = chat::ChatTemplate::load(config.model_dir);
    if (tmpl.ok()) {
      m->chat_template = std::move(*tmpl);
    } else {
      m->chat_template_error = tmpl.status().to_string();
      spdlog::warn("no chat template ({}): /v1/chat/completions will answer 400",
                   m->chat_template_error);
    }
  }
  DZ_ASSIGN_OR_RETURN(m->image_input, model::load_image_input_config(config.model_dir));
  runtime::EngineConfig engine = config.engine;
  if (engine.eos_token_ids.empty()) engine.eos_token_ids = m->defaults.eos_token_ids;
  const Tokenizer* tokenizer = m->tokenizer.get();
  m->token_bytes = [tokenizer](int32_t id) -> std::optional<std::string> {
    std::optional<std::string_view> bytes = tokenizer->token_bytes(id);
    if (!bytes) return std::nullopt;
    return std::string(*bytes);
  };
  if (!engine.token_bytes) engine.token_bytes = m->token_bytes;
  if (engine.model_identity.empty()) engine.model_identity = config.model_dir;
  m->max_model_len = engine.max_model_len;
  if (config.start_workers) {
    DZ_ASSIGN_OR_RETURN(m->engine, config.start_workers(std::move(on_engine_fatal)));
    return m;
  }
  DZ_ASSIGN_OR_RETURN(m->model, config.load_model());
  DZ_ASSIGN_OR_RETURN(m->engine, runtime::Engine::create(*m->model, config.exec, engine));
  if (engine.speculative.enabled()) {
    const runtime::SpeculativeConfig& spec = engine.speculative;
    spdlog::info(
        "speculative decoding: {} with up to {} drafts (prompt lookup {}..{}), none while more "
        "than {} requests run; rollback keeps {:.1f} MiB",
        runtime::method_name(spec.method), spec.num_speculative_tokens(), spec.ngram.min_n,
        spec.ngram.max_n, spec.disable_by_batch_size,
        static_cast<double>(m->engine->metrics().spec_rollback_bytes) / (1 << 20));
  }
  return m;
}

std::variant<std::string, ApiError> render_chat(const ServingModel& m,
                                                const openai::ChatRequest& request) {
  const nlohmann::ordered_json messages = to_ordered(openai::messages_to_json(request.messages));
  if (m.dsv32_encoder) {
    chat::Dsv32EncodeOptions options;
    const nlohmann::json& kwargs = request.chat_template_kwargs;
    if (kwargs.is_object()) {
      for (const char* key : {"thinking", "enable_thinking"}) {
        const auto it = kwargs.find(key);
        if (it != kwargs.end() && it->is_boolean()) options.thinking = it->get<bool>();
      }
    }
    Result<std::string> text = chat::encode_dsv32_messages(messages, options);
    if (!text.ok()) return ApiError::invalid_value("messages", text.status().message());
    return std::move(*text);
  }
  if (!m.chat_template)
    return ApiError::invalid_value(
        "messages", fmt::format("This model has no chat template, so /v1/chat/completions is "
                                "unavailable; use /v1/completions ({}).",
                                m.chat_template_error));
  const bool open_last = request.continue_final_message;
  const nlohmann::ordered_json tools =
      request.tools.is_null() ? nlohmann::ordered_json() : to_ordered(request.tools);
  const nlohmann::ordered_json kwargs = to_ordered(request.chat_template_kwargs);
  Result<std::string> text =
      m.chat_template->render(messages, request.add_generation_prompt && !open_last, tools, kwargs);
  if (!text.ok()) return ApiError::invalid_value("messages", text.status().message());
  if (open_last) {
    // vLLM's rule: cut the rendering right after the final message's content.
    const std::optional<std::string>& last = request.messages.back().content;
    const size_t at = last && !last->empty() ? text->rfind(*last) : std::string::npos;
    if (at == std::string::npos)
      return ApiError::invalid_value("continue_final_message",
                                     "The final message's content was not found in the rendered "
                                     "prompt, so it cannot be continued.");
    text->resize(at + last->size());
  }
  return std::move(*text);
}

std::variant<std::vector<int32_t>, ApiError> encode_prompt(const ServingModel& m,
                                                           const std::string& text, bool chat,
                                                           const char* param) {
  Result<std::vector<int32_t>> ids = m.tokenizer->encode(text);
  if (!ids.ok()) return ApiError::invalid_value(param, ids.status().message());
  if (!chat && m.defaults.add_bos_token && m.defaults.bos_token_id)
    ids->insert(ids->begin(), *m.defaults.bos_token_id);
  if (ids->empty()) return ApiError::invalid_value(param, "The prompt encodes to no tokens.");
  return std::move(*ids);
}

std::variant<int64_t, ApiError> resolve_max_tokens(const ServingModel& m, int64_t num_prompt_tokens,
                                                   std::optional<int64_t> requested, bool chat,
                                                   const char* param) {
  const int64_t room = m.max_model_len - num_prompt_tokens;
  if (room < 1)
    return ApiError::context_length_exceeded(
        param, fmt::format("This model's maximum context length is {} tokens. However, your "
                           "prompt has {} tokens, which leaves no room for a completion.",
                           m.max_model_len, num_prompt_tokens));
  if (requested) {
    if (*requested > room)
      return ApiError::context_length_exceeded(
          param, fmt::format("This model's maximum context length is {} tokens. However, you "
                             "requested {} tokens ({} in the prompt, {} for the completion).",
                             m.max_model_len, num_prompt_tokens + *requested, num_prompt_tokens,
                             *requested));
    return *requested;
  }
  return chat ? room : std::min(room, kDefaultCompletionMaxTokens);
}

}  // namespace dz::serve::http
