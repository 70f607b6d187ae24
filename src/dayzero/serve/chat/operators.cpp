// Python's operators on template values: arithmetic, `in`, subscripts and slices.

#include <algorithm>
#include <cmath>

#include "dayzero/serve/chat/interpreter.h"

namespace dz::serve::chat {

Result<Value> arithmetic(const std::string& op, const Value& a, const Value& b,
                         const RenderOptions& options) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::string(a.as_string() + b.as_string());
    if (a.is_array() && b.is_array()) {
      Array items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::array(std::move(items));
    }
  }
  if (op == "*" && ((a.is_string() && b.is_int()) || (a.is_int() && b.is_string()))) {
    const Value& s = a.is_string() ? a : b;
    int64_t times = a.is_int() ? a.as_int() : b.as_int();
    if (times <= 0) return Value::string("");
    if (s.as_string().size() * static_cast<uint64_t>(times) > options.max_output_bytes)
      return make_error(StatusCode::kResourceExhausted, "string repetition exceeds {} bytes",
                        options.max_output_bytes);
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += s.as_string();
    return Value::string(std::move(out));
  }
  auto is_num = [](const Value& v) { return v.is_number() || v.is_bool(); };
  if (!is_num(a) || !is_num(b))
    return make_error(StatusCode::kInvalidArgument,
                      "unsupported operand types for {}: '{}' and '{}'", op, a.type_name(),
                      b.type_name());
  auto as_i = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  auto as_d = [&](const Value& v) { return v.is_bool() ? double(v.as_bool()) : v.as_double(); };
  bool ints = !a.is_float() && !b.is_float();
  if (op == "/") {
    if (as_d(b) == 0) return make_error(StatusCode::kInvalidArgument, "division by zero");
    return Value::floating(as_d(a) / as_d(b));
  }
  if (ints) {
    int64_t x = as_i(a), y = as_i(b), r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
    if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
    if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
    if (op == "//" || op == "%") {
      if (y == 0) return make_error(StatusCode::kInvalidArgument, "integer division by zero");
      if (x == INT64_MIN && y == -1)
        overflow = true;
      else {
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors
          --q;
          m += y;
        }
        r = op == "//" ? q : m;
      }
    }
    if (op == "**") {
      if (y < 0) return Value::floating(std::pow(double(x), double(y)));
      r = 1;
      for (int64_t i = 0; i < y && !overflow; ++i) overflow = __builtin_mul_overflow(r, x, &r);
    }
    if (overflow) return make_error(StatusCode::kInvalidArgument, "integer overflow in {}", op);
    return Value::integer(r);
  }
  double x = as_d(a), y = as_d(b);
  if (op == "+") return Value::floating(x + y);
  if (op == "-") return Value::floating(x - y);
  if (op == "*") return Value::floating(x * y);
  if (op == "**") return Value::floating(std::pow(x, y));
  if (y == 0) return make_error(StatusCode::kInvalidArgument, "float division by zero");
  double q = std::floor(x / y);
  if (op == "//") return Value::floating(q);
  return Value::floating(x - q * y);
}

Result<bool> contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string())
      return make_error(StatusCode::kInvalidArgument, "'in <string>' requires a string, not {}",
                        item.type_name());
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const Value& v : container.items())
      if (v.equals(item)) return true;
    return false;
  }
  if (container.is_object()) return item.is_string() && container.find(item.as_string()) != nullptr;
  if (container.is_undefined()) return false;
  return make_error(StatusCode::kInvalidArgument, "argument of type '{}' is not iterable",
                    container.type_name());
}

Result<Value> slice(const Value& value, const Value& start_v, const Value& stop_v,
                    const Value& step_v) {
  auto opt = [](const Value& v, int64_t fallback) -> Result<int64_t> {
    if (v.is_undefined() || v.is_none()) return fallback;
    if (!v.is_int())
      return make_error(StatusCode::kInvalidArgument, "slice indices must be integers");
    return v.as_int();
  };
  DZ_ASSIGN_OR_RETURN(int64_t step, opt(step_v, 1));
  if (step == 0) return make_error(StatusCode::kInvalidArgument, "slice step cannot be zero");
  std::vector<uint32_t> cps;
  int64_t length = 0;
  if (value.is_string()) {
    cps = utf8_decode(value.as_string());
    length = static_cast<int64_t>(cps.size());
  } else if (value.is_array()) {
    length = static_cast<int64_t>(value.items().size());
  } else {
    return make_error(StatusCode::kInvalidArgument, "'{}' object cannot be sliced",
                      value.type_name());
  }
  // Python's slice.indices().
  auto clamp = [&](int64_t i) {
    if (i < 0) i += length;
    return step > 0 ? std::clamp<int64_t>(i, 0, length) : std::clamp<int64_t>(i, -1, length - 1);
  };
  DZ_ASSIGN_OR_RETURN(int64_t start, opt(start_v, step > 0 ? 0 : length - 1));
  DZ_ASSIGN_OR_RETURN(int64_t stop, opt(stop_v, step > 0 ? length : -length - 1));
  start = start_v.is_undefined() || start_v.is_none() ? start : clamp(start);
  stop = clamp(stop);
  std::vector<int64_t> picks;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
  if (value.is_string()) {
    std::string out;
    for (int64_t i : picks)
      out += utf8_encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1);
    return Value::string(std::move(out));
  }
  Array items;
  for (int64_t i : picks) items.push_back(value.items()[static_cast<size_t>(i)]);
  return Value::array(std::move(items));
}

Result<Value> subscript(const Value& value, const Value& key) {
  if (value.is_object()) {
    if (!key.is_string()) return Value();
    const Value* found = value.find(key.as_string());
    return found ? *found : Value();
  }
  if (value.is_array() || value.is_string()) {
    if (!key.is_int()) {
      if (key.is_string()) return Value();  // x['attr'] on a list: Undefined, as jinja2
      return make_error(StatusCode::kInvalidArgument, "indices must be integers, not {}",
                        key.type_name());
    }
    int64_t i = key.as_int();
    if (value.is_array()) {
      auto n = static_cast<int64_t>(value.items().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value();
      return value.items()[static_cast<size_t>(i)];
    }
    std::vector<uint32_t> cps = utf8_decode(value.as_string());
    auto n = static_cast<int64_t>(cps.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value();
    return Value::string(utf8_encode(cps, static_cast<size_t>(i), static_cast<size_t>(i) + 1));
  }
  if (value.is_undefined())
    return make_error(StatusCode::kInvalidArgument, "cannot index an undefined value");
  return Value();
}

}  // namespace dz::serve::chat
