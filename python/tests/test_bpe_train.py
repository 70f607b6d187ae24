"""dayzero_ref.bpe_train: the byte-level BPE trainer behind the demo model's tokenizer.

Trains on a small synthetic corpus (seconds), checks round trips on random text including
non-ASCII, determinism, the merge order, and that the saved tokenizer.json encodes identically
with our Python encoder, with `dayzero tokenize` (the engine's HfTokenizer) and with the npm
package @huggingface/tokenizers (tests/npm/encode.mjs). Missing npm modules or an unbuilt binary
fail the test, as in test_tokenizers.py: run scripts/install-deps.sh / build dayzero.
"""

import collections
import json
import os
import random
import shutil
import subprocess
import tempfile
import unittest

from dayzero_ref import bpe_train

SOURCE_DIR = os.environ.get("DZ_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD_DIR = os.environ.get("DZ_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
NPM_DIR = os.path.join(SOURCE_DIR, "tests", "npm")
DAYZERO = os.path.join(BUILD_DIR, "src", "dayzero", "cli", "dayzero")

_kWords = ("the of and to in that was he for it with as his on be at by had are but from or have "
           "an they which one you were her all she there would their we him been has when who "
           "will more no if out so said what up its about into than them can only other new some "
           "could time these two may then do first any my now such like our over man me even most "
           "don't it's I'm they'll we've you're she'd café naïve Straße señor Ελλάδα Москва 日本語 "
           "😀 1961 3.14 $42 -- ... (see) \"quoted\" e-mail").split()


def synthetic_corpus(seed, num_docs=300):
    rng = random.Random(seed)
    docs = []
    for _ in range(num_docs):
        words = [rng.choice(_kWords) for _ in range(rng.randint(5, 60))]
        text = " ".join(words)
        if rng.random() < 0.3:
            text = text.replace(" ", "\n", 1) + "  \t trailing  "
        docs.append(text.capitalize() + ".")
    return docs


def random_text(rng):
    """Random code points from mixed ranges: ASCII, Latin-1, Greek, CJK, emoji, whitespace."""
    ranges = [(0x20, 0x7e), (0xa0, 0xff), (0x391, 0x3c9), (0x4e00, 0x4e80), (0x1f600, 0x1f64f)]
    out = []
    for _ in range(rng.randint(0, 60)):
        choice = rng.random()
        if choice < 0.1:
            out.append(rng.choice([" ", "  ", "\n", "\t", "\r\n", "\u3000"]))
        elif choice < 0.2:
            out.append(rng.choice(_kWords))
        else:
            lo, hi = rng.choice(ranges)
            out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


class TrainerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.docs = synthetic_corpus(seed=7)
        cls.tok = bpe_train.train_from_texts(cls.docs, vocab_size=500)

    def test_vocab_layout(self):
        tok = self.tok
        self.assertEqual(tok.vocab_size, 500)
        num_special = len(bpe_train.kSpecialTokens)
        for k, special in enumerate(bpe_train.kSpecialTokens):
            self.assertEqual(tok.token_bytes[k], special.encode())
        for b in range(256):
            self.assertEqual(tok.token_bytes[num_special + b], bytes([b]))
        self.assertEqual(len(tok.merges), 500 - num_special - 256)
        self.assertEqual(len(set(tok.token_bytes)), 500, "every token's bytes are distinct")
        for rank, (left, right) in enumerate(tok.merges):
            new_id = num_special + 256 + rank
            self.assertLess(left, new_id)
            self.assertLess(right, new_id)
            self.assertEqual(tok.token_bytes[new_id], tok.token_bytes[left] + tok.token_bytes[right])

    def test_round_trip_random_text(self):
        rng = random.Random(11)
        for _ in range(300):
            text = random_text(rng)
            ids = self.tok.encode_ordinary(text)
            self.assertEqual(self.tok.decode_bytes(ids), text.encode("utf-8"), repr(text))
            self.assertTrue(all(0 <= i < self.tok.vocab_size for i in ids))

    def test_compresses_training_text(self):
        text = self.docs[0]
        self.assertLess(len(self.tok.encode(text)), len(text.encode("utf-8")) / 2)

    def test_deterministic(self):
        again = bpe_train.train_from_texts(list(self.docs), vocab_size=500)
        self.assertEqual(again.merges, self.tok.merges)
        self.assertEqual(again.to_hf_json(), self.tok.to_hf_json())
        # The order of the documents changes no count, so it changes nothing.
        shuffled = list(self.docs)
        random.Random(3).shuffle(shuffled)
        self.assertEqual(bpe_train.train_from_texts(shuffled, vocab_size=500).merges,
                         self.tok.merges)

    def test_first_merge_is_most_frequent_pair(self):
        counts = bpe_train.count_words(self.docs)
        pairs = collections.Counter()
        for word, freq in counts.items():
            data = word.encode("utf-8")
            for a, b in zip(data, data[1:]):
                pairs[(a, b)] += freq
        best = max(pairs.values())
        expected = min(p for p, c in pairs.items() if c == best)  # ties: smaller bytes first
        num_special = len(bpe_train.kSpecialTokens)
        left, right = self.tok.merges[0]
        self.assertEqual((left - num_special, right - num_special), expected)

    def test_stops_when_no_pair_repeats(self):
        # Pairs seen once are not merged (min_frequency 2), so a large request stops early.
        token_bytes, merges = bpe_train.train_bpe({"abcd": 3, "xyz": 1}, 5000)
        self.assertEqual(len(merges), 3)
        self.assertEqual(token_bytes[-1], b"abcd")

    def test_tie_break_by_bytes(self):
        # "ab" and "cd" occur equally often: "ab" (smaller bytes) is merged first.
        token_bytes, merges = bpe_train.train_bpe({"cd": 5, "ab": 5}, 263 + 2)
        self.assertEqual([token_bytes[263], token_bytes[264]], [b"ab", b"cd"])
        self.assertEqual(len(merges), 2)

    def test_merges_applied_by_rank(self):
        # Merges (b,c) before (a,b): "abc" must become [a, bc], not [ab, c].
        s = len(bpe_train.kSpecialTokens)
        a, b, c = (s + ord(ch) for ch in "abc")
        token_bytes = [t.encode() for t in bpe_train.kSpecialTokens] + [bytes([i]) for i in
                                                                          range(256)]
        token_bytes += [b"bc", b"ab"]
        tok = bpe_train.ByteLevelBpe(token_bytes, [(b, c), (a, b)])
        self.assertEqual(tok.encode("abc"), [a, s + 256])
        self.assertEqual(tok.encode("abd"), [s + 257, s + ord("d")])
        # Repeated pairs merge left to right: "bbb" with (b,b) is [bb, b].
        token_bytes2 = token_bytes[:s + 256] + [b"bb"]
        tok2 = bpe_train.ByteLevelBpe(token_bytes2, [(b, b)])
        self.assertEqual(tok2.encode("bbb"), [s + 256, b])

    def test_special_tokens(self):
        ids = self.tok.encode("<|bos|>The<|eos|>")
        self.assertEqual(ids[0], 0)
        self.assertEqual(ids[-1], 1)
        plain = self.tok.encode("<|bos|>", allow_special=False)
        self.assertGreater(len(plain), 1)
        self.assertEqual(self.tok.decode(plain), "<|bos|>")

    def test_pretokenizer_matches_gpt2_shapes(self):
        self.assertEqual(bpe_train.pretokenize("I'm here  now\n\n x 42é"),
                         ["I", "'m", " here", " ", " now", "\n\n", " x", " 42", "é"])

    def test_save_load(self):
        tmp = tempfile.mkdtemp()
        try:
            path = self.tok.save(tmp)
            loaded = bpe_train.ByteLevelBpe.load(path)
            self.assertEqual(loaded.token_bytes, self.tok.token_bytes)
            self.assertEqual(loaded.merges, self.tok.merges)
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            self.assertEqual(data["model"]["type"], "BPE")
            self.assertEqual(data["pre_tokenizer"]["type"], "ByteLevel")
            self.assertEqual(len(data["model"]["vocab"]), 500)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class AgainstEngineAndNpmTest(unittest.TestCase):
    """The saved tokenizer.json through dayzero's HfTokenizer and through @huggingface/tokenizers."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.tok = bpe_train.train_from_texts(synthetic_corpus(seed=5), vocab_size=600)
        cls.tok.save(cls.tmp)
        rng = random.Random(23)
        cls.texts = ["", "Hello, world!", "It's what they'd've wanted, isn't it?",
                     "Ça va? Où est la bibliothèque? naïve café", "日本語 😀 Ελλάδα  Москва",
                     "  leading and trailing  \n\n\t x", "<|bos|>The start<|eos|> <|user|>hi"]
        cls.texts += [random_text(rng) for _ in range(40)]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def _write(self, name, obj):
        path = os.path.join(self.tmp, name)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False)
        return path

    def test_engine_encodes_identically(self):
        if not os.access(DAYZERO, os.X_OK):
            self.fail(f"{DAYZERO} is not built (ninja -C {BUILD_DIR} dayzero)")
        for allow_special in (True, False):
            cmd = [DAYZERO, "tokenize", "--model", self.tmp, "--batch",
                   self._write("texts.json", self.texts)]
            if not allow_special:
                cmd.append("--no-special")
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True).stdout)
            for text, got in zip(self.texts, out):
                with self.subTest(text=text, allow_special=allow_special):
                    self.assertEqual(got["ids"], self.tok.encode(text, allow_special))
                    self.assertEqual(got["decoded"], text)

    def test_npm_tokenizers_encode_identically(self):
        if (not os.path.isdir(os.path.join(NPM_DIR, "node_modules", "@huggingface/tokenizers"))
                or shutil.which("node") is None):
            self.fail("npm reference tokenizers missing: run scripts/install-deps.sh")
        for allow_special in (True, False):
            spec = {"kind": "hf", "dir": self.tmp, "texts": self.texts,
                    "allow_special": allow_special}
            out = subprocess.run(["node", os.path.join(NPM_DIR, "encode.mjs"),
                                  self._write("spec.json", spec)],
                                 check=True, capture_output=True, cwd=NPM_DIR).stdout
            for text, got in zip(self.texts, json.loads(out)):
                with self.subTest(text=text, allow_special=allow_special):
                    self.assertEqual(got["ids"], self.tok.encode(text, allow_special))
                    self.assertEqual(bytes.fromhex(got["decoded_hex"]), text.encode("utf-8"))


if __name__ == "__main__":
    unittest.main()
