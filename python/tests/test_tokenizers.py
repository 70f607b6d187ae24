"""dayzero's tokenizers against independent implementations.

Generates a DeepSeek-V3-style tokenizer.json and a Kimi-style tiktoken.model with
dayzero_ref.tokenizer_gen, encodes the same strings with `dayzero tokenize --batch` and with the npm
packages @huggingface/tokenizers and tiktoken (tests/npm/encode.mjs), and requires identical ids
and exact round trips. Missing npm modules fail the test: run scripts/install-deps.sh.
"""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

from dayzero_ref import tokenizer_gen

SOURCE_DIR = os.environ.get("DZ_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.environ.get("DZ_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
NPM_DIR = os.path.join(SOURCE_DIR, "tests", "npm")
DAYZERO = os.path.join(BUILD_DIR, "src", "dayzero", "cli", "dayzero")

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog. It's what they'd've wanted, isn't it?",
    "DON'T SHOUT, I'M HERE. You'RE 'S 'T 'LL",
    "Ça va? Où est la bibliothèque? Déjà vu, naïve café, crème brûlée.",
    "Straße Größe Füße ¿Qué tal, señor? Tiếng Việt có dấu: cảm ơn.",
    "e\u0301 a\u0308 combining marks n\u0303",
    "Ελληνικά Καλημέρα κόσμε. Привет, мир! עברית العربية हिन्दी ไทย",
    "中文：你好，世界！今天天气很好，我们去公园散步吧。",
    "日本語：こんにちは、世界。カタカナとひらがな。東京タワー",
    "Han edge cases: 々〇、。〆ヶ 𠀀𪚥 ㊀ 한국어 안녕하세요",
    "Emoji: 😀😃😄 👍🏽 ❤️ 🇫🇷🇯🇵 👨‍👩‍👧‍👦 👩🏾‍💻 🧑‍🚀 ✨🎉",
    "Digits 0 1 12 123 1234 12345 1234567890123 3.14159 ١٢٣٤ ४२ ½ ⅷ",
    "1234567890" * 5,
    " " * 300 + "x",
    "tabs\t\t\tand spaces   \n\n\n  lines\r\n\r\nCRLF\n",
    "   leading and trailing   ",
    "\n",
    "nbsp\u00a0ideographic\u3000nel\u0085bom\ufeffzwsp\u200bend",
    "Mixed 混合 text with English and 中文 and 日本語 and emoji 🚀 and numbers 42!!",
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "<html><p class=\"x\">a &amp; b</p></html> SELECT * FROM t WHERE a>=1;",
    "Quotes “smart” ‘single’ «guillemets» 「日本」 (parentheses) [brackets] {braces}",
    "math ∑∫√∞≠≤≥ arrows →←↑↓ box ┌─┐ private \ue000 rare \U0001F9EC",
]

HF_SPECIAL_TEXTS = [
    "<｜begin▁of▁sentence｜>Hello<｜User｜>hi<｜Assistant｜><think>x</think>ok<｜end▁of▁sentence｜>",
    "text before <｜User｜> and after, <think> not special but added",
    "<｜User｜><｜User｜><｜Assistant｜ broken <｜begin▁of▁sentence｜",
]

KIMI_SPECIAL_TEXTS = [
    "[BOS]<|im_system|>system<|im_middle|>You are helpful.<|im_end|><|im_user|>user"
    "<|im_middle|>你好<|im_end|><|im_assistant|>assistant<|im_middle|>",
    "a [EOS] b <|reserved_token_1300|> c <|im_end| broken [BOS",
    "<|media_start|>image<|media_content|><|media_pad|><|media_pad|><|media_end|>",
]


class TokenizersAgreeWithNpm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dz_tok_")
        cls.hf_dir = os.path.join(cls.tmp, "hf")
        cls.hf_list_dir = os.path.join(cls.tmp, "hf_list_merges")
        cls.kimi_dir = os.path.join(cls.tmp, "kimi")
        tokenizer_gen.write_hf_tokenizer(cls.hf_dir, 1500, seed=1)
        tokenizer_gen.write_hf_tokenizer(cls.hf_list_dir, 900, seed=3, merges_as_lists=True)
        tokenizer_gen.write_tiktoken_tokenizer(cls.kimi_dir, 1500, seed=2)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        missing = [m for m in ("@huggingface/tokenizers", "tiktoken")
                   if not os.path.isdir(os.path.join(NPM_DIR, "node_modules", m))]
        if missing or shutil.which("node") is None:
            self.fail(f"npm reference tokenizers missing ({', '.join(missing) or 'node'}): "
                      "run scripts/install-deps.sh")
        if not os.access(DAYZERO, os.X_OK):
            self.fail(f"{DAYZERO} is not built (ninja -C {BUILD_DIR} dayzero)")

    def _dayzero(self, model_dir, texts, allow_special):
        path = os.path.join(self.tmp, "texts.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(texts, f, ensure_ascii=False)
        cmd = [DAYZERO, "tokenize", "--model", model_dir, "--batch", path]
        if not allow_special:
            cmd.append("--no-special")
        out = subprocess.run(cmd, check=True, capture_output=True).stdout
        return json.loads(out)

    def _npm(self, kind, model_dir, texts, allow_special):
        spec = {"kind": kind, "dir": model_dir, "texts": texts, "allow_special": allow_special,
                "pat_str": tokenizer_gen.KIMI_PAT_STR,
                "num_reserved_special_tokens": tokenizer_gen.KIMI_NUM_RESERVED_SPECIAL_TOKENS}
        path = os.path.join(self.tmp, "spec.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f, ensure_ascii=False)
        out = subprocess.run(["node", os.path.join(NPM_DIR, "encode.mjs"), path], check=True,
                             capture_output=True, cwd=NPM_DIR).stdout
        return json.loads(out)

    def _compare(self, kind, model_dir, texts, allow_special):
        ours = self._dayzero(model_dir, texts, allow_special)
        theirs = self._npm(kind, model_dir, texts, allow_special)
        self.assertEqual(len(ours), len(texts))
        num_tokens = 0
        for text, mine, ref in zip(texts, ours, theirs):
            with self.subTest(text=text):
                self.assertEqual(mine["ids"], ref["ids"])
                self.assertEqual(mine["decoded"], text)  # exact round trip
                self.assertEqual(bytes.fromhex(ref["decoded_hex"]).decode("utf-8"), text)
            num_tokens += len(mine["ids"])
        return num_tokens

    def test_hf_bpe_matches_huggingface_tokenizers(self):
        self.assertGreater(self._compare("hf", self.hf_dir, TEXTS + HF_SPECIAL_TEXTS, True), 500)

    def test_hf_bpe_special_text_as_ordinary_text(self):
        self._compare("hf", self.hf_dir, HF_SPECIAL_TEXTS + TEXTS[:4], False)

    def test_hf_bpe_merges_as_lists(self):
        self._compare("hf", self.hf_list_dir, TEXTS + HF_SPECIAL_TEXTS, True)

    def test_tiktoken_matches_tiktoken(self):
        self.assertGreater(
            self._compare("tiktoken", self.kimi_dir, TEXTS + KIMI_SPECIAL_TEXTS, True), 500)

    def test_tiktoken_special_text_as_ordinary_text(self):
        self._compare("tiktoken", self.kimi_dir, KIMI_SPECIAL_TEXTS + TEXTS[:4], False)

    def test_decode_writes_exact_bytes(self):
        # Two tokens of one emoji's bytes decoded apart: raw bytes, no replacement characters.
        text = "🧑‍🚀 x"
        ids = self._dayzero(self.kimi_dir, [text], True)[0]["ids"]
        for cut in range(len(ids) + 1):
            head = subprocess.run([DAYZERO, "tokenize", "--model", self.kimi_dir, "--ids",
                                   ",".join(map(str, ids[:cut]))] if cut else
                                  [DAYZERO, "tokenize", "--model", self.kimi_dir, "--text", ""],
                                  check=True, capture_output=True).stdout
            if cut:
                self.assertTrue(text.encode("utf-8").startswith(head))

    def test_generator_is_deterministic(self):
        again = os.path.join(self.tmp, "again")
        tokenizer_gen.write_hf_tokenizer(again, 1500, seed=1)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(again, name), "rb") as a, \
                    open(os.path.join(self.hf_dir, name), "rb") as b:
                self.assertEqual(a.read(), b.read())


if __name__ == "__main__":
    unittest.main()
