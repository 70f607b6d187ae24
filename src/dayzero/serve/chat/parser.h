#pragma once
// Recursive-descent parser from lexer tokens to the syntax tree, with Jinja's operator
// precedence (if-else < or < and < not < comparisons < ~ < + - < * / // % < ** < unary <
// filters and tests < postfix). Nesting is bounded so hostile templates fail cleanly.

#include <string_view>

#include "dayzero/core/status.h"
#include "dayzero/serve/chat/ast.h"
#include "dayzero/serve/chat/lexer.h"

namespace dz::serve::chat {

inline constexpr int kMaxParseDepth = 128;   // nested blocks and bracketed expressions
inline constexpr int kMaxExprHeight = 1024;  // height of one expression's tree

Result<Body> parse_template(std::string_view source);

}  // namespace dz::serve::chat
