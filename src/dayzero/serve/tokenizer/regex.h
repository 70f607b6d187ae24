#pragma once
// PCRE2 for the split patterns of tokenizers. Checkpoints write their patterns for the Rust `regex`
// crate (tiktoken) or Oniguruma (HF tokenizers); `translate_pattern` rewrites the two constructs
// whose meaning differs in PCRE2, and `Regex` compiles the result in UTF + UCP mode, with JIT
// when the library has it.

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::serve {

// A match as byte offsets into the searched text: [begin, end).
struct RegexMatch {
  size_t begin = 0;
  size_t end = 0;
};

// Rewrites a Rust-regex / Oniguruma pattern into one PCRE2 reads the same way:
//  - a bare script name (`\p{Han}`) means the Script property there, but Script_Extensions in
//    PCRE2 >= 10.40 (which would put `、` and `。` in \p{Han}); it becomes `\p{sc:Han}`;
//  - character classes with nested classes or `&&` intersections (Kimi's
//    `[\p{Lu}\p{M}&&[^\p{Han}]]`), which PCRE2 reads as literal `[` and `&`, become lookahead
//    groups that match the same single code point.
// Everything else (inline flags, lookaround, possessive quantifiers, \p{..} categories) is passed
// through unchanged.
Result<std::string> translate_pattern(std::string_view pattern);

// A compiled pattern. Move-only; matching is const and safe from several threads at once.
class Regex {
 public:
  // Translates and compiles `pattern`; errors name the pattern and the offset PCRE2 reports.
  static Result<Regex> compile(std::string_view pattern);

  Regex();
  ~Regex();
  Regex(Regex&& other) noexcept;
  Regex& operator=(Regex&& other) noexcept;
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Every non-overlapping match, left to right, as the Rust crates iterate them: after an empty
  // match the search resumes one code point further. `text` must be valid UTF-8 (callers check
  // once per request; see `utf8_error_offset`).
  Result<std::vector<RegexMatch>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  struct Code;
  std::unique_ptr<Code> code_;
  std::string pattern_;
  bool jit_ = false;
};

// The offset of the first byte that is not part of valid UTF-8, or std::string_view::npos.
size_t utf8_error_offset(std::string_view text);

// Length in bytes of the UTF-8 sequence that starts with `lead` (1 for a stray byte).
inline size_t utf8_sequence_bytes(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

}  // namespace dz::serve
