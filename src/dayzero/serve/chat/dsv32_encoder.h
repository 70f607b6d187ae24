#pragma once
// DeepSeek-V3.2's prompt format. The checkpoint ships no Jinja template but a Python encoder,
// encoding/encoding_dsv32.py in huggingface.co/deepseek-ai/DeepSeek-V3.2 (read through its
// copies in sgl-project/sglang: python/sglang/srt/entrypoints/openai/encoding_dsv32.py, "Adapted
// from" that file, and vLLM's "copy from" it); this is a C++ port of encode_messages().
//
// Modes, as vLLM's DeepseekV32Tokenizer.apply_chat_template calls it: "chat" unless the request
// asks for thinking (chat_template_kwargs {"thinking": true}); drop_thinking on (reasoning of
// assistant turns before the last user turn is dropped); a BOS first. The generation prompt is
// part of every user turn (`<｜Assistant｜>` then `</think>` in chat mode, or `<think>` after the
// last user turn in thinking mode), so there is no add_generation_prompt switch.
//
// Assistant reasoning is read from `reasoning_content` (the upstream key; vLLM's copy renamed it
// `reasoning`). Tools (on a system or developer message), tool calls, tool results and
// response_format render as upstream; a tool message with no assistant before it is refused
// (upstream would read messages[-1]).

#include <string>

#include <nlohmann/json.hpp>

#include "dayzero/core/status.h"

namespace dz::serve::chat {

struct Dsv32EncodeOptions {
  bool thinking = false;  // thinking_mode "thinking" (else "chat")
  bool drop_thinking = true;
  bool add_default_bos_token = true;
};

Result<std::string> encode_dsv32_messages(const nlohmann::ordered_json& messages,
                                          const Dsv32EncodeOptions& options = {});

}  // namespace dz::serve::chat
