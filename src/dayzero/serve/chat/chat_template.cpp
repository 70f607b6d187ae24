// ChatTemplate: loading from a checkpoint directory and rendering with HF's variables.

#include "dayzero/serve/chat/chat_template.h"

#include <fstream>
#include <sstream>

namespace dz::serve::chat {
namespace {

Result<std::string> read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return make_error(StatusCode::kIo, "cannot read {}", path.string());
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

// bos_token / eos_token: a string, or an AddedToken object {"content": ...}, or absent.
std::string token_text(const nlohmann::ordered_json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

// Whether an expression reads a message's content: x.content, x['content'], x.get('content').
bool mentions_content(const Expr& expr) {
  if (expr.kind == Expr::Kind::kAttr && expr.name == "content") return true;
  if (expr.kind == Expr::Kind::kLiteral && expr.literal.is_string() &&
      expr.literal.as_string() == "content")
    return true;
  for (const ExprPtr& child : expr.args)
    if (child && mentions_content(*child)) return true;
  return false;
}

// A for loop over content, directly or through a name set from content (Kimi's
// `set c = msg.get('content')` then `for content in c`).
bool loops_over_content(const Body& body, std::vector<std::string>& content_names) {
  for (const StmtPtr& stmt : body) {
    if (stmt->kind == Stmt::Kind::kSet && stmt->expr && stmt->names.size() == 1 &&
        stmt->attr.empty() && mentions_content(*stmt->expr))
      content_names.push_back(stmt->names[0]);
    if (stmt->kind == Stmt::Kind::kFor) {
      const Expr& iter = *stmt->expr;
      if (mentions_content(iter)) return true;
      if (iter.kind == Expr::Kind::kName)
        for (const std::string& name : content_names)
          if (name == iter.name) return true;
    }
    for (const Body& inner : stmt->bodies)
      if (loops_over_content(inner, content_names)) return true;
  }
  return false;
}

}  // namespace

nlohmann::ordered_json flatten_text_parts(const nlohmann::ordered_json& messages) {
  nlohmann::ordered_json out = messages;
  if (!out.is_array()) return out;
  for (auto& message : out) {
    if (!message.is_object()) continue;
    auto content = message.find("content");
    if (content == message.end() || !content->is_array()) continue;
    std::string joined;
    bool text_only = true;
    for (size_t i = 0; i < content->size(); ++i) {
      const auto& part = (*content)[i];
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        text_only = false;
        break;
      }
      if (i) joined += "\n";
      joined += part["text"].get<std::string>();
    }
    if (text_only) *content = joined;
  }
  return out;
}

Result<ChatTemplate> ChatTemplate::from_source(std::string source, std::string bos_token,
                                               std::string eos_token) {
  ChatTemplate chat;
  DZ_ASSIGN_OR_RETURN(chat.template_, Template::parse(source));
  std::vector<std::string> content_names;
  chat.takes_content_parts_ = loops_over_content(chat.template_.body(), content_names);
  chat.source_ = std::move(source);
  chat.bos_token_ = std::move(bos_token);
  chat.eos_token_ = std::move(eos_token);
  return chat;
}

Result<ChatTemplate> ChatTemplate::load(const std::filesystem::path& model_dir) {
  const std::filesystem::path config_path = model_dir / "tokenizer_config.json";
  nlohmann::ordered_json config = nlohmann::ordered_json::object();
  if (std::filesystem::exists(config_path)) {
    DZ_ASSIGN_OR_RETURN(std::string text, read_file(config_path));
    config = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object())
      return make_error(StatusCode::kCorrupt, "tokenizer_config.json is not a JSON object")
          .with_context(config_path.string());
  }
  // transformers reads chat_template.jinja when the checkpoint has one, over the config's field.
  std::string source;
  auto it = config.find("chat_template");
  if (std::filesystem::exists(model_dir / "chat_template.jinja")) {
    DZ_ASSIGN_OR_RETURN(source, read_file(model_dir / "chat_template.jinja"));
  } else if (it != config.end() && it->is_string()) {
    source = it->get<std::string>();
  } else if (it != config.end() && it->is_array()) {
    bool found = false;
    for (const auto& named : *it) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        source = named["template"].get<std::string>();
        found = true;
      }
    }
    if (!found)
      return make_error(StatusCode::kNotFound, "chat_template list has no \"default\" template")
          .with_context(config_path.string());
  } else {
    return make_error(StatusCode::kNotFound,
                      "{} has no chat template (tokenizer_config.json chat_template or "
                      "chat_template.jinja)",
                      model_dir.string());
  }
  Result<ChatTemplate> chat = from_source(std::move(source), token_text(config, "bos_token"),
                                          token_text(config, "eos_token"));
  if (!chat.ok()) return chat.status().with_context("chat template of " + model_dir.string());
  return chat;
}

Result<std::string> ChatTemplate::render(const nlohmann::ordered_json& messages,
                                         bool add_generation_prompt,
                                         const nlohmann::ordered_json& tools,
                                         const nlohmann::ordered_json& extra_vars,
                                         const RenderOptions& options) const {
  if (!messages.is_array())
    return make_error(StatusCode::kInvalidArgument, "messages must be an array");
  Value context = Value::object();
  if (extra_vars.is_object()) {
    for (auto it = extra_vars.begin(); it != extra_vars.end(); ++it) {
      if (it.key() == "messages" || it.key() == "tools" || it.key() == "add_generation_prompt")
        return make_error(StatusCode::kInvalidArgument, "chat_template_kwargs may not set '{}'",
                          it.key());
      context.set(it.key(), Value::from_json(it.value()));
    }
  }
  context.set("messages",
              Value::from_json(takes_content_parts_ ? messages : flatten_text_parts(messages)));
  if (!tools.is_null()) context.set("tools", Value::from_json(tools));
  context.set("add_generation_prompt", Value::boolean(add_generation_prompt));
  if (!context.find("bos_token")) context.set("bos_token", Value::string(bos_token_));
  if (!context.find("eos_token")) context.set("eos_token", Value::string(eos_token_));
  return template_.render(context, options);
}

}  // namespace dz::serve::chat
