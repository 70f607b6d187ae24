#pragma once
// The value model of dayzero's Jinja subset: Python's types as HF chat templates see them
// (None, bool, int, float, str, list, dict), plus Jinja's Undefined and callables (macros,
// namespace(), bound methods). Lists and dicts are shared by reference, as in Python, so that
// `ns.items.append(x)` and `set ns.count = …` change the one object every name points to.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/core/status.h"

namespace dz::serve::chat {

class Value;
using Array = std::vector<Value>;
// Insertion-ordered like a Python dict; templates hold small dicts, so lookup is linear.
using Object = std::vector<std::pair<std::string, Value>>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
struct Interpreter;
using Function = std::function<Result<Value>(Interpreter&, std::vector<Value>&, Kwargs&)>;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kArray,
    kObject,
    kFunction
  };

  Value() = default;  // Undefined
  static Value none() { return Value(Kind::kNone); }
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  static Value array(Array items = {});
  static Value object(Object items = {});
  // `is_namespace` marks namespace(): the one kind of object `set ns.attr = …` may change.
  static Value namespace_object(Object items);
  static Value function(std::string name, Function fn);
  static Value from_json(const nlohmann::json& json);
  static Value from_json(const nlohmann::ordered_json& json);  // keeps key order

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_function() const { return kind_ == Kind::kFunction; }
  bool is_namespace() const { return kind_ == Kind::kObject && namespace_; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_double() const { return kind_ == Kind::kInt ? static_cast<double>(i_) : f_; }
  const std::string& as_string() const { return s_; }
  Array& items() const { return *array_; }
  Object& entries() const { return *object_; }
  const Function& fn() const { return *fn_; }
  const std::string& fn_name() const { return s_; }

  // Dict lookup by key; nullptr when absent.
  const Value* find(std::string_view key) const;
  void set(const std::string& key, Value value) const;

  // Python truthiness: empty str/list/dict, 0, None and Undefined are false.
  bool truthy() const;
  // Python's str(): what `{{ x }}` prints ('True', 'None', "['a', 1]"); Undefined prints "".
  std::string str() const;
  // Python's repr(), used inside str() of lists and dicts.
  std::string repr() const;
  // Python ==: 1 == 1.0, lists and dicts compare element-wise.
  bool equals(const Value& other) const;
  std::string_view type_name() const;

 private:
  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool namespace_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::string s_;
  std::shared_ptr<Array> array_;
  std::shared_ptr<Object> object_;
  std::shared_ptr<Function> fn_;
};

// A call's positional argument i, else its keyword `name`, else Undefined (filters and methods).
Value argument(std::vector<Value>& args, Kwargs& kwargs, size_t i, std::string_view name);

// Python's repr(float) ('1.0', '0.1', '1e-05', '1e+16', 'inf', 'nan').
std::string format_python_float(double value);

struct JsonDumpOptions {
  int indent = -1;             // < 0: one line
  std::string item_separator;  // empty: Python's default (", " one line, "," indented)
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;  // HF's tojson passes ensure_ascii=False
};
// Python's json.dumps as HF's `tojson` filter calls it. Undefined and functions are refused.
Result<std::string> dump_json(const Value& value, const JsonDumpOptions& options);

// UTF-8 helpers: Python indexes strings by code point.
std::vector<uint32_t> utf8_decode(std::string_view text);
std::string utf8_encode(const std::vector<uint32_t>& code_points, size_t begin, size_t end);
size_t utf8_length(std::string_view text);

}  // namespace dz::serve::chat
