// libFuzzer target: any bytes as a chat template. Parsing must fail cleanly or succeed, and a
// parsed template must render (or fail) within the step and output bounds, against a small
// conversation, with ASan and UBSan watching.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dayzero/serve/chat/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using dz::serve::chat::Template;
  using dz::serve::chat::Value;
  std::string_view source(reinterpret_cast<const char*>(data), size);
  dz::Result<Template> tmpl = Template::parse(source);
  if (!tmpl.ok()) return 0;
  static const Value context = Value::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi é"},
                 {"role": "assistant", "content": "yo", "tool_calls": [{"id": "c1", "type": "function",
                  "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
                 {"role": "user", "content": [{"type": "text", "text": "part"}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  dz::serve::chat::RenderOptions options;
  options.max_steps = 200'000;
  options.max_output_bytes = 1 << 20;
  options.max_range_elems = 10'000;
  options.now = 1700000000;
  dz::Result<std::string> out = tmpl->render(context, options);
  (void)out;
  return 0;
}
