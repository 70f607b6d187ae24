#pragma once
// Internal to serve/chat: the state of one render, shared by the statement and expression
// evaluator (interpreter.cpp) and the filters, tests and methods (builtins.cpp).

#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/serve/chat/ast.h"
#include "dayzero/serve/chat/jinja.h"
#include "dayzero/serve/chat/value.h"

namespace dz::serve::chat {

struct Interpreter {
  const RenderOptions& options;
  std::vector<Object> scopes;       // scopes[0]: the template's globals
  std::vector<size_t> frame_bases;  // first scope of each macro call (lookups stop there)
  int64_t num_steps = 0;
  int call_depth = 0;

  explicit Interpreter(const RenderOptions& opts) : options(opts) {}

  Status step();  // counts one evaluation step against options.max_steps
  const Value* lookup(const std::string& name) const;
  void assign(const std::string& name, Value value);

  Result<Value> eval(const Expr& expr);
  // Calls a function value (macro, namespace(), bound method).
  Result<Value> call(const Value& fn, std::vector<Value>& args, Kwargs& kwargs);
};

// Filters, tests, methods and global functions (builtins.cpp). `found` reports whether the name
// exists, so the caller can name an unknown one in its error.
Result<Value> apply_filter(Interpreter& in, const std::string& name, const Value& input,
                           std::vector<Value>& args, Kwargs& kwargs);
Result<bool> apply_test(Interpreter& in, const std::string& name, const Value& input,
                        std::vector<Value>& args);
Result<Value> call_method(Interpreter& in, const Value& self, const std::string& name,
                          std::vector<Value>& args, Kwargs& kwargs, bool& found);
Result<Value> call_global(Interpreter& in, const std::string& name, std::vector<Value>& args,
                          Kwargs& kwargs, bool& found);
// The names apply_filter and apply_test accept, checked at parse time.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
bool is_known_global(std::string_view name);
// Python's operators (operators.cpp): + - * / // % ** on numbers, str and list; `in`;
// x[i] (Undefined when absent, as jinja2) and x[a:b:c] on str (by code point) and list.
Result<Value> arithmetic(const std::string& op, const Value& a, const Value& b,
                         const RenderOptions& options);
Result<bool> contains(const Value& container, const Value& item);
Result<Value> subscript(const Value& value, const Value& key);
Result<Value> slice(const Value& value, const Value& start, const Value& stop, const Value& step);
// `a.b.c` attribute paths as map(attribute=), selectattr and sort(attribute=) take them.
Value get_attribute_path(const Value& value, const std::string& path);
// Python's comparison for sort and the < > operators; numbers with numbers, str with str.
Result<int> compare_values(const Value& a, const Value& b);

}  // namespace dz::serve::chat
