#pragma once
// dayzero's Jinja subset for Hugging Face chat templates (docs/serving.md §5.7; the constructs are
// listed in docs/decisions.md "Chat templates"). Parsing checks the whole template, so a
// template the subset cannot run fails at load with its line and column, not at request time.
// Rendering is bounded: output bytes, macro call depth and evaluation steps, so a hostile
// template ends in an error instead of exhausting memory or looping.

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "dayzero/core/status.h"
#include "dayzero/serve/chat/ast.h"
#include "dayzero/serve/chat/value.h"

namespace dz::serve::chat {

struct RenderOptions {
  size_t max_output_bytes = size_t{16} << 20;
  int max_call_depth = 64;         // nested macro calls
  int64_t max_steps = 10'000'000;  // statements and expressions evaluated
  int64_t max_range_elems = 1'000'000;
  std::optional<std::time_t> now;  // what strftime_now() formats; unset: the clock
};

class Template {
 public:
  static Result<Template> parse(std::string_view source);

  // `context` must be a dict (its entries are the template's variables).
  Result<std::string> render(const Value& context, const RenderOptions& options = {}) const;

  const Body& body() const { return *body_; }

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace dz::serve::chat
