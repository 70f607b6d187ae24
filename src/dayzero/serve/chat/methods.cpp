// Jinja tests, Python methods on str/dict/list, and the global functions HF templates call.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

#include "dayzero/serve/chat/interpreter.h"

namespace dz::serve::chat {

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);

namespace {

bool is_ascii_space(char c) {
  return c == ' ' || (c >= '\t' && c <= '\r');
}

Result<Value> split(const std::string& s, const Value& sep_v, const Value& maxsplit_v) {
  int64_t maxsplit = maxsplit_v.is_int() ? maxsplit_v.as_int() : -1;
  Array parts;
  if (sep_v.is_undefined() || sep_v.is_none()) {
    // Runs of whitespace, ends ignored (ASCII whitespace).
    size_t i = 0;
    while (true) {
      while (i < s.size() && is_ascii_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        size_t end = s.size();
        while (end > i && is_ascii_space(s[end - 1])) --end;
        parts.push_back(Value::string(s.substr(i, end - i)));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_ascii_space(s[j])) ++j;
      parts.push_back(Value::string(s.substr(i, j - i)));
      i = j;
    }
    return Value::array(std::move(parts));
  }
  std::string sep = sep_v.str();
  if (sep.empty()) return make_error(StatusCode::kInvalidArgument, "split: empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    size_t hit = s.find(sep, pos);
    if (hit == std::string::npos) break;
    parts.push_back(Value::string(s.substr(pos, hit - pos)));
    pos = hit + sep.size();
  }
  parts.push_back(Value::string(s.substr(pos)));
  return Value::array(std::move(parts));
}

Result<bool> affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) -> Result<bool> {
    if (!a.is_string())
      return make_error(StatusCode::kInvalidArgument, "{}with expects a str or tuple, not {}",
                        prefix ? "starts" : "ends", a.type_name());
    return prefix ? s.starts_with(a.as_string()) : s.ends_with(a.as_string());
  };
  if (!affix.is_array()) return one(affix);
  for (const Value& a : affix.items()) {
    DZ_ASSIGN_OR_RETURN(bool hit, one(a));
    if (hit) return true;
  }
  return false;
}

}  // namespace

bool is_known_test(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "!=",      "==",      "boolean",   "callable", "defined",  "divisibleby", "eq",
      "equalto", "even",    "false",     "float",    "ge",       "greaterthan", "gt",
      "in",      "integer", "iterable",  "le",       "lessthan", "lower",       "lt",
      "mapping", "ne",      "none",      "number",   "odd",      "sameas",      "sequence",
      "string",  "true",    "undefined", "upper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

Result<bool> apply_test(Interpreter& in, const std::string& name, const Value& v,
                        std::vector<Value>& args) {
  (void)in;
  Value other = args.empty() ? Value() : args[0];
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object();
  if (name == "iterable") return v.is_string() || v.is_array() || v.is_object() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_array() || v.is_object();
  if (name == "number") return v.is_number() || v.is_bool();  // Python's bool is a Number
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_function();
  if (name == "equalto" || name == "eq" || name == "==" || name == "sameas") return v.equals(other);
  if (name == "ne" || name == "!=") return !v.equals(other);
  if (name == "in") {
    if (other.is_string())
      return v.is_string() && other.as_string().find(v.as_string()) != std::string::npos;
    if (other.is_array())
      return std::any_of(other.items().begin(), other.items().end(),
                         [&](const Value& x) { return x.equals(v); });
    if (other.is_object()) return v.is_string() && other.find(v.as_string()) != nullptr;
    return make_error(StatusCode::kInvalidArgument, "test 'in' needs a container");
  }
  if (name == "gt" || name == "lt" || name == "ge" || name == "le" || name == "greaterthan" ||
      name == "lessthan") {
    DZ_ASSIGN_OR_RETURN(int c, compare_values(v, other));
    if (name == "gt" || name == "greaterthan") return c > 0;
    if (name == "lt" || name == "lessthan") return c < 0;
    return name == "ge" ? c >= 0 : c <= 0;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (!v.is_int())
      return make_error(StatusCode::kInvalidArgument, "test '{}' needs an integer", name);
    if (name == "divisibleby") {
      if (!other.is_int() || other.as_int() == 0)
        return make_error(StatusCode::kInvalidArgument, "divisibleby needs a non-zero integer");
      return v.as_int() % other.as_int() == 0;
    }
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    bool any = false;
    for (char c : v.as_string()) {
      if (std::isalpha(static_cast<unsigned char>(c))) {
        any = true;
        if (name == "lower" ? std::isupper(static_cast<unsigned char>(c))
                            : std::islower(static_cast<unsigned char>(c)))
          return false;
      }
    }
    return any;
  }
  return make_error(StatusCode::kUnsupported, "unknown test '{}'", name);
}

Result<Value> call_method(Interpreter& in, const Value& self, const std::string& name,
                          std::vector<Value>& args, Kwargs& kwargs, bool& found) {
  found = true;
  if (self.is_string()) {
    const std::string& s = self.as_string();
    if (name == "startswith" || name == "endswith") {
      DZ_ASSIGN_OR_RETURN(
          bool hit, affix_match(s, argument(args, kwargs, 0, "prefix"), name == "startswith"));
      return Value::boolean(hit);
    }
    if (name == "strip")
      return Value::string(py_strip(s, argument(args, kwargs, 0, "chars"), true, true));
    if (name == "lstrip")
      return Value::string(py_strip(s, argument(args, kwargs, 0, "chars"), true, false));
    if (name == "rstrip")
      return Value::string(py_strip(s, argument(args, kwargs, 0, "chars"), false, true));
    if (name == "split")
      return split(s, argument(args, kwargs, 0, "sep"), argument(args, kwargs, 1, "maxsplit"));
    if (name == "lower" || name == "upper" || name == "capitalize" || name == "replace") {
      std::vector<Value> rest = args;
      return apply_filter(in, name, self, rest, kwargs);
    }
    if (name == "title") {
      // str.title(): a word is a run of letters.
      std::string out = s;
      bool prev_letter = false;
      for (char& c : out) {
        auto uc = static_cast<unsigned char>(c);
        bool letter = std::isalpha(uc);
        if (letter) c = static_cast<char>(prev_letter ? std::tolower(uc) : std::toupper(uc));
        prev_letter = letter;
      }
      return Value::string(std::move(out));
    }
    if (name == "find" || name == "count") {
      std::string needle = argument(args, kwargs, 0, "sub").str();
      if (name == "find") {
        size_t hit = s.find(needle);
        if (hit == std::string::npos) return Value::integer(-1);
        return Value::integer(
            static_cast<int64_t>(utf8_length(std::string_view(s).substr(0, hit))));
      }
      if (needle.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t pos = s.find(needle); pos != std::string::npos;
           pos = s.find(needle, pos + needle.size()))
        ++n;
      return Value::integer(n);
    }
  } else if (self.is_object() && !self.is_namespace()) {
    if (name == "get") {
      const Value* hit = self.find(argument(args, kwargs, 0, "key").str());
      if (hit && argument(args, kwargs, 0, "key").is_string()) return *hit;
      Value fallback = argument(args, kwargs, 1, "default");
      return fallback.is_undefined() ? Value::none() : fallback;
    }
    if (name == "items" || name == "keys" || name == "values") {
      Array out;
      for (const auto& [k, v] : self.entries()) {
        if (name == "items") out.push_back(Value::array({Value::string(k), v}));
        if (name == "keys") out.push_back(Value::string(k));
        if (name == "values") out.push_back(v);
      }
      return Value::array(std::move(out));
    }
  } else if (self.is_array()) {
    // transformers renders in an ImmutableSandboxedEnvironment, which refuses these; Kimi's
    // templates call them on namespace lists, and @huggingface/jinja allows them.
    if (name == "append") {
      if (args.size() != 1)
        return make_error(StatusCode::kInvalidArgument, "append takes one argument");
      if (self.items().size() >= static_cast<size_t>(in.options.max_range_elems))
        return make_error(StatusCode::kResourceExhausted, "list grew past {} items",
                          in.options.max_range_elems);
      self.items().push_back(args[0]);
      return Value::none();
    }
    if (name == "pop") {
      auto n = static_cast<int64_t>(self.items().size());
      int64_t i = args.empty() ? -1 : (args[0].is_int() ? args[0].as_int() : 0);
      if (i < 0) i += n;
      if (i < 0 || i >= n)
        return make_error(StatusCode::kInvalidArgument, "pop index out of range");
      Value out = self.items()[static_cast<size_t>(i)];
      self.items().erase(self.items().begin() + i);
      return out;
    }
  }
  found = false;
  return Value();
}

bool is_known_global(std::string_view name) {
  return name == "raise_exception" || name == "range" || name == "namespace" || name == "dict" ||
         name == "strftime_now";
}

Result<Value> call_global(Interpreter& in, const std::string& name, std::vector<Value>& args,
                          Kwargs& kwargs, bool& found) {
  found = true;
  if (name == "raise_exception") {
    return make_error(StatusCode::kInvalidArgument, "template raised an exception: {}",
                      args.empty() ? std::string() : args[0].str());
  }
  if (name == "range") {
    for (const Value& a : args)
      if (!a.is_int()) return make_error(StatusCode::kInvalidArgument, "range() takes integers");
    if (args.empty() || args.size() > 3)
      return make_error(StatusCode::kInvalidArgument, "range() takes 1 to 3 arguments");
    int64_t start = args.size() == 1 ? 0 : args[0].as_int();
    int64_t stop = args.size() == 1 ? args[0].as_int() : args[1].as_int();
    int64_t step = args.size() == 3 ? args[2].as_int() : 1;
    if (step == 0) return make_error(StatusCode::kInvalidArgument, "range() step must not be zero");
    double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                             static_cast<double>(step));
    if (count > static_cast<double>(in.options.max_range_elems))
      return make_error(StatusCode::kResourceExhausted,
                        "range() of {} items exceeds the limit of {}", static_cast<int64_t>(count),
                        in.options.max_range_elems);
    Array items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
      items.push_back(Value::integer(i));
    return Value::array(std::move(items));
  }
  if (name == "namespace" || name == "dict") {
    Object entries;
    if (!args.empty() && args[0].is_object()) entries = args[0].entries();
    for (auto& [k, v] : kwargs) {
      bool replaced = false;
      for (auto& [ek, ev] : entries)
        if (ek == k) {
          ev = v;
          replaced = true;
        }
      if (!replaced) entries.emplace_back(k, v);
    }
    return name == "namespace" ? Value::namespace_object(std::move(entries))
                               : Value::object(std::move(entries));
  }
  if (name == "strftime_now") {
    std::time_t now = in.options.now
                          ? *in.options.now
                          : std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm local{};
    localtime_r(&now, &local);
    std::string format = args.empty() ? "" : args[0].str();
    if (format.empty() || format.size() > 256)
      return make_error(StatusCode::kInvalidArgument,
                        "strftime_now needs a format of 1 to 256 bytes");
    char buf[1024];
    size_t n = std::strftime(buf, sizeof(buf), format.c_str(), &local);
    return Value::string(std::string(buf, n));
  }
  found = false;
  return Value();
}

}  // namespace dz::serve::chat
