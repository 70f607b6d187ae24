// `dayzero chat-template`: renders a chat prompt the way the server will, from the command line,
// and serves as the entry point of the @huggingface/jinja comparison test
// (python/tests/test_chat_templates.py).
//
//   --model DIR --messages FILE.json [--tools FILE.json] [--add-generation-prompt]
//       [--kwargs JSON] [--thinking]: prints the prompt (DeepSeek-V3.2 checkpoints, by their
//       config.json model_type, go through the ported encoder; others through their template).
//   --batch FILE.json: [{"template", "context"}...] → [{"ok", "text" | "error"}...] on stdout.

#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dayzero/cli/commands.h"
#include "dayzero/model/registry.h"
#include "dayzero/serve/chat/chat_template.h"
#include "dayzero/serve/chat/dsv32_encoder.h"
#include "dayzero/serve/chat/jinja.h"

namespace dz::cli {
namespace {

using Json = nlohmann::ordered_json;

struct ChatTemplateArgs {
  std::string model_dir;
  std::string messages_path;
  std::string tools_path;
  std::string batch_path;
  std::string kwargs_json;
  bool add_generation_prompt = false;
  bool thinking = false;
};

Result<Json> read_json(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return make_error(StatusCode::kIo, "cannot read {}", path);
  std::stringstream text;
  text << file.rdbuf();
  Json json = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return make_error(StatusCode::kInvalidArgument, "{} is not JSON", path);
  return json;
}

int fail(const Status& status) {
  std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
  return 1;
}

int run_batch(const ChatTemplateArgs& args) {
  Result<Json> cases = read_json(args.batch_path);
  if (!cases.ok()) return fail(cases.status());
  if (!cases->is_array())
    return fail(make_error(StatusCode::kInvalidArgument, "batch must be an array"));
  Json out = Json::array();
  serve::chat::RenderOptions options;
  options.now = 1700000000;  // 2023-11-14: renders that call strftime_now() stay comparable
  for (const Json& item : *cases) {
    Result<std::string> text =
        make_error(StatusCode::kInvalidArgument, "case needs template and context");
    if (item.is_object() && item.contains("template") && item["template"].is_string()) {
      Result<serve::chat::Template> tmpl =
          serve::chat::Template::parse(item["template"].get<std::string>());
      if (!tmpl.ok()) {
        text = tmpl.status();
      } else {
        serve::chat::Value context = serve::chat::Value::from_json(
            item.contains("context") ? item["context"] : Json::object());
        text = tmpl->render(context, options);
      }
    }
    if (text.ok()) {
      out.push_back({{"ok", true}, {"text", *text}});
    } else {
      out.push_back({{"ok", false}, {"error", text.status().message()}});
    }
  }
  std::puts(out.dump(-1, ' ', false, Json::error_handler_t::replace).c_str());
  return 0;
}

bool is_deepseek_v32(const std::string& model_dir) {
  return model::chat_encoding_of(model_dir) == model::ChatEncoding::kDeepseekV32;
}

int run_chat_template(const ChatTemplateArgs& args) {
  if (!args.batch_path.empty()) return run_batch(args);
  if (args.model_dir.empty() || args.messages_path.empty())
    return fail(make_error(StatusCode::kInvalidArgument, "--model and --messages are required"));
  Result<Json> messages = read_json(args.messages_path);
  if (!messages.ok()) return fail(messages.status());
  Json tools = nullptr;
  if (!args.tools_path.empty()) {
    Result<Json> loaded = read_json(args.tools_path);
    if (!loaded.ok()) return fail(loaded.status());
    tools = std::move(*loaded);
  }
  Result<std::string> prompt = std::string();
  if (is_deepseek_v32(args.model_dir)) {
    if (!tools.is_null() && !tools.empty()) {
      // vLLM's DeepseekV32Tokenizer: tools go on a system message placed first.
      messages->insert(messages->begin(), Json{{"role", "system"}, {"tools", tools}});
    }
    prompt = serve::chat::encode_dsv32_messages(*messages, {.thinking = args.thinking});
  } else {
    Result<serve::chat::ChatTemplate> chat = serve::chat::ChatTemplate::load(args.model_dir);
    if (!chat.ok()) return fail(chat.status());
    Json kwargs = Json::object();
    if (!args.kwargs_json.empty()) {
      kwargs = Json::parse(args.kwargs_json, nullptr, /*allow_exceptions=*/false);
      if (!kwargs.is_object())
        return fail(make_error(StatusCode::kInvalidArgument, "--kwargs is not a JSON object"));
    }
    prompt = chat->render(*messages, args.add_generation_prompt, tools, kwargs);
  }
  if (!prompt.ok()) return fail(prompt.status());
  std::fwrite(prompt->data(), 1, prompt->size(), stdout);
  return 0;
}

}  // namespace

RunCommand add_chat_template_command(CLI::App& app) {
  auto args = std::make_shared<ChatTemplateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "chat-template", "Render a chat prompt with the checkpoint's chat template (or its encoder)");
  cmd->add_option("--model", args->model_dir, "checkpoint directory");
  cmd->add_option("--messages", args->messages_path, "JSON file: the OpenAI messages array");
  cmd->add_option("--tools", args->tools_path, "JSON file: the OpenAI tools array");
  cmd->add_flag("--add-generation-prompt", args->add_generation_prompt,
                "end with the assistant turn's header");
  cmd->add_option("--kwargs", args->kwargs_json, "chat_template_kwargs as a JSON object");
  cmd->add_flag("--thinking", args->thinking, "DeepSeek-V3.2: thinking mode");
  cmd->add_option("--batch", args->batch_path,
                  "JSON file of {template, context} cases; prints [{ok, text|error}]");
  return [args] { return run_chat_template(*args); };
}

}  // namespace dz::cli
