#include "dayzero/serve/tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>

#include "dayzero/core/check.h"

namespace dz::serve {
namespace {

// ---- pattern translation ------------------------------------------------------------------------

// A character class as Rust regex and Oniguruma read it: operands joined by `&&` (intersection),
// each operand the union of plain items (kept as PCRE2 class text) and nested classes.
struct ClassNode;
struct ClassOperand {
  std::string flat;
  std::vector<ClassNode> nested;
};
struct ClassNode {
  bool negated = false;
  std::vector<ClassOperand> operands;
};

// True when PCRE2 knows `name` as a script, so `\p{name}` has to be pinned to the Script property.
bool is_script_name(std::string_view name) {
  std::string probe = "\\p{sc:" + std::string(name) + "}";
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(probe.data()), probe.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) return false;
  pcre2_code_free(code);
  return true;
}

class Translator {
 public:
  explicit Translator(std::string_view pattern) : p_(pattern) {}

  Result<std::string> run() {
    std::string out;
    while (i_ < p_.size()) {
      char c = p_[i_];
      if (c == '\\') {
        DZ_RETURN_IF_ERROR(escape(out));
      } else if (c == '[') {
        DZ_ASSIGN_OR_RETURN(ClassNode node, parse_class());
        DZ_ASSIGN_OR_RETURN(std::string emitted, emit(node));
        out += emitted;
      } else {
        copy_code_point(out);
      }
    }
    return out;
  }

 private:
  void copy_code_point(std::string& out) {
    size_t num_bytes = utf8_sequence_bytes(static_cast<unsigned char>(p_[i_]));
    out.append(p_.substr(i_, num_bytes));
    i_ += num_bytes;
  }

  // At a backslash: `\p{Name}` / `\P{Name}` get the script fix, any other escape is copied whole.
  Status escape(std::string& out) {
    if (i_ + 1 >= p_.size()) return error("trailing backslash");
    char kind = p_[i_ + 1];
    if ((kind == 'p' || kind == 'P') && i_ + 2 < p_.size() && p_[i_ + 2] == '{') {
      size_t close = p_.find('}', i_ + 3);
      if (close == std::string_view::npos) return error("unterminated \\p{...}");
      std::string_view name = p_.substr(i_ + 3, close - i_ - 3);
      std::string_view negation;
      if (!name.empty() && name.front() == '^') {
        negation = "^";
        name.remove_prefix(1);
      }
      out += '\\';
      out += kind;
      out += '{';
      out += negation;
      if (name.find_first_of(":=") == std::string_view::npos && is_script_name(name)) out += "sc:";
      out += name;
      out += '}';
      i_ = close + 1;
      return Status::ok_status();
    }
    out += '\\';
    ++i_;
    copy_code_point(out);
    return Status::ok_status();
  }

  // At `[`: reads up to the matching `]`, with nested classes and `&&` operands.
  Result<ClassNode> parse_class() {
    size_t start = i_;
    ++i_;
    ClassNode node;
    if (i_ < p_.size() && p_[i_] == '^') {
      node.negated = true;
      ++i_;
    }
    node.operands.emplace_back();
    bool first = true;
    while (i_ < p_.size()) {
      char c = p_[i_];
      ClassOperand& operand = node.operands.back();
      if (c == ']' && !first) {
        ++i_;
        return node;
      }
      if (c == ']') {  // a `]` first in a class is a literal
        operand.flat += "\\]";
        ++i_;
      } else if (c == '\\') {
        DZ_RETURN_IF_ERROR(escape(operand.flat));
      } else if (c == '[' && i_ + 1 < p_.size() && p_[i_ + 1] == ':') {
        size_t close = p_.find(":]", i_ + 2);
        if (close == std::string_view::npos) return error("unterminated POSIX class");
        operand.flat.append(p_.substr(i_, close + 2 - i_));
        i_ = close + 2;
      } else if (c == '[') {
        DZ_ASSIGN_OR_RETURN(ClassNode nested, parse_class());
        operand.nested.push_back(std::move(nested));
      } else if (c == '&' && i_ + 1 < p_.size() && p_[i_ + 1] == '&') {
        node.operands.emplace_back();
        i_ += 2;
      } else {
        copy_code_point(operand.flat);
      }
      first = false;
    }
    i_ = start;
    return error("unterminated character class");
  }

  // One code point in `node`, as PCRE2 text. A plain class stays a class; a class with nested
  // classes or intersections becomes (?=A)(?=B)C for A && B && C, and a union of alternatives.
  Result<std::string> emit(const ClassNode& node) {
    const bool simple = node.operands.size() == 1 && node.operands[0].nested.empty();
    if (simple) {
      return std::string("[") + (node.negated ? "^" : "") + escaped_flat(node.operands[0]) + "]";
    }
    std::vector<std::string> operands;
    for (const ClassOperand& operand : node.operands) {
      std::vector<std::string> parts;
      if (!operand.flat.empty()) parts.push_back("[" + escaped_flat(operand) + "]");
      for (const ClassNode& nested : operand.nested) {
        DZ_ASSIGN_OR_RETURN(std::string part, emit(nested));
        parts.push_back(std::move(part));
      }
      if (parts.empty()) return error("empty operand in a class intersection");
      if (parts.size() == 1) {
        operands.push_back(std::move(parts[0]));
      } else {
        std::string joined = "(?:";
        for (size_t k = 0; k < parts.size(); ++k) joined += (k ? "|" : "") + parts[k];
        operands.push_back(joined + ")");
      }
    }
    std::string body;
    if (operands.size() == 1) {
      body = operands[0];
    } else {
      body = "(?:";
      for (size_t k = 0; k + 1 < operands.size(); ++k) body += "(?=" + operands[k] + ")";
      body += operands.back() + ")";
    }
    if (node.negated) return "(?:(?!" + body + ")[\\s\\S])";
    return body;
  }

  // A leading `^` inside an operand after `&&` is a literal, not a negation.
  static std::string escaped_flat(const ClassOperand& operand) {
    if (!operand.flat.empty() && operand.flat.front() == '^') return "\\" + operand.flat;
    return operand.flat;
  }

  Status error(std::string_view what) const {
    return make_error(StatusCode::kInvalidArgument, "pattern \"{}\": {} at offset {}", p_, what,
                      i_);
  }

  std::string_view p_;
  size_t i_ = 0;
};

// ---- matching -----------------------------------------------------------------------------------

// One JIT stack and match context per thread, shared by every Regex: long whitespace runs need
// more than PCRE2's default 32 KiB of JIT stack.
struct ThreadMatchState {
  pcre2_jit_stack* jit_stack = nullptr;
  pcre2_match_context* context = nullptr;
  ThreadMatchState() {
    context = pcre2_match_context_create(nullptr);
    jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    if (context != nullptr && jit_stack != nullptr) {
      pcre2_jit_stack_assign(context, nullptr, jit_stack);
    }
  }
  ~ThreadMatchState() {
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    if (context != nullptr) pcre2_match_context_free(context);
  }
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

std::string pcre2_message(int error_code) {
  std::array<PCRE2_UCHAR, 256> buffer{};
  pcre2_get_error_message(error_code, buffer.data(), buffer.size());
  return reinterpret_cast<const char*>(buffer.data());
}

}  // namespace

Result<std::string> translate_pattern(std::string_view pattern) {
  return Translator(pattern).run();
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Regex::Regex() = default;
Regex::~Regex() = default;
Regex::Regex(Regex&& other) noexcept = default;
Regex& Regex::operator=(Regex&& other) noexcept = default;

Result<Regex> Regex::compile(std::string_view pattern) {
  DZ_ASSIGN_OR_RETURN(std::string translated, translate_pattern(pattern));
  int error_code = 0;
  PCRE2_SIZE error_offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                    PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
  if (code == nullptr) {
    std::string where = translated == pattern ? "" : " (as PCRE2: \"" + translated + "\")";
    return make_error(StatusCode::kInvalidArgument, "pattern \"{}\"{}: {} at offset {}", pattern,
                      where, pcre2_message(error_code), error_offset);
  }
  Regex regex;
  regex.code_ = std::make_unique<Code>();
  regex.code_->code = code;
  regex.pattern_ = std::string(pattern);
  uint32_t has_jit = 0;
  pcre2_config(PCRE2_CONFIG_JIT, &has_jit);
  // JIT is an optimization only: when it is missing or fails, the interpreter gives the same
  // matches.
  regex.jit_ = has_jit != 0 && pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return regex;
}

Result<std::vector<RegexMatch>> Regex::find_all(std::string_view text) const {
  DZ_CHECK(code_ != nullptr);
  ThreadMatchState& state = thread_match_state();
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (data == nullptr) return make_error(StatusCode::kInternal, "out of memory for regex match");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::vector<RegexMatch> matches;
  size_t pos = 0;
  Status status;
  while (pos <= text.size()) {
    int rc = jit_ ? pcre2_jit_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK,
                                    data, state.context)
                  : pcre2_match(code_->code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, data,
                                state.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      status = make_error(StatusCode::kInvalidArgument, "pattern \"{}\" failed at byte {}: {}",
                          pattern_, pos, pcre2_message(rc));
      break;
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
    size_t begin = ovector[0];
    size_t end = ovector[1];
    if (end > begin) {
      matches.push_back({begin, end});
      pos = end;
    } else {
      if (end >= text.size()) break;
      pos = end + utf8_sequence_bytes(static_cast<unsigned char>(text[end]));
    }
  }
  pcre2_match_data_free(data);
  if (!status.ok()) return status;
  return matches;
}

size_t utf8_error_offset(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    auto lead = static_cast<unsigned char>(text[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t num_bytes = utf8_sequence_bytes(lead);
    if (num_bytes == 1 || lead > 0xF4 || i + num_bytes > text.size()) return i;
    uint32_t code_point = lead & (0xFF >> (num_bytes + 1));
    for (size_t k = 1; k < num_bytes; ++k) {
      auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return i;
      code_point = (code_point << 6) | (next & 0x3F);
    }
    static constexpr std::array<uint32_t, 5> kMinCodePoint = {0, 0, 0x80, 0x800, 0x10000};
    if (code_point < kMinCodePoint[num_bytes] || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return i;
    }
    i += num_bytes;
  }
  return std::string_view::npos;
}

}  // namespace dz::serve
