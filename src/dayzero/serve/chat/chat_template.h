#pragma once
// A checkpoint's Hugging Face chat template: chat_template.jinja when present (transformers
// prefers it), else tokenizer_config.json's `chat_template` (a string, or a list of
// {name, template} where "default" is used),
// with its bos/eos tokens, and rendered as transformers' apply_chat_template does.
//
// Content parts: a message whose `content` is a list of parts is passed unchanged to templates
// that loop over content (Kimi's render_content); for the others, a list of text parts only is
// flattened to one string, the texts joined with "\n" (vLLM's "string" content format). Lists
// holding image parts are left as lists for now (docs/serving.md §5.6 adds images).

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "dayzero/core/status.h"
#include "dayzero/serve/chat/jinja.h"

namespace dz::serve::chat {

class ChatTemplate {
 public:
  static Result<ChatTemplate> load(const std::filesystem::path& model_dir);
  static Result<ChatTemplate> from_source(std::string source, std::string bos_token,
                                          std::string eos_token);

  // `messages`: the OpenAI messages array; `tools`: an array or null (then `tools` is
  // undefined in the template); `extra_vars`: an object of further variables
  // (chat_template_kwargs), which may not replace messages, tools or add_generation_prompt.
  Result<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                             const nlohmann::ordered_json& tools = nullptr,
                             const nlohmann::ordered_json& extra_vars = nullptr,
                             const RenderOptions& options = {}) const;

  const std::string& source() const { return source_; }
  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }
  // Whether the template loops over message content itself (then parts are passed unchanged).
  bool takes_content_parts() const { return takes_content_parts_; }

 private:
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  bool takes_content_parts_ = false;
  Template template_;
};

// Flattens text-only content-part lists to strings (the rule above); used by render().
nlohmann::ordered_json flatten_text_parts(const nlohmann::ordered_json& messages);

}  // namespace dz::serve::chat
