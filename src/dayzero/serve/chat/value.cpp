// Python semantics of the template value model: str(), repr(), ==, truthiness, json.dumps.

#include "dayzero/serve/chat/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace dz::serve::chat {

Value Value::boolean(bool b) {
  Value v(Kind::kBool);
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v(Kind::kInt);
  v.i_ = i;
  return v;
}
Value Value::floating(double f) {
  Value v(Kind::kFloat);
  v.f_ = f;
  return v;
}
Value Value::string(std::string s) {
  Value v(Kind::kString);
  v.s_ = std::move(s);
  return v;
}
Value Value::array(Array items) {
  Value v(Kind::kArray);
  v.array_ = std::make_shared<Array>(std::move(items));
  return v;
}
Value Value::object(Object items) {
  Value v(Kind::kObject);
  v.object_ = std::make_shared<Object>(std::move(items));
  return v;
}
Value Value::namespace_object(Object items) {
  Value v = object(std::move(items));
  v.namespace_ = true;
  return v;
}
Value Value::function(std::string name, Function fn) {
  Value v(Kind::kFunction);
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<Function>(std::move(fn));
  return v;
}

namespace {
template <typename Json>
Value value_from_json(const Json& json) {
  using Value_t = typename Json::value_t;
  switch (json.type()) {
    case Value_t::null:
      return Value::none();
    case Value_t::boolean:
      return Value::boolean(json.template get<bool>());
    case Value_t::number_integer:
      return Value::integer(json.template get<int64_t>());
    case Value_t::number_unsigned: {
      uint64_t u = json.template get<uint64_t>();
      return u > static_cast<uint64_t>(INT64_MAX) ? Value::floating(static_cast<double>(u))
                                                  : Value::integer(static_cast<int64_t>(u));
    }
    case Value_t::number_float:
      return Value::floating(json.template get<double>());
    case Value_t::string:
      return Value::string(json.template get<std::string>());
    case Value_t::array: {
      Array items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(value_from_json(item));
      return Value::array(std::move(items));
    }
    case Value_t::object: {
      // nlohmann::json iterates in sorted key order, ordered_json in insertion order.
      Object entries;
      for (auto it = json.begin(); it != json.end(); ++it)
        entries.emplace_back(it.key(), value_from_json(it.value()));
      return Value::object(std::move(entries));
    }
    default:
      return Value();
  }
}
}  // namespace

Value Value::from_json(const nlohmann::json& json) {
  return value_from_json(json);
}
Value Value::from_json(const nlohmann::ordered_json& json) {
  return value_from_json(json);
}

const Value* Value::find(std::string_view key) const {
  if (kind_ != Kind::kObject) return nullptr;
  for (const auto& [k, v] : *object_)
    if (k == key) return &v;
  return nullptr;
}

void Value::set(const std::string& key, Value value) const {
  for (auto& [k, v] : *object_)
    if (k == key) {
      v = std::move(value);
      return;
    }
  object_->emplace_back(key, std::move(value));
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kArray:
      return !array_->empty();
    case Kind::kObject:
      return !object_->empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string format_python_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |x| < 1e16.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  std::string sci(buf, end);  // "-1.2345e+02"
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out;
  if (exponent >= -5 && exponent < 16) {
    int point = exponent + 1;  // digits before the decimal point
    if (point <= 0) {
      out = "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(point)) + "." +
            digits.substr(static_cast<size_t>(point));
    }
    // Python switches to exponent form below 1e-4.
    if (exponent < -4) {
      out = digits.substr(0, 1);
      if (digits.size() > 1) out += "." + digits.substr(1);
      char exp_buf[16];
      std::snprintf(exp_buf, sizeof(exp_buf), "e-%02d", -exponent);
      out += exp_buf;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    out += exp_buf;
  }
  return negative ? "-" + out : out;
}

namespace {

std::string python_string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<unsigned char>(quote)) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::repr() const {
  if (kind_ == Kind::kString) return python_string_repr(s_);
  return str();
}

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return format_python_float(f_);
    case Kind::kString:
      return s_;
    case Kind::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < array_->size(); ++i) {
        if (i) out += ", ";
        out += (*array_)[i].repr();
      }
      return out + "]";
    }
    case Kind::kObject: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, v] : *object_) {
        if (!first) out += ", ";
        first = false;
        out += python_string_repr(k) + ": " + v.repr();
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function " + s_ + ">";
  }
  return "";
}

bool Value::equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_int() && other.is_int()) return i_ == other.i_;
    return as_double() == other.as_double();
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == other.b_;
    case Kind::kString:
      return s_ == other.s_;
    case Kind::kArray:
      if (array_->size() != other.array_->size()) return false;
      for (size_t i = 0; i < array_->size(); ++i)
        if (!(*array_)[i].equals((*other.array_)[i])) return false;
      return true;
    case Kind::kObject:
      if (object_->size() != other.object_->size()) return false;
      for (const auto& [k, v] : *object_) {
        const Value* o = other.find(k);
        if (!o || !v.equals(*o)) return false;
      }
      return true;
    case Kind::kFunction:
      return fn_ == other.fn_;
    default:
      return false;
  }
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kArray:
      return "list";
    case Kind::kObject:
      return namespace_ ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "?";
}

namespace {

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  std::vector<uint32_t> cps;
  if (ensure_ascii) cps = utf8_decode(s);
  auto escape_cp = [&](uint32_t cp) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    out += buf;
  };
  auto plain = [&](uint32_t c) -> bool {
    switch (c) {
      case '"':
        out += "\\\"";
        return true;
      case '\\':
        out += "\\\\";
        return true;
      case '\n':
        out += "\\n";
        return true;
      case '\r':
        out += "\\r";
        return true;
      case '\t':
        out += "\\t";
        return true;
      case '\b':
        out += "\\b";
        return true;
      case '\f':
        out += "\\f";
        return true;
      default:
        if (c < 0x20) {
          escape_cp(c);
          return true;
        }
        return false;
    }
  };
  if (!ensure_ascii) {
    for (unsigned char c : s)
      if (!plain(c)) out += static_cast<char>(c);
  } else {
    for (uint32_t cp : cps) {
      if (plain(cp)) continue;
      if (cp < 0x7f) {
        out += static_cast<char>(cp);
      } else if (cp < 0x10000) {
        escape_cp(cp);
      } else {
        cp -= 0x10000;
        escape_cp(0xd800 + (cp >> 10));
        escape_cp(0xdc00 + (cp & 0x3ff));
      }
    }
  }
  out += '"';
}

Status dump_json_into(const Value& v, const JsonDumpOptions& o, int depth, std::string& out) {
  if (depth > 512) return make_error(StatusCode::kInvalidArgument, "tojson: nesting too deep");
  const std::string item_sep = !o.item_separator.empty() ? o.item_separator
                               : o.indent >= 0           ? ","
                                                         : ", ";
  auto newline = [&](int level) {
    if (o.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(o.indent * level), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return {};
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return {};
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return {};
    case Value::Kind::kFloat: {
      double f = v.as_double();
      out += std::isnan(f)   ? "NaN"
             : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity")
                             : format_python_float(f);
      return {};
    }
    case Value::Kind::kString:
      json_string(v.as_string(), o.ensure_ascii, out);
      return {};
    case Value::Kind::kArray: {
      const Array& items = v.items();
      if (items.empty()) {
        out += "[]";
        return {};
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        DZ_RETURN_IF_ERROR(dump_json_into(items[i], o, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return {};
    }
    case Value::Kind::kObject: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& entry : v.entries()) entries.push_back(&entry);
      if (o.sort_keys)
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      if (entries.empty()) {
        out += "{}";
        return {};
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        json_string(entries[i]->first, o.ensure_ascii, out);
        out += o.key_separator;
        DZ_RETURN_IF_ERROR(dump_json_into(entries[i]->second, o, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return {};
    }
    default:
      return make_error(StatusCode::kInvalidArgument, "tojson: {} is not JSON serializable",
                        v.type_name());
  }
}

}  // namespace

Result<std::string> dump_json(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  DZ_RETURN_IF_ERROR(dump_json_into(value, options, 0, out));
  return out;
}

std::vector<uint32_t> utf8_decode(std::string_view text) {
  // Invalid bytes decode to themselves (one code point each) so lengths stay defined.
  std::vector<uint32_t> out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    auto c = static_cast<unsigned char>(text[i]);
    size_t extra = c >= 0xf0 ? 3 : c >= 0xe0 ? 2 : c >= 0xc0 ? 1 : 0;
    if (c >= 0x80 && c < 0xc0) extra = 0;
    if (extra && i + extra >= text.size()) extra = 0;
    uint32_t cp = extra == 0 ? c : c & (0x3fu >> extra);
    bool ok = true;
    for (size_t k = 1; k <= extra; ++k) {
      auto cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xc0) != 0x80) ok = false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if (!ok) {
      out.push_back(c | 0x80000000u);  // marker: a raw byte
      ++i;
      continue;
    }
    out.push_back(extra == 0 && c >= 0x80 ? (c | 0x80000000u) : cp);  // stray byte: raw
    i += extra + 1;
  }
  return out;
}

std::string utf8_encode(const std::vector<uint32_t>& cps, size_t begin, size_t end) {
  std::string out;
  for (size_t i = begin; i < end; ++i) {
    uint32_t cp = cps[i];
    if (cp & 0x80000000u) {
      out += static_cast<char>(cp & 0xff);
    } else if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

size_t utf8_length(std::string_view text) {
  size_t n = 0;
  for (unsigned char c : text)
    if ((c & 0xc0) != 0x80) ++n;
  return n;
}

Value argument(std::vector<Value>& args, Kwargs& kwargs, size_t i, std::string_view name) {
  if (i < args.size()) return args[i];
  for (auto& [k, v] : kwargs)
    if (k == name) return v;
  return Value();
}

}  // namespace dz::serve::chat
