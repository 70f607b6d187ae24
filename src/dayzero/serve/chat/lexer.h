#pragma once
// Splits a Jinja template into text and the tokens of its tags, applying whitespace control as
// Hugging Face renders chat templates: `{%-`/`-%}` strip, trim_blocks and lstrip_blocks on, and
// newlines of the source normalized to \n and its one trailing newline dropped (jinja2's
// newline_sequence and keep_trailing_newline=False).

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::serve::chat {

enum class TokenKind : uint8_t {
  kText,        // literal template text (after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,
  kInt,
  kFloat,
  kOperator,  // punctuation and operators: ( ) [ ] { } . , : | ~ + - * / // % ** == != < <= > >= =
  kEof,
};

struct Token {
  TokenKind kind;
  std::string text;  // text, name, operator, or the decoded string literal
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

struct LexLimits {
  size_t max_source_bytes = 4 << 20;
  size_t max_tokens = 1 << 20;
};

Result<std::vector<Token>> lex_template(std::string_view source, const LexLimits& limits = {});

}  // namespace dz::serve::chat
