// Statement execution and expression evaluation for the Jinja subset (jinja.h).

#include <algorithm>
#include <cmath>

#include "dayzero/serve/chat/interpreter.h"
#include "dayzero/serve/chat/parser.h"

namespace dz::serve::chat {
namespace {

Status at(const Expr& expr, const Status& status) {
  if (status.message().starts_with("template line")) return status;
  return make_error(status.code(), "template line {} column {}: {}", expr.line, expr.column,
                    status.message());
}

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

class Executor {
 public:
  Executor(Interpreter& in, std::string& out) : in_(in), out_(out) {}

  Result<Flow> exec(const Body& body) {
    for (const StmtPtr& stmt : body) {
      DZ_RETURN_IF_ERROR(in_.step());
      DZ_ASSIGN_OR_RETURN(Flow flow, exec(*stmt));
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  Status write(std::string_view text) {
    if (out_.size() + text.size() > in_.options.max_output_bytes)
      return make_error(StatusCode::kResourceExhausted, "template output exceeds {} bytes",
                        in_.options.max_output_bytes);
    out_ += text;
    return {};
  }

  Status stmt_error(const Stmt& stmt, std::string_view what) {
    return make_error(StatusCode::kInvalidArgument, "template line {} column {}: {}", stmt.line,
                      stmt.column, what);
  }

  Result<Flow> exec(const Stmt& stmt) {
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        DZ_RETURN_IF_ERROR(write(stmt.text));
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        DZ_ASSIGN_OR_RETURN(Value value, in_.eval(*stmt.expr));
        DZ_RETURN_IF_ERROR(write(value.str()));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < stmt.conditions.size(); ++i) {
          DZ_ASSIGN_OR_RETURN(Value cond, in_.eval(*stmt.conditions[i]));
          if (cond.truthy()) return exec(stmt.bodies[i]);
        }
        if (stmt.bodies.size() > stmt.conditions.size()) return exec(stmt.bodies.back());
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        return exec_for(stmt);
      case Stmt::Kind::kSet:
        return exec_set(stmt);
      case Stmt::Kind::kMacro:
        define_macro(stmt);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        if (loop_depth_ == 0) return stmt_error(stmt, "'break' outside a loop");
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        if (loop_depth_ == 0) return stmt_error(stmt, "'continue' outside a loop");
        return Flow::kContinue;
      case Stmt::Kind::kBlock:
        return exec(stmt.bodies[0]);
    }
    return Flow::kNormal;
  }

  Result<Array> iterable_items(const Stmt& stmt, const Value& value) {
    switch (value.kind()) {
      case Value::Kind::kUndefined:
        return Array{};
      case Value::Kind::kArray:
        return value.items();  // a copy: the body may change the list it walks
      case Value::Kind::kObject: {
        Array keys;
        for (const auto& [k, v] : value.entries()) keys.push_back(Value::string(k));
        return keys;
      }
      case Value::Kind::kString: {
        std::vector<uint32_t> cps = utf8_decode(value.as_string());
        Array chars;
        for (size_t i = 0; i < cps.size(); ++i)
          chars.push_back(Value::string(utf8_encode(cps, i, i + 1)));
        return chars;
      }
      default:
        return stmt_error(stmt, fmt::format("'{}' object is not iterable", value.type_name()));
    }
  }

  Result<Flow> exec_for(const Stmt& stmt) {
    DZ_ASSIGN_OR_RETURN(Value iterable, in_.eval(*stmt.expr));
    DZ_ASSIGN_OR_RETURN(Array all, iterable_items(stmt, iterable));
    Array items;
    if (stmt.filter) {
      // `for x in xs if cond`: the condition sees x; loop.* counts the kept items only.
      for (Value& item : all) {
        in_.scopes.emplace_back();
        DZ_RETURN_IF_ERROR(bind_targets(stmt, item));
        Result<Value> keep = in_.eval(*stmt.filter);
        in_.scopes.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->truthy()) items.push_back(std::move(item));
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) {
      if (stmt.bodies.size() > 1) return exec(stmt.bodies[1]);
      return Flow::kNormal;
    }
    ++loop_depth_;
    const auto num_items = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < num_items; ++i) {
      DZ_RETURN_IF_ERROR(in_.step());
      in_.scopes.emplace_back();
      Value loop = Value::object({
          {"index", Value::integer(i + 1)},
          {"index0", Value::integer(i)},
          {"revindex", Value::integer(num_items - i)},
          {"revindex0", Value::integer(num_items - i - 1)},
          {"first", Value::boolean(i == 0)},
          {"last", Value::boolean(i == num_items - 1)},
          {"length", Value::integer(num_items)},
          {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value()},
          {"nextitem", i + 1 < num_items ? items[static_cast<size_t>(i + 1)] : Value()},
      });
      in_.assign("loop", loop);
      Status bound = bind_targets(stmt, items[static_cast<size_t>(i)]);
      Result<Flow> flow = bound.ok() ? exec(stmt.bodies[0]) : Result<Flow>(bound);
      in_.scopes.pop_back();
      if (!flow.ok()) {
        --loop_depth_;
        return flow.status();
      }
      if (*flow == Flow::kBreak) break;
    }
    --loop_depth_;
    return Flow::kNormal;
  }

  Status bind_targets(const Stmt& stmt, const Value& item) {
    if (stmt.names.size() == 1) {
      in_.assign(stmt.names[0], item);
      return {};
    }
    if (!item.is_array() || item.items().size() != stmt.names.size())
      return stmt_error(
          stmt, fmt::format("cannot unpack {} into {} names", item.type_name(), stmt.names.size()));
    for (size_t k = 0; k < stmt.names.size(); ++k) in_.assign(stmt.names[k], item.items()[k]);
    return {};
  }

  Result<Flow> exec_set(const Stmt& stmt) {
    Value value;
    if (stmt.expr) {
      DZ_ASSIGN_OR_RETURN(value, in_.eval(*stmt.expr));
    } else {
      std::string captured;
      Executor inner(in_, captured);
      inner.loop_depth_ = 0;
      DZ_ASSIGN_OR_RETURN(Flow flow, inner.exec(stmt.bodies[0]));
      (void)flow;
      value = Value::string(std::move(captured));
    }
    if (!stmt.attr.empty()) {
      const Value* target = in_.lookup(stmt.names[0]);
      if (!target || !target->is_namespace())
        return stmt_error(
            stmt, fmt::format("cannot assign attribute on '{}': not a namespace", stmt.names[0]));
      target->set(stmt.attr, std::move(value));
      return Flow::kNormal;
    }
    if (stmt.names.size() == 1) {
      in_.assign(stmt.names[0], std::move(value));
      return Flow::kNormal;
    }
    DZ_RETURN_IF_ERROR(bind_targets(stmt, value));
    return Flow::kNormal;
  }

  void define_macro(const Stmt& stmt) {
    const Stmt* macro = &stmt;
    in_.assign(
        stmt.text,
        Value::function(
            stmt.text,
            [macro](Interpreter& in, std::vector<Value>& args, Kwargs& kwargs) -> Result<Value> {
              if (args.size() > macro->params.size())
                return make_error(StatusCode::kInvalidArgument,
                                  "macro '{}' takes {} arguments, got {}", macro->text,
                                  macro->params.size(), args.size());
              if (in.call_depth >= in.options.max_call_depth)
                return make_error(StatusCode::kResourceExhausted,
                                  "macro calls nested deeper than {}", in.options.max_call_depth);
              Object frame;
              for (size_t i = 0; i < macro->params.size(); ++i) {
                const auto& [name, default_expr] = macro->params[i];
                Value value;
                if (i < args.size()) {
                  value = args[i];
                } else {
                  bool given = false;
                  for (auto& [key, v] : kwargs)
                    if (key == name) {
                      value = v;
                      given = true;
                    }
                  if (!given && default_expr) {
                    DZ_ASSIGN_OR_RETURN(value, in.eval(*default_expr));
                  }
                }
                frame.emplace_back(name, std::move(value));
              }
              for (auto& [key, v] : kwargs) {
                bool known = false;
                for (const auto& param : macro->params) known = known || param.first == key;
                if (!known)
                  return make_error(StatusCode::kInvalidArgument,
                                    "macro '{}' has no parameter '{}'", macro->text, key);
              }
              ++in.call_depth;
              in.frame_bases.push_back(in.scopes.size());
              in.scopes.push_back(std::move(frame));
              std::string out;
              Executor inner(in, out);
              Result<Flow> flow = inner.exec(macro->bodies[0]);
              in.scopes.resize(in.frame_bases.back());
              in.frame_bases.pop_back();
              --in.call_depth;
              if (!flow.ok()) return flow.status();
              return Value::string(std::move(out));
            }));
  }

  Interpreter& in_;
  std::string& out_;
  int loop_depth_ = 0;
};

}  // namespace

Status Interpreter::step() {
  if (++num_steps > options.max_steps)
    return make_error(StatusCode::kResourceExhausted, "template exceeded {} evaluation steps",
                      options.max_steps);
  return {};
}

const Value* Interpreter::lookup(const std::string& name) const {
  size_t base = frame_bases.empty() ? 0 : frame_bases.back();
  for (size_t i = scopes.size(); i-- > base;)
    for (const auto& [k, v] : scopes[i])
      if (k == name) return &v;
  if (base > 0)
    for (const auto& [k, v] : scopes[0])
      if (k == name) return &v;
  return nullptr;
}

void Interpreter::assign(const std::string& name, Value value) {
  for (auto& [k, v] : scopes.back())
    if (k == name) {
      v = std::move(value);
      return;
    }
  scopes.back().emplace_back(name, std::move(value));
}

Result<Value> Interpreter::call(const Value& fn, std::vector<Value>& args, Kwargs& kwargs) {
  if (!fn.is_function())
    return make_error(StatusCode::kInvalidArgument, "'{}' object is not callable", fn.type_name());
  return fn.fn()(*this, args, kwargs);
}

Result<Value> Interpreter::eval(const Expr& expr) {
  DZ_RETURN_IF_ERROR(step());
  auto eval_args = [&](size_t first, std::vector<Value>& args, Kwargs& kwargs) -> Status {
    for (size_t i = first; i < expr.args.size(); ++i) {
      DZ_ASSIGN_OR_RETURN(Value v, eval(*expr.args[i]));
      args.push_back(std::move(v));
    }
    for (const auto& [key, value_expr] : expr.kwargs) {
      DZ_ASSIGN_OR_RETURN(Value v, eval(*value_expr));
      kwargs.emplace_back(key, std::move(v));
    }
    return {};
  };
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.literal;
    case Expr::Kind::kName: {
      const Value* value = lookup(expr.name);
      return value ? *value : Value();
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      Array items;
      for (const ExprPtr& item : expr.args) {
        DZ_ASSIGN_OR_RETURN(Value v, eval(*item));
        items.push_back(std::move(v));
      }
      return Value::array(std::move(items));
    }
    case Expr::Kind::kDict: {
      Value dict = Value::object();
      for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
        DZ_ASSIGN_OR_RETURN(Value key, eval(*expr.args[i]));
        DZ_ASSIGN_OR_RETURN(Value value, eval(*expr.args[i + 1]));
        if (!key.is_string())
          return at(expr, make_error(StatusCode::kUnsupported, "dict keys must be strings, not {}",
                                     key.type_name()));
        dict.set(key.as_string(), std::move(value));
      }
      return dict;
    }
    case Expr::Kind::kAttr: {
      DZ_ASSIGN_OR_RETURN(Value object, eval(*expr.args[0]));
      if (object.is_undefined())
        return at(expr, make_error(StatusCode::kInvalidArgument,
                                   "cannot read attribute '{}' of an undefined value", expr.name));
      const Value* found = object.find(expr.name);
      return found ? *found : Value();
    }
    case Expr::Kind::kSubscript: {
      DZ_ASSIGN_OR_RETURN(Value object, eval(*expr.args[0]));
      DZ_ASSIGN_OR_RETURN(Value key, eval(*expr.args[1]));
      Result<Value> value = subscript(object, key);
      if (!value.ok()) return at(expr, value.status());
      return value;
    }
    case Expr::Kind::kSlice: {
      DZ_ASSIGN_OR_RETURN(Value object, eval(*expr.args[0]));
      Value parts[3];
      for (int i = 0; i < 3; ++i)
        if (expr.args[static_cast<size_t>(i) + 1]) {
          DZ_ASSIGN_OR_RETURN(parts[i], eval(*expr.args[static_cast<size_t>(i) + 1]));
        }
      Result<Value> value = slice(object, parts[0], parts[1], parts[2]);
      if (!value.ok()) return at(expr, value.status());
      return value;
    }
    case Expr::Kind::kCall: {
      const Expr& callee = *expr.args[0];
      std::vector<Value> args;
      Kwargs kwargs;
      Result<Value> result = Value();
      if (callee.kind == Expr::Kind::kAttr) {
        DZ_ASSIGN_OR_RETURN(Value self, eval(*callee.args[0]));
        DZ_RETURN_IF_ERROR(eval_args(1, args, kwargs));
        bool found = false;
        result = call_method(*this, self, callee.name, args, kwargs, found);
        if (!found) {
          const Value* member = self.find(callee.name);
          if (!member || !member->is_function())
            return at(expr, make_error(StatusCode::kInvalidArgument, "'{}' has no method '{}'",
                                       self.type_name(), callee.name));
          result = call(*member, args, kwargs);
        }
      } else if (callee.kind == Expr::Kind::kName) {
        DZ_RETURN_IF_ERROR(eval_args(1, args, kwargs));
        const Value* fn = lookup(callee.name);
        if (fn) {
          result = call(*fn, args, kwargs);
        } else {
          bool found = false;
          result = call_global(*this, callee.name, args, kwargs, found);
          if (!found)
            return at(expr, make_error(StatusCode::kInvalidArgument,
                                       "'{}' is undefined or not callable", callee.name));
        }
      } else {
        DZ_ASSIGN_OR_RETURN(Value fn, eval(callee));
        DZ_RETURN_IF_ERROR(eval_args(1, args, kwargs));
        result = call(fn, args, kwargs);
      }
      if (!result.ok()) return at(expr, result.status());
      return result;
    }
    case Expr::Kind::kFilter: {
      DZ_ASSIGN_OR_RETURN(Value input, eval(*expr.args[0]));
      std::vector<Value> args;
      Kwargs kwargs;
      DZ_RETURN_IF_ERROR(eval_args(1, args, kwargs));
      Result<Value> result = apply_filter(*this, expr.name, input, args, kwargs);
      if (!result.ok()) return at(expr, result.status());
      return result;
    }
    case Expr::Kind::kTest: {
      // `x is defined` must not fail on an undefined x.
      DZ_ASSIGN_OR_RETURN(Value input, eval(*expr.args[0]));
      std::vector<Value> args;
      Kwargs kwargs;
      DZ_RETURN_IF_ERROR(eval_args(1, args, kwargs));
      Result<bool> result = apply_test(*this, expr.name, input, args);
      if (!result.ok()) return at(expr, result.status());
      return Value::boolean(*result != expr.negated);
    }
    case Expr::Kind::kUnary: {
      DZ_ASSIGN_OR_RETURN(Value operand, eval(*expr.args[0]));
      if (expr.name == "not") return Value::boolean(!operand.truthy());
      if (!operand.is_number())
        return at(expr,
                  make_error(StatusCode::kInvalidArgument, "bad operand type for unary {}: '{}'",
                             expr.name, operand.type_name()));
      if (expr.name == "+") return operand;
      if (operand.is_int()) {
        if (operand.as_int() == INT64_MIN)
          return at(expr, make_error(StatusCode::kInvalidArgument, "integer overflow in -"));
        return Value::integer(-operand.as_int());
      }
      return Value::floating(-operand.as_double());
    }
    case Expr::Kind::kBinary: {
      const std::string& op = expr.name;
      DZ_ASSIGN_OR_RETURN(Value left, eval(*expr.args[0]));
      if (op == "and") return left.truthy() ? eval(*expr.args[1]) : left;
      if (op == "or") return left.truthy() ? left : eval(*expr.args[1]);
      DZ_ASSIGN_OR_RETURN(Value right, eval(*expr.args[1]));
      if (op == "==") return Value::boolean(left.equals(right));
      if (op == "!=") return Value::boolean(!left.equals(right));
      if (op == "in" || op == "not in") {
        Result<bool> found = contains(right, left);
        if (!found.ok()) return at(expr, found.status());
        return Value::boolean(*found == (op == "in"));
      }
      if (op == "~") {
        std::string joined = left.str() + right.str();
        if (joined.size() > options.max_output_bytes)
          return at(expr, make_error(StatusCode::kResourceExhausted, "string exceeds {} bytes",
                                     options.max_output_bytes));
        return Value::string(std::move(joined));
      }
      if (op == "<" || op == "<=" || op == ">" || op == ">=") {
        Result<int> cmp = compare_values(left, right);
        if (!cmp.ok()) return at(expr, cmp.status());
        bool r = op == "<" ? *cmp < 0 : op == "<=" ? *cmp <= 0 : op == ">" ? *cmp > 0 : *cmp >= 0;
        return Value::boolean(r);
      }
      Result<Value> value = arithmetic(op, left, right, options);
      if (!value.ok()) return at(expr, value.status());
      if (value->is_string() && value->as_string().size() > options.max_output_bytes)
        return at(expr, make_error(StatusCode::kResourceExhausted, "string exceeds {} bytes",
                                   options.max_output_bytes));
      return value;
    }
    case Expr::Kind::kCondition: {
      DZ_ASSIGN_OR_RETURN(Value cond, eval(*expr.args[0]));
      if (cond.truthy()) return eval(*expr.args[1]);
      if (expr.args[2]) return eval(*expr.args[2]);
      return Value();
    }
  }
  return Value();
}

namespace {

// Unknown filters, tests and functions fail at load, with their position, not at request time.
// A called name must be a global or a name the template binds (macro or set): the context
// comes from JSON and holds no functions.
struct NameCheck {
  std::vector<std::string> bound;

  void collect(const Body& body) {
    for (const StmtPtr& stmt : body) {
      if (stmt->kind == Stmt::Kind::kMacro) bound.push_back(stmt->text);
      if (stmt->kind == Stmt::Kind::kSet)
        bound.insert(bound.end(), stmt->names.begin(), stmt->names.end());
      for (const Body& inner : stmt->bodies) collect(inner);
    }
  }

  Status check(const Expr& expr) const {
    if (expr.kind == Expr::Kind::kFilter && !is_known_filter(expr.name))
      return at(expr, make_error(StatusCode::kUnsupported, "unknown filter '{}'", expr.name));
    if (expr.kind == Expr::Kind::kTest && !is_known_test(expr.name))
      return at(expr, make_error(StatusCode::kUnsupported, "unknown test '{}'", expr.name));
    if (expr.kind == Expr::Kind::kCall && expr.args[0]->kind == Expr::Kind::kName) {
      const std::string& name = expr.args[0]->name;
      if (!is_known_global(name) && std::find(bound.begin(), bound.end(), name) == bound.end())
        return at(expr,
                  make_error(StatusCode::kUnsupported, "'{}' is undefined or not callable", name));
    }
    for (const ExprPtr& child : expr.args)
      if (child) DZ_RETURN_IF_ERROR(check(*child));
    for (const auto& [key, child] : expr.kwargs) DZ_RETURN_IF_ERROR(check(*child));
    return {};
  }

  Status check(const Body& body) const {
    for (const StmtPtr& stmt : body) {
      for (const Expr* expr : {stmt->expr.get(), stmt->filter.get()})
        if (expr) DZ_RETURN_IF_ERROR(check(*expr));
      for (const ExprPtr& cond : stmt->conditions) DZ_RETURN_IF_ERROR(check(*cond));
      for (const auto& [name, dflt] : stmt->params)
        if (dflt) DZ_RETURN_IF_ERROR(check(*dflt));
      for (const Body& inner : stmt->bodies) DZ_RETURN_IF_ERROR(check(inner));
    }
    return {};
  }
};

}  // namespace

Result<Template> Template::parse(std::string_view source) {
  DZ_ASSIGN_OR_RETURN(Body body, parse_template(source));
  NameCheck names;
  names.collect(body);
  DZ_RETURN_IF_ERROR(names.check(body));
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(body));
  return t;
}

Result<std::string> Template::render(const Value& context, const RenderOptions& options) const {
  if (!body_) return make_error(StatusCode::kInternal, "render of an unparsed template");
  if (!context.is_object())
    return make_error(StatusCode::kInvalidArgument, "template context must be a dict");
  Interpreter in(options);
  in.scopes.push_back(context.entries());
  std::string out;
  Executor executor(in, out);
  DZ_ASSIGN_OR_RETURN(Flow flow, executor.exec(*body_));
  (void)flow;
  return out;
}

}  // namespace dz::serve::chat
