// Errors name their line and column, and hostile templates end in bounded errors.

#include <gtest/gtest.h>

#include "dayzero/serve/chat/jinja.h"

namespace dz::serve::chat {
namespace jinja_errors_test {

Status parse_error(std::string_view source) {
  Result<Template> tmpl = Template::parse(source);
  return tmpl.ok() ? Status() : tmpl.status();
}

Status render_error(std::string_view source, const RenderOptions& options = {}) {
  Result<Template> tmpl = Template::parse(source);
  if (!tmpl.ok()) return tmpl.status();
  Result<std::string> out = tmpl->render(Value::object(), options);
  return out.ok() ? Status() : out.status();
}

TEST(JinjaErrors, SyntaxErrorsNameLineAndColumn) {
  EXPECT_EQ(parse_error("ab\n{% if x %}y").message(),
            "template line 2 column 4: 'if' is not closed: missing '{% endif %}'");
  EXPECT_EQ(parse_error("{% for x in y %}{% if x %}{% endfor %}").message(),
            "template line 1 column 30: unexpected 'endfor'");
  EXPECT_EQ(parse_error("{{ 1 + }}").message(), "template line 1 column 8: unexpected 'end'");
  EXPECT_EQ(parse_error("x\n  {{ a b }}").message(),
            "template line 2 column 8: expected '}}', found 'b'");
  EXPECT_EQ(parse_error("{% frobnicate %}").message(),
            "template line 1 column 4: unsupported statement 'frobnicate'");
  EXPECT_EQ(parse_error("{{ 'abc }}").message(),
            "template line 1 column 4: unterminated string literal");
  EXPECT_EQ(parse_error("{{ x").message(), "template line 1 column 5: unclosed '{{'");
  EXPECT_EQ(parse_error("{# x").message(), "template line 1 column 3: unclosed comment");
  EXPECT_EQ(parse_error("{% for x in y recursive %}{% endfor %}").message(),
            "template line 1 column 4: recursive for loops are not supported");
  EXPECT_EQ(parse_error("{{ x @ y }}").message(),
            "template line 1 column 6: unexpected character '@'");
}

TEST(JinjaErrors, UnknownFiltersTestsAndFunctionsFailAtParse) {
  EXPECT_EQ(parse_error("{{ nothing(1) }}").message(),
            "template line 1 column 4: 'nothing' is undefined or not callable");
  EXPECT_TRUE(parse_error("{{ m() }}{% macro m() %}{% endmacro %}").ok());
  EXPECT_EQ(parse_error("\n{{ x | frob }}").code(), StatusCode::kUnsupported);
  EXPECT_EQ(parse_error("\n{{ x | frob }}").message(),
            "template line 2 column 6: unknown filter 'frob'");
  EXPECT_EQ(parse_error("{% if x is frob %}{% endif %}").message(),
            "template line 1 column 9: unknown test 'frob'");
}

TEST(JinjaErrors, RuntimeErrorsNameTheirPlace) {
  EXPECT_EQ(render_error("{% set f = 1 %}{{ f(1) }}").message(),
            "template line 1 column 19: 'int' object is not callable");
  EXPECT_EQ(render_error("{{ x.y }}").message(),
            "template line 1 column 5: cannot read attribute 'y' of an undefined value");
  EXPECT_EQ(render_error("{{ 1 // 0 }}").message(),
            "template line 1 column 6: integer division by zero");
  EXPECT_EQ(render_error("{{ 'a' + 1 }}").message(),
            "template line 1 column 8: unsupported operand types for +: 'str' and 'int'");
  EXPECT_EQ(render_error("{{ 'a' < 1 }}").message(),
            "template line 1 column 8: '<' not supported between 'str' and 'int'");
  EXPECT_EQ(render_error("{% for a, b in [1] %}{% endfor %}").message(),
            "template line 1 column 4: cannot unpack int into 2 names");
  EXPECT_EQ(render_error("{{ 'abc'.nomethod() }}").message(),
            "template line 1 column 9: 'str' has no method 'nomethod'");
  EXPECT_EQ(render_error("{% break %}").message(),
            "template line 1 column 4: 'break' outside a loop");
  EXPECT_EQ(render_error("{{ 9223372036854775807 + 1 }}").message(),
            "template line 1 column 24: integer overflow in +");
}

TEST(JinjaErrors, DeepNestingIsRefusedAtParse) {
  std::string parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  EXPECT_EQ(
      parse_error("{{ " + parens + " }}").message().find("nested too deeply") != std::string::npos,
      true);
  std::string ifs;
  for (int i = 0; i < 1000; ++i) ifs += "{% if true %}";
  EXPECT_NE(parse_error(ifs).message().find("nested too deeply"), std::string::npos);
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_NE(parse_error("{{ " + nots + "1 }}").message().find("nested too deeply"),
            std::string::npos);
  std::string sum = "1";
  for (int i = 0; i < 100000; ++i) sum += "+1";
  EXPECT_NE(parse_error("{{ " + sum + " }}").message().find("nested too deeply"),
            std::string::npos);
  std::string filters = "x";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  EXPECT_NE(parse_error("{{ " + filters + " }}").message().find("nested too deeply"),
            std::string::npos);
  std::string lists = std::string(5000, '[') + std::string(5000, ']');
  EXPECT_NE(parse_error("{{ " + lists + " }}").message().find("nested too deeply"),
            std::string::npos);
}

TEST(JinjaErrors, HugeLoopsAndOutputsAreBounded) {
  RenderOptions few_steps;
  few_steps.max_steps = 100'000;
  Status steps = render_error(
      "{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
      "{% endfor %}{% endfor %}{% endfor %}",
      few_steps);
  EXPECT_EQ(steps.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(steps.message(), "template exceeded 100000 evaluation steps");
  EXPECT_EQ(render_error("{{ range(100000000000) }}").message(),
            "template line 1 column 4: range() of 100000000000 items exceeds the limit of 1000000");
  RenderOptions small;
  small.max_output_bytes = 1000;
  EXPECT_EQ(render_error("{% for i in range(1000) %}xx{% endfor %}", small).message(),
            "template output exceeds 1000 bytes");
  EXPECT_EQ(render_error("{{ 'x' * 100000000000 }}").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(render_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = "
                         "ns.s ~ ns.s %}{% endfor %}")
                .code(),
            StatusCode::kResourceExhausted);
}

TEST(JinjaErrors, RecursiveMacrosAreBounded) {
  Status status = render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("macro calls nested deeper than 64"), std::string::npos);
}

TEST(JinjaErrors, GarbageInputNeverCrashes) {
  // Every prefix of a real template either parses or fails with a message.
  const std::string source =
      "{%- for m in messages -%}{{ m['role'] | upper ~ ':' }}{% if m.content is string %}"
      "{{ m.content[1:] }}{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}"
      "{%- endfor %}{{ {'a': [1, (2, 3)]} | tojson(indent=2) }}";
  for (size_t n = 0; n <= source.size(); ++n) {
    Result<Template> tmpl = Template::parse(source.substr(0, n));
    if (tmpl.ok()) {
      Result<std::string> out = tmpl->render(Value::object({{"messages", Value::array()}}));
      (void)out;
    } else {
      EXPECT_FALSE(tmpl.status().message().empty());
    }
  }
  std::string bytes;
  for (int i = 0; i < 2000; ++i) bytes += static_cast<char>((i * 7919) % 256);
  Result<Template> tmpl = Template::parse(bytes);
  if (tmpl.ok()) (void)tmpl->render(Value::object());
}

}  // namespace jinja_errors_test
}  // namespace dz::serve::chat
