// The Jinja subset, construct by construct, with outputs as Python's jinja2 (and transformers'
// whitespace settings) produce them. npm @huggingface/jinja comparisons live in
// python/tests/test_chat_templates.py; where that package departs from jinja2 (str() of True,
// None and lists, strip(chars), capitalize, round) these tests pin jinja2's behaviour.

#include "dayzero/serve/chat/jinja.h"

#include <gtest/gtest.h>

namespace dz::serve::chat {
namespace jinja_test {

std::string render(std::string_view source,
                   const nlohmann::ordered_json& context = nlohmann::ordered_json::object()) {
  Result<Template> tmpl = Template::parse(source);
  if (!tmpl.ok()) return "PARSE ERROR: " + tmpl.status().message();
  RenderOptions options;
  options.now = 1700000000;
  Result<std::string> out = tmpl->render(Value::from_json(context), options);
  if (!out.ok()) return "RENDER ERROR: " + out.status().message();
  return *out;
}

TEST(Jinja, PrintsTextAndExpressions) {
  EXPECT_EQ(render("a {{ 1 + 2 }} b"), "a 3 b");
  EXPECT_EQ(render("{{ x }}", {{"x", "é😀"}}), "é😀");
  EXPECT_EQ(render("{{ missing }}|"), "|");
  EXPECT_EQ(render("{# a comment #}x"), "x");
}

TEST(Jinja, PrintsValuesAsPythonStr) {
  EXPECT_EQ(render("{{ true }} {{ none }} {{ [1, 'a', none] }} {{ {'k': \"it's\"} }}"),
            "True None [1, 'a', None] {'k': \"it's\"}");
  EXPECT_EQ(render("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1/3 }} {{ 1e-5 }} {{ 2.5e-4 }}"),
            "1.0 0.30000000000000004 1e+20 0.3333333333333333 1e-05 0.00025");
}

TEST(Jinja, WhitespaceControlAndHfBlockSettings) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indent before one.
  EXPECT_EQ(
      render("{% for i in [1, 2] %}\n  {% if i %}\n    {{ i }}\n  {% endif %}\n{% endfor %}\n"),
      "    1\n    2\n");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("a\n  {%- if true -%}\n  b  {%- endif %}\n"), "ab");
  EXPECT_EQ(render("x {{ 1 }}\ny"), "x 1\ny");  // no trimming after {{ }}
  EXPECT_EQ(render("  {% if true %}a{% endif %}  b"), "a  b");
  EXPECT_EQ(render("{%+ if true %}a{% endif %}"), "a");
  EXPECT_EQ(render("line\n"), "line");            // keep_trailing_newline=False
  EXPECT_EQ(render("a\r\nb\rc\r\n"), "a\nb\nc");  // newline_sequence "\n"
  EXPECT_EQ(render("{% if true %}\r\nx{% endif %}"), "x");
  EXPECT_EQ(render("a {# c #}\nb"), "a b");
}

TEST(Jinja, IfElifElse) {
  const char* t = "{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif %}";
  EXPECT_EQ(render(t, {{"x", 3}}), "big");
  EXPECT_EQ(render(t, {{"x", 2}}), "two");
  EXPECT_EQ(render(t, {{"x", 1}}), "small");
}

TEST(Jinja, ForLoopVariablesElseAndFilter) {
  EXPECT_EQ(render("{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ x }}"
                   "{% if loop.first %}F{% endif %}{% if loop.last %}L{{ loop.length }}{% endif %}"
                   "{% endfor %}"),
            "10aF21b32cL3");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"),
            "2242");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   {{"d", {{"b", 1}, {"a", 2}}}}),
            "b=1;a=2;");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", {{"d", {{"z", 1}, {"y", 2}}}}), "zy");
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}"
                   "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "023");
  EXPECT_EQ(render("{% for i in range(5, 0, -2) %}{{ loop.revindex0 }}{{ i }}{% endfor %}"),
            "251301");
}

TEST(Jinja, SetScopesAndNamespaces) {
  // A plain set inside a loop does not leak out; a namespace attribute does.
  EXPECT_EQ(render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(x=1, items=[]) %}{% for i in [1, 2] %}"
                   "{% set ns.x = ns.x + i %}{% set _ = ns.items.append(i) %}{% endfor %}"
                   "{{ ns.x }} {{ ns.items|length }} {{ ns.items.pop(0) }}{{ ns.items }}"),
            "4 2 1[2]");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(render("{% set block %}in {{ 1 }}{% endset %}[{{ block }}]"), "[in 1]");
  EXPECT_EQ(
      render("{% set x = 1 %}{% set x.y = 2 %}"),
      "RENDER ERROR: template line 1 column 19: cannot assign attribute on 'x': not a namespace");
}

TEST(Jinja, Macros) {
  EXPECT_EQ(
      render("{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}"),
      "[1B][23]");
  // A macro sees the template's globals, not the caller's loop variables.
  EXPECT_EQ(render("{% set g = 'G' %}{% macro m() %}{{ g }}{{ i }}{% endmacro %}"
                   "{% for i in [1] %}{{ m() }}{% endfor %}"),
            "G");
  EXPECT_EQ(render("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"),
            "RENDER ERROR: template line 1 column 34: macro 'f' takes 1 arguments, got 2");
}

TEST(Jinja, Operators) {
  EXPECT_EQ(
      render(
          "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 'a' ~ 1 ~ none }}"),
      "3 -4 2 3.5 1024 a1None");
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [1] + [2] }} {{ 'a' + 'b' }} {{ -(3) }} {{ 1 - 2.5 }}"),
            "ababab [1, 2] ab -3 -1.5");
  EXPECT_EQ(render("{{ 1 < 2 and 'b' > 'a' }} {{ not 1 }} {{ 1 == 1.0 }} {{ [1] != [1] }}"),
            "True False True False");
  EXPECT_EQ(render("{{ 'a' in 'cat' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }}"),
            "True True True");
  EXPECT_EQ(render("{{ x or 'default' }} {{ 0 and 1 }}"), "default 0");
  EXPECT_EQ(render("{{ 'y' if 1 else 'n' }}{{ 'y' if 0 else 'n' }}{{ 'z' if false }}"), "yn");
}

TEST(Jinja, SubscriptsSlicesAndLiterals) {
  nlohmann::ordered_json ctx = {{"m", {{"role", "user"}, {"content", "hi"}}}, {"xs", {1, 2, 3, 4}}};
  EXPECT_EQ(
      render("{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ xs[-1] }} {{ xs.0 }} {{ xs[9] }}|",
             ctx),
      "user hi |4 1 |");
  EXPECT_EQ(render("{{ xs[1:3] }} {{ xs[::-1] }} {{ xs[:-2] }} {{ xs[::2] }}", ctx),
            "[2, 3] [4, 3, 2, 1] [1, 2] [1, 3]");
  EXPECT_EQ(render("{{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }}"), "é él olléh");
  EXPECT_EQ(render("{{ {'a': [1, {'b': 2}]}['a'][1].b }} {{ (1, 2)[1] }}"), "2 2");
}

TEST(Jinja, StringAndDictMethods) {
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'c')) }} "
                   "{{ '  a  '.strip() }}|{{ 'xxaxx'.strip('x') }} {{ 'xxa'.lstrip('x') }} {{ 'a  "
                   "'.rstrip() }}|"),
            "True True a|a a a|");
  EXPECT_EQ(render("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a.b.c'.split('.', 1) }}"),
            "['a', 'b', '', 'c'] ['a', 'b'] ['a', 'b.c']");
  EXPECT_EQ(render("{{ 'aXa'.replace('a', 'b') }} {{ 'Hi'.lower() }}{{ 'Hi'.upper() }} {{ 'hello "
                   "wORLD'.title() }}"),
            "bXb hiHI Hello World");
  nlohmann::ordered_json ctx = {{"d", {{"a", 1}, {"b", nullptr}}}};
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys() }} {{ "
                   "d.values() }} {{ d.items() }}",
                   ctx),
            "1 None 5 ['a', 'b'] [1, None] [['a', 1], ['b', None]]");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(render("{{ '  x '|trim }}|{{ 'ab'|upper }} {{ 'AB'|lower }} {{ 'ab-cd ef'|title }} {{ "
                   "'aBC'|capitalize }}"),
            "x|AB ab Ab-Cd Ef Abc");
  EXPECT_EQ(render("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|d('d', true) }} {{ [1, "
                   "2]|first }}{{ 'xyz'|last }}"),
            "d  d 1z");
  EXPECT_EQ(render("{{ [1, 2]|join(', ') }} {{ 'ab'|list }} {{ 12|string ~ 3 }} {{ '42'|int + 1 }} "
                   "{{ 'x'|int }} "
                   "{{ '2.5'|float }} {{ 3.7|int }} {{ -3|abs }}"),
            "1, 2 ['a', 'b'] 123 43 0 2.5 3 3");
  EXPECT_EQ(render("{{ 'a-b'|replace('-', '+') }} {{ 'abc'|length }} {{ {'a': 1}|items }} {{ 'a "
                   "b'|split }}"),
            "a+b 3 [['a', 1]] ['a', 'b']");
  EXPECT_EQ(
      render("{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'a']|unique }} "
             "{{ [1, 2]|reverse }} {{ 'ab'|reverse }}"),
      "[1, 2, 3] [3, 2, 1] ['b', 'A'] [2, 1] ba");
  EXPECT_EQ(
      render("{{ 2.5|round }} {{ 3.5|round }} {{ 1.2345|round(2) }} {{ 2.7|round(0, 'floor') }}"),
      "2.0 4.0 1.23 2.0");
  EXPECT_EQ(render("{{ x|indent(2) }}|{{ x|indent(2, true) }}|{{ x|indent(2, blank=true) }}",
                   {{"x", "a\n\nb"}}),
            "a\n\n  b|  a\n\n  b|a\n  \n  b");
  nlohmann::ordered_json msgs = {
      {"msgs",
       {{{"role", "user"}, {"n", 2}}, {{"role", "bot"}, {"n", 1}}, {{"role", "user"}, {"n", 3}}}}};
  EXPECT_EQ(render("{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='n')|list }} "
                   "{{ msgs|rejectattr('role', 'eq', 'user')|length }} {{ "
                   "msgs|sort(attribute='n')|map(attribute='n')|join }} "
                   "{{ [1, 0, 2]|select|list }} {{ ['a', 'b']|map('upper')|join }}",
                   msgs),
            "[2, 3] 1 123 [1, 2] AB");
  EXPECT_EQ(render("{{ '<b>'|safe }}"), "<b>");
}

TEST(Jinja, ToJsonAsTransformers) {
  nlohmann::ordered_json ctx = {{"x", {{"b", "é<\"\n"}, {"a", {1, 2.5, true, nullptr}}}}};
  EXPECT_EQ(render("{{ x|tojson }}", ctx), R"({"b": "é<\"\n", "a": [1, 2.5, true, null]})");
  EXPECT_EQ(
      render("{{ x|tojson(indent=2) }}", ctx),
      "{\n  \"b\": \"é<\\\"\\n\",\n  \"a\": [\n    1,\n    2.5,\n    true,\n    null\n  ]\n}");
  EXPECT_EQ(render("{{ x|tojson(separators=(',', ':')) }}", ctx),
            R"({"b":"é<\"\n","a":[1,2.5,true,null]})");
  EXPECT_EQ(render("{{ x|tojson(sort_keys=true, ensure_ascii=true) }}", ctx),
            R"({"a": [1, 2.5, true, null], "b": "\u00e9<\"\n"})");
  EXPECT_EQ(render("{{ {}|tojson }}{{ []|tojson }}"), "{}[]");
  // Positional arguments follow transformers' signature: ensure_ascii, indent, separators.
  EXPECT_EQ(render("{{ ['é']|tojson(false, 1) }}|{{ ['é']|tojson(true) }}"),
            "[\n \"é\"\n]|[\"\\u00e9\"]");
}

TEST(Jinja, Tests) {
  EXPECT_EQ(
      render("{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 'a' is string }}"
             "{{ {} is mapping }}{{ [] is iterable }}{{ 'a' is sequence }}{{ 1.5 is number }}"),
      "FalseTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(
      render(
          "{{ true is boolean }}{{ true is true }}{{ 0 is false }}{{ 1 is equalto 1 }}{{ 2 is "
          "eq(3) }}"
          "{{ 1 is in [1, 2] }}{{ 3 is not in [1] }}{{ 4 is divisibleby 2 }}{{ 'ab' is lower }}"),
      "TrueTrueFalseTrueFalseTrueTrueTrueTrue");
}

TEST(Jinja, GlobalsAndHfHelpers) {
  EXPECT_EQ(
      render("{{ range(3) }} {{ range(1, 7, 3) }} {{ dict(a=1) }} {{ strftime_now('%Y-%m-%d') }}"),
      "[0, 1, 2] [1, 4] {'a': 1} 2023-11-14");
  EXPECT_EQ(render("{{ raise_exception('Only user and assistant roles are supported!') }}"),
            "RENDER ERROR: template line 1 column 4: template raised an exception: Only user and "
            "assistant roles are supported!");
}

TEST(Jinja, GenerationBlockRendersItsBody) {
  EXPECT_EQ(render("{% generation %}answer{% endgeneration %}"), "answer");
}

}  // namespace jinja_test
}  // namespace dz::serve::chat
