// Jinja statements and expressions to the syntax tree (see parser.h for the precedence).

#include "dayzero/serve/chat/parser.h"

#include <algorithm>
#include <initializer_list>

namespace dz::serve::chat {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Result<Body> parse_root() {
    std::string end_tag;
    DZ_ASSIGN_OR_RETURN(Body body, parse_body({}, end_tag));
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    size_t i = std::min(pos_ + ahead, tokens_.size() - 1);
    return tokens_[i];
  }
  const Token& next() {
    const Token& token = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return token;
  }
  bool is_op(std::string_view op, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kOperator && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, size_t ahead = 0) const {
    return peek(ahead).kind == TokenKind::kName && peek(ahead).text == name;
  }
  bool accept_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  Status error_at(const Token& token, std::string_view what) const {
    return make_error(StatusCode::kInvalidArgument, "template line {} column {}: {}", token.line,
                      token.column, what);
  }
  Status expect_op(std::string_view op) {
    if (accept_op(op)) return {};
    return error_at(peek(), fmt::format("expected '{}', found '{}'", op, peek().text));
  }
  Result<std::string> expect_name() {
    if (peek().kind != TokenKind::kName)
      return error_at(peek(), fmt::format("expected a name, found '{}'", peek().text));
    return next().text;
  }
  Status expect_block_end() {
    if (peek().kind == TokenKind::kBlockEnd) {
      next();
      return {};
    }
    return error_at(peek(), fmt::format("expected '%}}', found '{}'", peek().text));
  }
  // Left-deep chains (1+1+…, x|f|f…, x.a.a…) grow the tree without recursing in the parser;
  // their height is bounded here so evaluation and destruction stay shallow.
  Status seal(Expr& expr) {
    for (const ExprPtr& child : expr.args)
      if (child) expr.depth = std::max(expr.depth, child->depth + 1);
    for (const auto& [key, child] : expr.kwargs)
      expr.depth = std::max(expr.depth, child->depth + 1);
    if (expr.depth > kMaxExprHeight) return error_at(peek(), "expression nested too deeply");
    return {};
  }

  ExprPtr node(Expr::Kind kind, const Token& at) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->line = at.line;
    expr->column = at.column;
    return expr;
  }

  // Statements until one of `end_tags` (returned in `end_tag`, its name consumed) or the end.
  // `opener` is the statement keyword whose block this is, for the "not closed" error.
  Result<Body> parse_body(std::initializer_list<std::string_view> end_tags, std::string& end_tag,
                          const Token* opener = nullptr) {
    if (++depth_ > kMaxParseDepth) return error_at(peek(), "blocks nested too deeply");
    Body body;
    while (true) {
      const Token& token = peek();
      if (token.kind == TokenKind::kEof) {
        if (end_tags.size() == 0) break;
        std::string_view closer = *(end_tags.end() - 1);
        if (!opener) return error_at(token, fmt::format("missing '{{% {} %}}'", closer));
        return error_at(
            *opener, fmt::format("'{}' is not closed: missing '{{% {} %}}'", opener->text, closer));
      }
      if (token.kind == TokenKind::kText) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kText;
        stmt->text = next().text;
        body.push_back(std::move(stmt));
        continue;
      }
      if (token.kind == TokenKind::kVarBegin) {
        next();
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kOutput;
        stmt->line = token.line;
        stmt->column = token.column;
        DZ_ASSIGN_OR_RETURN(stmt->expr, parse_expr());
        if (peek().kind != TokenKind::kVarEnd)
          return error_at(peek(), fmt::format("expected '}}}}', found '{}'", peek().text));
        next();
        body.push_back(std::move(stmt));
        continue;
      }
      if (token.kind != TokenKind::kBlockBegin) return error_at(token, "unexpected token");
      const Token& keyword = peek(1);
      if (keyword.kind != TokenKind::kName) return error_at(keyword, "expected a statement name");
      for (std::string_view end : end_tags) {
        if (keyword.text == end) {
          next();
          next();
          end_tag = keyword.text;
          --depth_;
          return body;
        }
      }
      next();
      DZ_ASSIGN_OR_RETURN(StmtPtr stmt, parse_statement());
      body.push_back(std::move(stmt));
    }
    --depth_;
    return body;
  }

  Result<StmtPtr> parse_statement() {
    const Token keyword = next();
    auto stmt = std::make_unique<Stmt>();
    stmt->line = keyword.line;
    stmt->column = keyword.column;
    const std::string& kw = keyword.text;
    std::string end_tag;
    if (kw == "if") {
      stmt->kind = Stmt::Kind::kIf;
      while (true) {
        DZ_ASSIGN_OR_RETURN(ExprPtr cond, parse_expr());
        DZ_RETURN_IF_ERROR(expect_block_end());
        stmt->conditions.push_back(std::move(cond));
        DZ_ASSIGN_OR_RETURN(Body body, parse_body({"elif", "else", "endif"}, end_tag, &keyword));
        stmt->bodies.push_back(std::move(body));
        if (end_tag == "elif") continue;
        if (end_tag == "else") {
          DZ_RETURN_IF_ERROR(expect_block_end());
          DZ_ASSIGN_OR_RETURN(Body other, parse_body({"endif"}, end_tag, &keyword));
          stmt->bodies.push_back(std::move(other));
        }
        break;
      }
    } else if (kw == "for") {
      stmt->kind = Stmt::Kind::kFor;
      do {
        DZ_ASSIGN_OR_RETURN(std::string name, expect_name());
        stmt->names.push_back(std::move(name));
      } while (accept_op(","));
      if (!accept_name("in")) return error_at(peek(), "expected 'in' in for loop");
      DZ_ASSIGN_OR_RETURN(stmt->expr, parse_or_tuple(/*allow_condition=*/false));
      if (accept_name("if")) {
        DZ_ASSIGN_OR_RETURN(stmt->filter, parse_or());
      }
      if (accept_name("recursive"))
        return error_at(keyword, "recursive for loops are not supported");
      DZ_RETURN_IF_ERROR(expect_block_end());
      DZ_ASSIGN_OR_RETURN(Body body, parse_body({"else", "endfor"}, end_tag, &keyword));
      stmt->bodies.push_back(std::move(body));
      if (end_tag == "else") {
        DZ_RETURN_IF_ERROR(expect_block_end());
        DZ_ASSIGN_OR_RETURN(Body other, parse_body({"endfor"}, end_tag, &keyword));
        stmt->bodies.push_back(std::move(other));
      }
    } else if (kw == "set") {
      stmt->kind = Stmt::Kind::kSet;
      do {
        DZ_ASSIGN_OR_RETURN(std::string name, expect_name());
        stmt->names.push_back(std::move(name));
        if (accept_op(".")) {
          if (stmt->names.size() > 1) return error_at(peek(), "cannot unpack into an attribute");
          DZ_ASSIGN_OR_RETURN(stmt->attr, expect_name());
          break;
        }
      } while (accept_op(","));
      if (accept_op("=")) {
        DZ_ASSIGN_OR_RETURN(stmt->expr, parse_or_tuple(/*allow_condition=*/true));
        DZ_RETURN_IF_ERROR(expect_block_end());
        return stmt;
      }
      if (stmt->names.size() != 1 || !stmt->attr.empty())
        return error_at(peek(), "expected '=' in set");
      DZ_RETURN_IF_ERROR(expect_block_end());
      DZ_ASSIGN_OR_RETURN(Body body, parse_body({"endset"}, end_tag, &keyword));
      stmt->bodies.push_back(std::move(body));
    } else if (kw == "macro") {
      stmt->kind = Stmt::Kind::kMacro;
      DZ_ASSIGN_OR_RETURN(stmt->text, expect_name());
      DZ_RETURN_IF_ERROR(expect_op("("));
      while (!accept_op(")")) {
        DZ_ASSIGN_OR_RETURN(std::string param, expect_name());
        ExprPtr default_value;
        if (accept_op("=")) {
          DZ_ASSIGN_OR_RETURN(default_value, parse_expr());
        }
        stmt->params.emplace_back(std::move(param), std::move(default_value));
        if (!is_op(")")) DZ_RETURN_IF_ERROR(expect_op(","));
      }
      DZ_RETURN_IF_ERROR(expect_block_end());
      DZ_ASSIGN_OR_RETURN(Body body, parse_body({"endmacro"}, end_tag, &keyword));
      stmt->bodies.push_back(std::move(body));
    } else if (kw == "break" || kw == "continue") {
      stmt->kind = kw == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    } else if (kw == "generation") {
      // transformers' extension marking the assistant's tokens; it renders its body unchanged.
      stmt->kind = Stmt::Kind::kBlock;
      DZ_RETURN_IF_ERROR(expect_block_end());
      DZ_ASSIGN_OR_RETURN(Body body, parse_body({"endgeneration"}, end_tag, &keyword));
      stmt->bodies.push_back(std::move(body));
    } else if (kw.starts_with("end") || kw == "elif" || kw == "else") {
      return error_at(keyword, fmt::format("unexpected '{}'", kw));
    } else {
      return error_at(keyword, fmt::format("unsupported statement '{}'", kw));
    }
    DZ_RETURN_IF_ERROR(expect_block_end());  // of the end tag, or of break/continue
    return stmt;
  }

  // ---- expressions ----

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) { ++p.depth_; }
    ~DepthGuard() { --p.depth_; }
  };

  Result<ExprPtr> parse_expr() { return parse_condition(); }

  // `a, b` without brackets (for-loop iterables and set values) becomes a tuple.
  Result<ExprPtr> parse_or_tuple(bool allow_condition) {
    const Token& at = peek();
    ExprPtr first;
    if (allow_condition) {
      DZ_ASSIGN_OR_RETURN(first, parse_condition());
    } else {
      DZ_ASSIGN_OR_RETURN(first, parse_or());
    }
    if (!is_op(",")) return first;
    ExprPtr tuple = node(Expr::Kind::kTuple, at);
    tuple->args.push_back(std::move(first));
    while (accept_op(",")) {
      DZ_ASSIGN_OR_RETURN(ExprPtr item, parse_or());
      tuple->args.push_back(std::move(item));
    }
    return tuple;
  }

  Result<ExprPtr> parse_condition() {
    DepthGuard guard(*this);
    if (depth_ > kMaxParseDepth) return error_at(peek(), "expression nested too deeply");
    DZ_ASSIGN_OR_RETURN(ExprPtr value, parse_or());
    while (is_name("if")) {
      const Token& at = next();
      ExprPtr cond = node(Expr::Kind::kCondition, at);
      DZ_ASSIGN_OR_RETURN(ExprPtr test, parse_or());
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(value));
      if (accept_name("else")) {
        DZ_ASSIGN_OR_RETURN(ExprPtr other, parse_condition());
        cond->args.push_back(std::move(other));
      } else {
        cond->args.push_back(nullptr);
      }
      DZ_RETURN_IF_ERROR(seal(*cond));
      value = std::move(cond);
    }
    return value;
  }

  Result<ExprPtr> binary(std::string op, const Token& at, ExprPtr left, ExprPtr right) {
    ExprPtr expr = node(Expr::Kind::kBinary, at);
    expr->name = std::move(op);
    expr->args.push_back(std::move(left));
    expr->args.push_back(std::move(right));
    DZ_RETURN_IF_ERROR(seal(*expr));
    return expr;
  }

  Result<ExprPtr> parse_or() {
    DZ_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (is_name("or")) {
      const Token& at = next();
      DZ_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      DZ_ASSIGN_OR_RETURN(left, binary("or", at, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    DZ_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (is_name("and")) {
      const Token& at = next();
      DZ_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      DZ_ASSIGN_OR_RETURN(left, binary("and", at, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      if (depth_ > kMaxParseDepth) return error_at(peek(), "expression nested too deeply");
      const Token& at = next();
      ExprPtr expr = node(Expr::Kind::kUnary, at);
      expr->name = "not";
      DZ_ASSIGN_OR_RETURN(ExprPtr operand, parse_not());
      expr->args.push_back(std::move(operand));
      DZ_RETURN_IF_ERROR(seal(*expr));
      return expr;
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    DZ_ASSIGN_OR_RETURN(ExprPtr left, parse_concat());
    while (true) {
      const Token& at = peek();
      std::string op;
      if (at.kind == TokenKind::kOperator &&
          (at.text == "==" || at.text == "!=" || at.text == "<" || at.text == "<=" ||
           at.text == ">" || at.text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        return left;
      }
      DZ_ASSIGN_OR_RETURN(ExprPtr right, parse_concat());
      DZ_ASSIGN_OR_RETURN(left, binary(op, at, std::move(left), std::move(right)));
    }
  }

  Result<ExprPtr> parse_concat() {
    DZ_ASSIGN_OR_RETURN(ExprPtr left, parse_sum());
    while (is_op("~")) {
      const Token& at = next();
      DZ_ASSIGN_OR_RETURN(ExprPtr right, parse_sum());
      DZ_ASSIGN_OR_RETURN(left, binary("~", at, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_sum() {
    DZ_ASSIGN_OR_RETURN(ExprPtr left, parse_product());
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      DZ_ASSIGN_OR_RETURN(ExprPtr right, parse_product());
      DZ_ASSIGN_OR_RETURN(left, binary(at.text, at, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_product() {
    DZ_ASSIGN_OR_RETURN(ExprPtr left, parse_power());
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      DZ_ASSIGN_OR_RETURN(ExprPtr right, parse_power());
      DZ_ASSIGN_OR_RETURN(left, binary(at.text, at, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_power() {
    DZ_ASSIGN_OR_RETURN(ExprPtr left, parse_unary());
    while (is_op("**")) {
      const Token& at = next();
      DZ_ASSIGN_OR_RETURN(ExprPtr right, parse_unary());
      DZ_ASSIGN_OR_RETURN(left, binary("**", at, std::move(left), std::move(right)));
    }
    return left;
  }

  // As jinja2: `-x|f` is (-x)|f, the sign applies before filters.
  Result<ExprPtr> parse_unary(bool with_filters = true) {
    DepthGuard guard(*this);
    if (depth_ > kMaxParseDepth) return error_at(peek(), "expression nested too deeply");
    ExprPtr value;
    if (is_op("-") || is_op("+")) {
      const Token& at = next();
      value = node(Expr::Kind::kUnary, at);
      value->name = at.text;
      DZ_ASSIGN_OR_RETURN(ExprPtr operand, parse_unary(/*with_filters=*/false));
      value->args.push_back(std::move(operand));
      DZ_RETURN_IF_ERROR(seal(*value));
    } else {
      DZ_ASSIGN_OR_RETURN(value, parse_postfix());
    }
    if (!with_filters) return value;
    return parse_filters(std::move(value));
  }

  Status parse_call_args(Expr& call) {
    while (!accept_op(")")) {
      if (peek().kind == TokenKind::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        DZ_ASSIGN_OR_RETURN(ExprPtr value, parse_expr());
        call.kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call.kwargs.empty()) return error_at(peek(), "positional argument after keyword");
        DZ_ASSIGN_OR_RETURN(ExprPtr value, parse_expr());
        call.args.push_back(std::move(value));
      }
      if (!is_op(")")) DZ_RETURN_IF_ERROR(expect_op(","));
    }
    return {};
  }

  Result<ExprPtr> parse_filters(ExprPtr value) {
    while (true) {
      if (is_op("|")) {
        const Token& at = next();
        ExprPtr filter = node(Expr::Kind::kFilter, at);
        DZ_ASSIGN_OR_RETURN(filter->name, expect_name());
        filter->args.push_back(std::move(value));
        if (accept_op("(")) DZ_RETURN_IF_ERROR(parse_call_args(*filter));
        DZ_RETURN_IF_ERROR(seal(*filter));
        value = std::move(filter);
      } else if (is_name("is")) {
        const Token& at = next();
        ExprPtr test = node(Expr::Kind::kTest, at);
        test->negated = accept_name("not");
        DZ_ASSIGN_OR_RETURN(test->name, expect_name());
        test->args.push_back(std::move(value));
        if (accept_op("(")) {
          DZ_RETURN_IF_ERROR(parse_call_args(*test));
        } else if (peek().kind == TokenKind::kString || peek().kind == TokenKind::kInt ||
                   peek().kind == TokenKind::kFloat || is_op("[") || is_op("{") ||
                   (peek().kind == TokenKind::kName && !is_name("and") && !is_name("or") &&
                    !is_name("else") && !is_name("if") && !is_name("in") && !is_name("not") &&
                    !is_name("is"))) {
          // `x is divisibleby 3`, `x is sameas y`: one argument without parentheses.
          DZ_ASSIGN_OR_RETURN(ExprPtr arg, parse_postfix());
          test->args.push_back(std::move(arg));
        }
        DZ_RETURN_IF_ERROR(seal(*test));
        value = std::move(test);
      } else {
        return value;
      }
    }
  }

  Result<ExprPtr> parse_postfix() {
    DZ_ASSIGN_OR_RETURN(ExprPtr value, parse_primary());
    while (true) {
      const Token& at = peek();
      if (accept_op(".")) {
        ExprPtr attr = node(Expr::Kind::kAttr, at);
        if (peek().kind == TokenKind::kInt) {
          attr->kind = Expr::Kind::kSubscript;  // `x.0` is x[0]
          attr->args.push_back(std::move(value));
          ExprPtr index = node(Expr::Kind::kLiteral, peek());
          index->literal = Value::integer(next().int_value);
          attr->args.push_back(std::move(index));
        } else {
          DZ_ASSIGN_OR_RETURN(attr->name, expect_name());
          attr->args.push_back(std::move(value));
        }
        DZ_RETURN_IF_ERROR(seal(*attr));
        value = std::move(attr);
      } else if (accept_op("[")) {
        DZ_ASSIGN_OR_RETURN(value, parse_subscript(std::move(value), at));
        DZ_RETURN_IF_ERROR(seal(*value));
      } else if (accept_op("(")) {
        ExprPtr call = node(Expr::Kind::kCall, at);
        call->line = value->line;  // errors point at the callee
        call->column = value->column;
        call->args.push_back(std::move(value));
        DZ_RETURN_IF_ERROR(parse_call_args(*call));
        DZ_RETURN_IF_ERROR(seal(*call));
        value = std::move(call);
      } else {
        return value;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr value, const Token& at) {
    ExprPtr parts[3];
    int num_colons = 0;
    while (!is_op("]")) {
      if (accept_op(":")) {
        if (++num_colons > 2) return error_at(peek(), "too many ':' in slice");
        continue;
      }
      if (parts[num_colons]) return error_at(peek(), "expected ']'");
      DZ_ASSIGN_OR_RETURN(parts[num_colons], parse_expr());
    }
    next();
    if (num_colons == 0) {
      if (!parts[0]) return error_at(at, "empty subscript");
      ExprPtr sub = node(Expr::Kind::kSubscript, at);
      sub->args.push_back(std::move(value));
      sub->args.push_back(std::move(parts[0]));
      return sub;
    }
    ExprPtr slice = node(Expr::Kind::kSlice, at);
    slice->args.push_back(std::move(value));
    for (auto& part : parts) slice->args.push_back(std::move(part));
    return slice;
  }

  Result<ExprPtr> parse_primary() {
    const Token& at = peek();
    switch (at.kind) {
      case TokenKind::kString: {
        ExprPtr lit = node(Expr::Kind::kLiteral, at);
        std::string text = next().text;
        while (peek().kind == TokenKind::kString) text += next().text;  // "a" "b"
        lit->literal = Value::string(std::move(text));
        return lit;
      }
      case TokenKind::kInt: {
        ExprPtr lit = node(Expr::Kind::kLiteral, at);
        lit->literal = Value::integer(next().int_value);
        return lit;
      }
      case TokenKind::kFloat: {
        ExprPtr lit = node(Expr::Kind::kLiteral, at);
        lit->literal = Value::floating(next().float_value);
        return lit;
      }
      case TokenKind::kName: {
        ExprPtr expr = node(Expr::Kind::kLiteral, at);
        const std::string& name = at.text;
        if (name == "true" || name == "True") {
          expr->literal = Value::boolean(true);
        } else if (name == "false" || name == "False") {
          expr->literal = Value::boolean(false);
        } else if (name == "none" || name == "None") {
          expr->literal = Value::none();
        } else {
          expr->kind = Expr::Kind::kName;
          expr->name = name;
        }
        next();
        return expr;
      }
      case TokenKind::kOperator:
        break;
      default:
        return error_at(at, fmt::format("unexpected '{}'", at.text));
    }
    DepthGuard guard(*this);
    if (depth_ > kMaxParseDepth) return error_at(at, "expression nested too deeply");
    if (accept_op("(")) {
      if (accept_op(")")) return node(Expr::Kind::kTuple, at);
      DZ_ASSIGN_OR_RETURN(ExprPtr first, parse_expr());
      if (accept_op(")")) return first;
      ExprPtr tuple = node(Expr::Kind::kTuple, at);
      tuple->args.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op(")")) break;
        DZ_ASSIGN_OR_RETURN(ExprPtr item, parse_expr());
        tuple->args.push_back(std::move(item));
      }
      DZ_RETURN_IF_ERROR(expect_op(")"));
      DZ_RETURN_IF_ERROR(seal(*tuple));
      return tuple;
    }
    if (accept_op("[")) {
      ExprPtr list = node(Expr::Kind::kList, at);
      while (!accept_op("]")) {
        DZ_ASSIGN_OR_RETURN(ExprPtr item, parse_expr());
        list->args.push_back(std::move(item));
        if (!is_op("]")) DZ_RETURN_IF_ERROR(expect_op(","));
      }
      DZ_RETURN_IF_ERROR(seal(*list));
      return list;
    }
    if (accept_op("{")) {
      ExprPtr dict = node(Expr::Kind::kDict, at);
      while (!accept_op("}")) {
        DZ_ASSIGN_OR_RETURN(ExprPtr key, parse_expr());
        DZ_RETURN_IF_ERROR(expect_op(":"));
        DZ_ASSIGN_OR_RETURN(ExprPtr value, parse_expr());
        dict->args.push_back(std::move(key));
        dict->args.push_back(std::move(value));
        if (!is_op("}")) DZ_RETURN_IF_ERROR(expect_op(","));
      }
      DZ_RETURN_IF_ERROR(seal(*dict));
      return dict;
    }
    return error_at(at, fmt::format("unexpected '{}'", at.text));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<Body> parse_template(std::string_view source) {
  DZ_ASSIGN_OR_RETURN(std::vector<Token> tokens, lex_template(source));
  Parser parser(std::move(tokens));
  return parser.parse_root();
}

}  // namespace dz::serve::chat
