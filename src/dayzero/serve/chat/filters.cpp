// Jinja filters as jinja2 (and transformers, for tojson) define them.

#include <algorithm>
#include <cctype>
#include <cmath>

#include "dayzero/serve/chat/interpreter.h"

namespace dz::serve::chat {
namespace {

Status bad(std::string_view filter, std::string_view what) {
  return make_error(StatusCode::kInvalidArgument, "filter '{}': {}", filter, what);
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

bool is_py_space(uint32_t cp) {
  return cp == ' ' || (cp >= '\t' && cp <= '\r') || (cp >= 0x1c && cp <= 0x1f) || cp == 0x85 ||
         cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

Result<Array> to_list(std::string_view filter, const Value& v) {
  if (v.is_array()) return v.items();
  if (v.is_undefined()) return Array{};
  if (v.is_object()) {
    Array keys;
    for (const auto& [k, x] : v.entries()) keys.push_back(Value::string(k));
    return keys;
  }
  if (v.is_string()) {
    std::vector<uint32_t> cps = utf8_decode(v.as_string());
    Array chars;
    for (size_t i = 0; i < cps.size(); ++i)
      chars.push_back(Value::string(utf8_encode(cps, i, i + 1)));
    return chars;
  }
  return bad(filter, fmt::format("'{}' object is not iterable", v.type_name()));
}

}  // namespace

// Python str.strip/lstrip/rstrip: `chars` Undefined or None strips whitespace.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::vector<uint32_t> cps = utf8_decode(s);
  std::vector<uint32_t> set;
  bool whitespace = chars.is_undefined() || chars.is_none();
  if (!whitespace) set = utf8_decode(chars.str());
  auto strip_me = [&](uint32_t cp) {
    return whitespace ? is_py_space(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip_me(cps[begin])) ++begin;
  if (right)
    while (end > begin && strip_me(cps[end - 1])) --end;
  return utf8_encode(cps, begin, end);
}

Value get_attribute_path(const Value& value, const std::string& path) {
  Value current = value;
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (current.is_object()) {
      const Value* found = current.find(part);
      current = found ? *found : Value();
    } else if (current.is_array() && !part.empty() &&
               std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(c); })) {
      size_t i = std::stoul(part);
      current = i < current.items().size() ? current.items()[i] : Value();
    } else {
      return Value();
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return current;
}

Result<int> compare_values(const Value& a, const Value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    double x = a.is_bool() ? a.as_bool() : a.as_double();
    double y = b.is_bool() ? b.as_bool() : b.as_double();
    if (a.is_int() && b.is_int()) return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.as_string().compare(b.as_string());  // UTF-8 byte order is code-point order
    return c < 0 ? -1 : c > 0;
  }
  return make_error(StatusCode::kInvalidArgument, "'<' not supported between '{}' and '{}'",
                    a.type_name(), b.type_name());
}

bool is_known_filter(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "abs",    "capitalize", "count",      "d",       "default", "first", "float",  "indent",
      "int",    "items",      "join",       "last",    "length",  "list",  "lower",  "lstrip",
      "map",    "reject",     "rejectattr", "replace", "reverse", "round", "rstrip", "safe",
      "select", "selectattr", "sort",       "split",   "string",  "strip", "sum",    "title",
      "tojson", "trim",       "unique",     "upper"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

Result<Value> apply_filter(Interpreter& in, const std::string& name, const Value& input,
                           std::vector<Value>& args, Kwargs& kwargs) {
  const Value& v = input;
  if (name == "safe" || name == "string") {
    if (name == "safe") return v;
    return Value::string(v.str());
  }
  if (name == "tojson") {
    // transformers' override: tojson(x, ensure_ascii=False, indent=None, separators=None,
    // sort_keys=False) = json.dumps with those arguments (no HTML escaping).
    JsonDumpOptions options;
    options.ensure_ascii = argument(args, kwargs, 0, "ensure_ascii").truthy();
    Value indent = argument(args, kwargs, 1, "indent");
    if (indent.is_int())
      options.indent = static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64));
    Value separators = argument(args, kwargs, 2, "separators");
    if (separators.is_array() && separators.items().size() == 2) {
      options.item_separator = separators.items()[0].str();
      options.key_separator = separators.items()[1].str();
    }
    options.sort_keys = argument(args, kwargs, 3, "sort_keys").truthy();
    DZ_ASSIGN_OR_RETURN(std::string text, dump_json(v, options));
    return Value::string(std::move(text));
  }
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::integer(static_cast<int64_t>(utf8_length(v.as_string())));
    if (v.is_array()) return Value::integer(static_cast<int64_t>(v.items().size()));
    if (v.is_object()) return Value::integer(static_cast<int64_t>(v.entries().size()));
    if (v.is_undefined()) return Value::integer(0);
    return bad(name, fmt::format("object of type '{}' has no len()", v.type_name()));
  }
  if (name == "trim" || name == "strip")
    return Value::string(py_strip(v.str(), argument(args, kwargs, 0, "chars"), true, true));
  if (name == "lstrip")
    return Value::string(py_strip(v.str(), argument(args, kwargs, 0, "chars"), true, false));
  if (name == "rstrip")
    return Value::string(py_strip(v.str(), argument(args, kwargs, 0, "chars"), false, true));
  if (name == "upper") return Value::string(ascii_upper(v.str()));
  if (name == "lower") return Value::string(ascii_lower(v.str()));
  if (name == "capitalize") {
    std::string s = ascii_lower(v.str());
    if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
    return Value::string(std::move(s));
  }
  if (name == "title") {
    // jinja2: a word starts after '-', whitespace, '(', '{', '[' or '<'.
    std::string s = v.str();
    bool word_start = true;
    for (char& c : s) {
      bool separator = c == '-' || std::isspace(static_cast<unsigned char>(c)) || c == '(' ||
                       c == '{' || c == '[' || c == '<';
      if (separator) {
        word_start = true;
        continue;
      }
      auto uc = static_cast<unsigned char>(c);
      c = static_cast<char>(word_start ? std::toupper(uc) : std::tolower(uc));
      word_start = false;
    }
    return Value::string(std::move(s));
  }
  if (name == "default" || name == "d") {
    Value fallback = argument(args, kwargs, 0, "default_value");
    bool boolean = argument(args, kwargs, 1, "boolean").truthy();
    if (v.is_undefined() || (boolean && !v.truthy()))
      return fallback.is_undefined() ? Value::string("") : fallback;
    return v;
  }
  if (name == "first" || name == "last") {
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    if (items.empty()) return Value();
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") {
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    return Value::array(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::array();
    if (!v.is_object()) return bad(name, fmt::format("expected a dict, got {}", v.type_name()));
    Array pairs;
    for (const auto& [k, x] : v.entries()) pairs.push_back(Value::array({Value::string(k), x}));
    return Value::array(std::move(pairs));
  }
  if (name == "join") {
    std::string sep =
        argument(args, kwargs, 0, "d").is_undefined() ? "" : argument(args, kwargs, 0, "d").str();
    Value attribute = argument(args, kwargs, 1, "attribute");
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += sep;
      out += attribute.is_undefined() ? items[i].str()
                                      : get_attribute_path(items[i], attribute.str()).str();
      if (out.size() > in.options.max_output_bytes)
        return make_error(StatusCode::kResourceExhausted, "join exceeds {} bytes",
                          in.options.max_output_bytes);
    }
    return Value::string(std::move(out));
  }
  if (name == "int") {
    Value fallback = argument(args, kwargs, 0, "default");
    Value dflt = fallback.is_undefined() ? Value::integer(0) : fallback;
    if (v.is_int()) return v;
    if (v.is_bool()) return Value::integer(v.as_bool());
    if (v.is_float())
      return std::isfinite(v.as_double()) ? Value::integer(static_cast<int64_t>(v.as_double()))
                                          : dflt;
    if (v.is_string()) {
      std::string s = py_strip(v.as_string(), Value(), true, true);
      char* end = nullptr;
      errno = 0;
      long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && *end == '\0' && errno == 0) return Value::integer(i);
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0' && std::isfinite(d))
        return Value::integer(static_cast<int64_t>(d));
    }
    return dflt;
  }
  if (name == "float") {
    Value fallback = argument(args, kwargs, 0, "default");
    Value dflt = fallback.is_undefined() ? Value::floating(0.0) : fallback;
    if (v.is_number()) return Value::floating(v.as_double());
    if (v.is_bool()) return Value::floating(v.as_bool());
    if (v.is_string()) {
      std::string s = py_strip(v.as_string(), Value(), true, true);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && *end == '\0') return Value::floating(d);
    }
    return dflt;
  }
  if (name == "abs") {
    if (v.is_int()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
    if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
    return bad(name, "expected a number");
  }
  if (name == "round") {
    Value precision = argument(args, kwargs, 0, "precision");
    std::string method = argument(args, kwargs, 1, "method").is_undefined()
                             ? "common"
                             : argument(args, kwargs, 1, "method").str();
    if (!v.is_number()) return bad(name, "expected a number");
    double scale =
        std::pow(10.0, precision.is_int() ? static_cast<double>(precision.as_int()) : 0.0);
    double x = v.as_double() * scale;
    double r = method == "ceil"    ? std::ceil(x)
               : method == "floor" ? std::floor(x)
                                   : std::nearbyint(x);
    return Value::floating(r / scale);  // Python's round() ties to even; jinja2 returns a float
  }
  if (name == "replace") {
    std::string s = v.str();
    std::string from = argument(args, kwargs, 0, "old").str(),
                to = argument(args, kwargs, 1, "new").str();
    Value count_v = argument(args, kwargs, 2, "count");
    int64_t count = count_v.is_int() ? count_v.as_int() : -1;
    std::string out;
    size_t pos = 0;
    int64_t done = 0;
    if (from.empty()) {
      // Python inserts `to` between characters (and at both ends).
      std::vector<uint32_t> cps = utf8_decode(s);
      for (size_t i = 0; i <= cps.size(); ++i) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        if (i < cps.size()) out += utf8_encode(cps, i, i + 1);
        if (out.size() > in.options.max_output_bytes) return bad(name, "result too large");
      }
      return Value::string(std::move(out));
    }
    while (count < 0 || done < count) {
      size_t hit = s.find(from, pos);
      if (hit == std::string::npos) break;
      out.append(s, pos, hit - pos);
      out += to;
      pos = hit + from.size();
      ++done;
      if (out.size() > in.options.max_output_bytes) return bad(name, "result too large");
    }
    out.append(s, pos);
    return Value::string(std::move(out));
  }
  if (name == "split") {
    bool found = false;
    Value self = Value::string(v.str());
    return call_method(in, self, "split", args, kwargs, found);
  }
  if (name == "indent") {
    Value width_v = argument(args, kwargs, 0, "width");
    std::string pad = width_v.is_string()
                          ? width_v.as_string()
                          : std::string(static_cast<size_t>(std::clamp<int64_t>(
                                            width_v.is_int() ? width_v.as_int() : 4, 0, 256)),
                                        ' ');
    bool first = argument(args, kwargs, 1, "first").truthy();
    bool blank = argument(args, kwargs, 2, "blank").truthy();
    std::string s = v.str() + "\n";  // jinja2 appends one newline before splitlines()
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < s.size()) {
      size_t nl = s.find('\n', start);
      lines.push_back(s.substr(start, nl - start));
      start = nl + 1;
    }
    std::string out;
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n";
      if (i > 0 && (blank || !lines[i].empty())) out += pad;
      out += lines[i];
      if (out.size() > in.options.max_output_bytes) return bad(name, "result too large");
    }
    if (first) out = pad + out;
    return Value::string(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<uint32_t> cps = utf8_decode(v.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value::string(utf8_encode(cps, 0, cps.size()));
    }
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    std::reverse(items.begin(), items.end());
    return Value::array(std::move(items));
  }
  if (name == "unique" || name == "sort") {
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    bool is_sort = name == "sort";
    bool reverse = is_sort && argument(args, kwargs, 0, "reverse").truthy();
    bool case_sensitive = argument(args, kwargs, is_sort ? 1 : 0, "case_sensitive").truthy();
    Value attribute = argument(args, kwargs, is_sort ? 2 : 1, "attribute");
    auto key = [&](const Value& item) {
      Value k = attribute.is_undefined() ? item : get_attribute_path(item, attribute.str());
      if (!case_sensitive && k.is_string()) return Value::string(ascii_lower(k.as_string()));
      return k;
    };
    if (!is_sort) {
      Array kept, keys;
      for (const Value& item : items) {
        Value k = key(item);
        bool seen =
            std::any_of(keys.begin(), keys.end(), [&](const Value& x) { return x.equals(k); });
        if (!seen) {
          keys.push_back(k);
          kept.push_back(item);
        }
      }
      return Value::array(std::move(kept));
    }
    Status failure;
    std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
      Result<int> c = compare_values(key(a), key(b));
      if (!c.ok()) {
        failure = c.status();
        return false;
      }
      return reverse ? *c > 0 : *c < 0;
    });
    if (!failure.ok()) return failure;
    return Value::array(std::move(items));
  }
  if (name == "sum") {
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    Value attribute = argument(args, kwargs, 0, "attribute");
    Value total = argument(args, kwargs, 1, "start");
    if (total.is_undefined()) total = Value::integer(0);
    for (const Value& item : items) {
      Value x = attribute.is_undefined() ? item : get_attribute_path(item, attribute.str());
      if (!x.is_number() || !total.is_number()) return bad(name, "expected numbers");
      total = total.is_int() && x.is_int() ? Value::integer(total.as_int() + x.as_int())
                                           : Value::floating(total.as_double() + x.as_double());
    }
    return total;
  }
  if (name == "map") {
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    Value attribute = argument(args, kwargs, 99, "attribute");
    Array out;
    if (!attribute.is_undefined()) {
      Value dflt = argument(args, kwargs, 99, "default");
      for (const Value& item : items) {
        Value x = get_attribute_path(item, attribute.str());
        out.push_back(x.is_undefined() && !dflt.is_undefined() ? dflt : x);
      }
      return Value::array(std::move(out));
    }
    if (args.empty()) return bad(name, "expected a filter name or attribute=");
    std::string filter = args[0].str();
    std::vector<Value> rest(args.begin() + 1, args.end());
    Kwargs no_kwargs;
    for (const Value& item : items) {
      std::vector<Value> call_args = rest;
      DZ_ASSIGN_OR_RETURN(Value x, apply_filter(in, filter, item, call_args, no_kwargs));
      out.push_back(std::move(x));
    }
    return Value::array(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
    DZ_ASSIGN_OR_RETURN(Array items, to_list(name, v));
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool keep_when = name == "selectattr" || name == "select";
    size_t first_test_arg = by_attr ? 1 : 0;
    if (by_attr && args.empty()) return bad(name, "expected an attribute name");
    Array out;
    for (const Value& item : items) {
      Value x = by_attr ? get_attribute_path(item, args[0].str()) : item;
      bool pass = false;
      if (args.size() <= first_test_arg) {
        pass = x.truthy();
      } else {
        std::vector<Value> test_args(args.begin() + static_cast<std::ptrdiff_t>(first_test_arg) + 1,
                                     args.end());
        DZ_ASSIGN_OR_RETURN(pass, apply_test(in, args[first_test_arg].str(), x, test_args));
      }
      if (pass == keep_when) out.push_back(item);
    }
    return Value::array(std::move(out));
  }
  return make_error(StatusCode::kUnsupported, "unknown filter '{}'", name);
}

}  // namespace dz::serve::chat
