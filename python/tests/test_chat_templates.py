"""dayzero's Jinja subset against the npm @huggingface/jinja renderer, byte for byte.

Renders the chat templates in tests/data/chat_templates (Kimi-K2 and Kimi-K2-Thinking from
Moonshot, Llama-3, ChatML and a Qwen-style template with tools), the tiny Kimi checkpoint's
template, and edge-case templates for every construct of the subset, over several
conversations, through `dayzero chat-template` and through tools/jinja-check/render.mjs.

Where @huggingface/jinja departs from Python's jinja2 (the renderer transformers uses), the case
carries jinja2's output, derived by hand, instead of the npm comparison. Node and the npm package
come from scripts/install-deps.sh (`npm ci` in tools/jinja-check); the test fails without the
package, and is skipped only where no `node` exists.
"""

import json
import os
import random
import shutil
import subprocess
import tempfile
import unittest

from cli_support import DAYZERO, SOURCE_DIR, skip_or_fail
from dayzero_ref import tokenizer_gen

NPM_DIR = os.path.join(SOURCE_DIR, "tools", "jinja-check")
FIXTURES = os.path.join(SOURCE_DIR, "tests", "data", "chat_templates")

CONVERSATIONS = {
    "one_user": [{"role": "user", "content": "Hello!"}],
    "multi_turn": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "unicode_and_escapes": [
        {"role": "user", "content": "Ça va? 你好 🚀 \"quotes\" 'single' <tag> & \\ back\n\nlines\ttab  "},
        {"role": "assistant", "content": "  padded answer\n"},
    ],
    "text_parts": [
        {"role": "user", "content": [{"type": "text", "text": "part one"},
                                     {"type": "text", "text": "part two"}]},
    ],
    "tool_calls": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"sunny\"}"},
        {"role": "user", "content": "Thanks"},
    ],
    "reasoning": [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2", "reasoning_content": "R2"},
    ],
    "empty": [],
}

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather for a city, \"now\".",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


def read_fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8", newline="") as f:
        return f.read()


def flatten_text_parts(messages):
    """chat_template.h's rule for templates that do not loop over content themselves."""
    out = []
    for m in messages:
        m = dict(m)
        c = m.get("content")
        if isinstance(c, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in c):
            m["content"] = "\n".join(p["text"] for p in c)
        out.append(m)
    return out


# name -> (template source, takes content parts, conversations it supports)
def model_templates():
    kimi = read_fixture("moonshotai-Kimi-K2.jinja")
    everything = list(CONVERSATIONS)
    no_parts = [c for c in everything if c != "text_parts"]
    plain = ["one_user", "multi_turn", "unicode_and_escapes", "text_parts", "empty", "reasoning"]
    return {
        "kimi_k2": (kimi, True, everything),
        "kimi_k2_crlf": (kimi.replace("\n", "\r\n"), True, everything),
        "kimi_k2_thinking": (read_fixture("Kimi-K2-Thinking.jinja"), True,
                             [c for c in everything if c != "tool_calls"]),
        "llama3": (read_fixture("llama3.jinja"), False, plain),
        "chatml": (read_fixture("chatml.jinja"), False, plain),
        "qwen_style_tools": (read_fixture("qwen-style-tools.jinja"), False,
                             [c for c in no_parts if c != "empty"] + ["text_parts"]),
        "tiny_kimi": (tokenizer_gen.KIMI_CHAT_TEMPLATE, True, everything),
    }


# (template, context, expected): expected None means "as @huggingface/jinja renders it";
# a string is jinja2's output where the npm package differs (noted per case).
EDGE_CASES = [
    ("{% for m in messages %}\n  {{ m.role }}: {{ m.content }}\n{% endfor %}\n", None, None),
    ("a  {{- ' b ' -}}  c\n  {%- if true %} d {% endif -%}\n e", {}, None),
    ("{% if x > 2 %}big{% elif x == 2 %}two{% else %}small{% endif %}", {"x": 2}, None),
    ("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ x }}{% if loop.first %}F"
     "{% endif %}{% if loop.last %}L{{ loop.length }}{% endif %}{% endfor %}", {}, None),
    # @huggingface/jinja cannot loop over a string.
    ("{% for x in 'ab' %}{{ x }}{{ loop.revindex }}{% endfor %}", {}, "a2b1"),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}, None),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}, None),
    ("{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}"
     "{% endif %}{{ i }}{% endfor %}", {}, None),
    ("{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}", {}, None),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", {}, None),
    ("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}"
     "{{ ns.x }}", {}, None),
    ("{% macro f(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ f(1) }}{{ f(2, b=3) }}", {}, None),
    ("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }}", {}, None),
    ("{{ 'a' ~ 1 ~ 'b' }} {{ [1] + [2] }} {{ 'T' if 1 < 2 and 2 >= 2 else 'F' }}", {}, None),
    # @huggingface/jinja has no str * int and no < > on strings.
    ("{{ 'ab' * 3 }} {{ 'b' > 'a' }}", {}, "ababab True"),
    # @huggingface/jinja's % follows JavaScript's sign rule; Python floors.
    ("{{ -7 % 3 }} {{ 7 % -3 }} {{ -7 // 2 }}", {}, "2 -2 -4"),
    ("{{ 'T' if 'a' in 'cat' else 'F' }}{{ 'T' if 2 not in [1, 3] else 'F' }}"
     "{{ 'T' if 'k' in {'k': 1} else 'F' }}{{ 'T' if not 0 else 'F' }}", {}, None),
    ("{{ 'y' if 1 else 'n' }}{{ 'y' if 0 else 'n' }}", {}, None),
    ("{{ m.role }} {{ m['content'] }} {{ xs[-1] }} {{ xs[1:3] }} {{ xs[::-1] }} {{ 'héllo'[1:3] }}",
     {"m": {"role": "user", "content": "hi"}, "xs": [1, 2, 3, 4]}, None),
    ("{{ 'T' if 'abc'.startswith('ab') and 'abc'.endswith('c') }} {{ '  a  '.strip() }}|"
     "{{ 'a,b,,c'.split(',') | join('-') }} {{ 'a.b.c'.split('.', 1) | length }}", {}, None),
    ("{{ 'aXa'.replace('a', 'b') }} {{ 'Hi'.lower() }}{{ 'Hi'.upper() }} {{ ' x '.rstrip() }}|"
     "{{ ' x '.lstrip() }}|", {}, None),
    ("{{ d.get('a') }} {{ d.get('z', 5) }} {{ d.keys() | join }} {{ d.values() | join }}",
     {"d": {"a": 1, "b": 2}}, None),
    ("{{ '  x '|trim }}|{{ 'ab'|upper }} {{ 'AB'|lower }} {{ 'hello world'|title }} "
     "{{ 'hello'|capitalize }}", {}, None),
    ("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ [1, 2]|first }}"
     "{{ [1, 2]|last }} {{ 'abc'|length }} {{ {'a': 1}|length }}", {}, None),
    ("{{ [1, 2]|join(', ') }} {{ 12|string ~ 3 }} {{ '42'|int + 1 }} {{ '2.5'|float }} "
     "{{ 'a-b'|replace('-', '+') }}", {}, None),
    ("{{ [3, 1, 2]|sort|join }} {{ [3, 1, 2]|sort(reverse=true)|join }} {{ [1, 2]|reverse|join }} "
     "{{ [1, 1, 2]|unique|join }}", {}, None),
    ("{{ x|indent(2) }}|{{ x|indent(2, true) }}", {"x": "a\n\nb\nc"}, None),
    ("{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|join(',') }}|"
     "{{ msgs|rejectattr('role', 'eq', 'user')|list|length }}|{{ msgs|map(attribute='role')|unique|join }}",
     {"msgs": [{"role": "user", "content": "u1"}, {"role": "assistant", "content": "a"},
               {"role": "user", "content": "u2"}]}, None),
    ("{% for v in ['abc', {}, [], 3, none, true, x] %}{{ 'S' if v is string }}{{ 'M' if v is mapping }}"
     "{{ 'I' if v is iterable and v is not mapping and v is defined }}{{ 'N' if v is number and v is not boolean }}{{ 'D' if v is defined }}"
     "{{ 'U' if v is undefined }}{{ '0' if v is none }}{{ 'B' if v is boolean }};{% endfor %}", {}, None),
    ("{{ x|tojson }}|{{ x|tojson(indent=2) }}",
     {"x": {"b": "é<\"\n", "a": [1, 2.5, True, None], "c": {}}}, None),
    ("{{ tools|tojson }}", {"tools": TOOLS}, None),
    ("{{ x|tojson(separators=(',', ':')) }}", {"x": {"a": [1, {"b": "c"}]}}, None),
    ("{% if x is string %}s{% elif x is mapping %}m{% elif x is iterable %}i{% endif %}",
     {"x": [1]}, None),
    ("{{ '<b>'|safe }}{{ {'a': 'b'}|items|list|length }}", {}, None),
    ("{% set c = {'t': 1, 'u': [1, 2]} %}{{ c.u[1] }}{{ c['t'] }}", {}, None),
    # jinja2: a dict and Undefined are iterable, and a bool is a number; not so in the npm package.
    ("{% for v in [{}, true, x] %}{{ 'I' if v is iterable }}{{ 'N' if v is number }};{% endfor %}",
     {}, "I;N;I;"),
    # jinja2 turns \r\n and \r in the template source into \n; @huggingface/jinja keeps them.
    ("a\r\nb\rc{% if true %}\r\n d{% endif %}\r\n", {}, "a\nb\nc d"),
    # @huggingface/jinja prints true/null/JSON lists; jinja2 prints Python's str().
    ("{{ true }} {{ none }} {{ [1, 'a', none] }} {{ {'k': 'v'} }}", {}, "True None [1, 'a', None] {'k': 'v'}"),
    # @huggingface/jinja ignores strip()'s argument and capitalize()'s lowering.
    ("{{ 'xxaxx'.strip('x') }} {{ 'aBC'|capitalize }}", {}, "a Abc"),
    # @huggingface/jinja has no round filter, no `is in` test, no `~` on None, no 1e20 literal.
    ("{{ 2.5|round }} {{ 1.2345|round(2) }} {{ 1 is in [1] }} {{ 'a' ~ none }} {{ 1e20 }}", {},
     "2.0 1.23 True aNone 1e+20"),
    # jinja2's `append` on a namespace list (transformers' sandbox refuses it; npm cannot call it).
    ("{% set ns = namespace(ids=[]) %}{% set _ = ns.ids.append(1) %}{{ ns.ids|length }}", {}, "1"),
]

ERROR_CASES = [
    ("{{ raise_exception('bad role') }}", "template raised an exception: bad role"),
    ("{% if x %}", "missing '{% endif %}'"),
    ("{{ x | nosuchfilter }}", "unknown filter 'nosuchfilter'"),
    ("{{ nothing(1) }}", "'nothing' is undefined or not callable"),
]


def random_whitespace_templates(seed, count):
    """Random nests of if/else, for, set, comments and {{ }} with and without `-`, between runs of
    spaces, tabs and newlines: trim_blocks, lstrip_blocks and stripping in every combination.
    (No \r: jinja2 turns it into \n, @huggingface/jinja keeps it.)"""
    rng = random.Random(seed)
    spaces = ["", " ", "  ", "\n", " \n", "\n  ", "\t", "\n\n", " x ", "a\n", "\n b", "  \n  "]

    def ws():
        return rng.choice(spaces)

    def dash():
        return rng.choice(["", "", "", "-"])

    def block(depth):
        out = []
        for _ in range(rng.randint(1, 4)):
            kind = 0 if depth > 2 else rng.randint(0, 5)
            if kind == 0:
                out.append(f"{ws()}{{{{{dash()} v {dash()}}}}}{ws()}")
            elif kind == 1:
                out.append(f"{ws()}{{%{dash()} if c {dash()}%}}{block(depth + 1)}{ws()}"
                           f"{{%{dash()} else {dash()}%}}{block(depth + 1)}{{%{dash()} endif {dash()}%}}{ws()}")
            elif kind == 2:
                out.append(f"{ws()}{{%{dash()} for i in xs {dash()}%}}{block(depth + 1)}"
                           f"{{%{dash()} endfor {dash()}%}}{ws()}")
            elif kind == 3:
                out.append(f"{ws()}{{#{dash()} c {dash()}#}}{ws()}")
            elif kind == 4:
                out.append(f"{ws()}{{%{dash()} set z = 1 {dash()}%}}{ws()}")
            else:
                out.append(ws())
        return "".join(out)

    return [{"template": block(0), "context": {"v": "V", "c": rng.random() < 0.5, "xs": [1, 2]}}
            for _ in range(count)]


def node_available():
    return shutil.which("node") is not None


class ChatTemplatesAgreeWithHuggingfaceJinja(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dz_chat_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        if not node_available():
            skip_or_fail("node is not installed: the @huggingface/jinja comparison needs it "
                         "(scripts/install-deps.sh installs nodejs)")
        if not os.path.isdir(os.path.join(NPM_DIR, "node_modules", "@huggingface", "jinja")):
            self.fail("npm @huggingface/jinja missing: run scripts/install-deps.sh "
                      "(npm ci in tools/jinja-check)")
        if not os.access(DAYZERO, os.X_OK):
            self.fail(f"{DAYZERO} is not built")

    def _write(self, name, value):
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(value, f, ensure_ascii=False)
        return path

    def _node(self, cases):
        path = self._write("node_cases.json", cases)
        out = subprocess.run(["node", os.path.join(NPM_DIR, "render.mjs"), path], check=True,
                             capture_output=True, cwd=NPM_DIR).stdout
        return json.loads(out)

    def _ours_batch(self, cases):
        path = self._write("our_cases.json", cases)
        out = subprocess.run([DAYZERO, "chat-template", "--batch", path], check=True,
                             capture_output=True).stdout
        return json.loads(out)

    def test_model_templates_match_byte_for_byte(self):
        num_compared = 0
        for name, (source, takes_parts, conversations) in model_templates().items():
            model_dir = os.path.join(self.tmp, name)
            os.makedirs(model_dir, exist_ok=True)
            self._write(os.path.join(name, "tokenizer_config.json"),
                        {"bos_token": "<s>", "eos_token": {"content": "</s>"},
                         "chat_template": source})
            cases, runs = [], []
            for conv in conversations:
                messages = CONVERSATIONS[conv]
                for gen in (False, True):
                    with_tools = conv == "tool_calls"
                    context = {"messages": messages if takes_parts else flatten_text_parts(messages),
                               "add_generation_prompt": gen, "bos_token": "<s>", "eos_token": "</s>"}
                    if with_tools:
                        context["tools"] = TOOLS
                    cases.append({"template": source, "context": context})
                    runs.append((conv, gen, with_tools))
            refs = self._node(cases)
            for (conv, gen, with_tools), ref in zip(runs, refs):
                with self.subTest(template=name, conversation=conv, add_generation_prompt=gen):
                    self.assertTrue(ref["ok"], ref.get("error"))
                    args = [DAYZERO, "chat-template", "--model", model_dir, "--messages",
                            self._write("messages.json", CONVERSATIONS[conv])]
                    if gen:
                        args.append("--add-generation-prompt")
                    if with_tools:
                        args += ["--tools", self._write("tools.json", TOOLS)]
                    ours = subprocess.run(args, capture_output=True, check=False)
                    self.assertEqual(ours.returncode, 0, ours.stderr.decode())
                    self.assertEqual(ours.stdout.decode("utf-8"), ref["text"])
                    num_compared += 1
        self.assertGreater(num_compared, 70)

    def test_edge_case_templates(self):
        cases = [{"template": t, "context": c if c is not None else
                  {"messages": CONVERSATIONS["multi_turn"]}} for t, c, _ in EDGE_CASES]
        ours = self._ours_batch(cases)
        refs = self._node([case for case, (_, _, exp) in zip(cases, EDGE_CASES) if exp is None])
        refs = iter(refs)
        for case, (template, _, expected), mine in zip(cases, EDGE_CASES, ours):
            with self.subTest(template=template):
                self.assertTrue(mine["ok"], mine.get("error"))
                if expected is None:
                    ref = next(refs)
                    self.assertTrue(ref["ok"], ref.get("error"))
                    self.assertEqual(mine["text"], ref["text"])
                else:
                    self.assertEqual(mine["text"], expected)

    def test_random_whitespace_control(self):
        cases = random_whitespace_templates(seed=6, count=400)
        ours = self._ours_batch(cases)
        refs = self._node(cases)
        for case, mine, ref in zip(cases, ours, refs):
            with self.subTest(template=case["template"]):
                self.assertTrue(ref["ok"], ref.get("error"))
                self.assertEqual(mine, ref)

    def test_errors_agree(self):
        cases = [{"template": t, "context": {}} for t, _ in ERROR_CASES]
        ours = self._ours_batch(cases)
        refs = self._node(cases)
        for (template, message), mine, ref in zip(ERROR_CASES, ours, refs):
            with self.subTest(template=template):
                self.assertFalse(ref["ok"])
                self.assertFalse(mine["ok"])
                self.assertIn(message, mine["error"])

    def test_tiny_kimi_template_is_the_fixture(self):
        self.assertEqual(tokenizer_gen.KIMI_CHAT_TEMPLATE, read_fixture("moonshotai-Kimi-K2.jinja"))


class DeepSeekV32Encoder(unittest.TestCase):
    def test_deepseek_checkpoint_uses_the_encoder(self):
        if not os.access(DAYZERO, os.X_OK):
            self.fail(f"{DAYZERO} is not built")
        tmp = tempfile.mkdtemp(prefix="dz_dsv32_")
        try:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump({"model_type": "deepseek_v32"}, f)
            path = os.path.join(tmp, "messages.json")
            with open(path, "w") as f:
                json.dump(CONVERSATIONS["multi_turn"], f)
            out = subprocess.run([DAYZERO, "chat-template", "--model", tmp, "--messages", path],
                                 capture_output=True, check=True).stdout.decode()
            self.assertEqual(out, "<｜begin▁of▁sentence｜>You are terse.<｜User｜>What is 2+2?"
                                  "<｜Assistant｜></think>4<｜end▁of▁sentence｜><｜User｜>And 3+3?"
                                  "<｜Assistant｜></think>")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
