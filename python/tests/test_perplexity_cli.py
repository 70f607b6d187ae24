"""`dayzero perplexity` on the tiny dayzero_hybrid checkpoint (README.md, "What is there today").

1. Per-window NLL against the PyTorch reference (dayzero_ref.hybrid, FP32 logits, log-softmax in
   float64): two windows of --context 40 (the decisive 40-token prompt and a random one) plus a
   dropped tail, with and without --bos; each window's mean NLL within 1e-3 relative, and the
   summary fields (windows, predicted_tokens, nll_sum, mean_nll, perplexity) consistent with them;
   --prefill-chunk 7 agrees with the whole-window prefill within the same tolerance, and
   --max-windows 1 gives exactly the first window.
2. --file: the text through the model's tokenizer gives the same result as the ids `dayzero
   tokenize` prints for it, passed with --token-ids-file; the plain-text report has the window
   lines and the summary.
3. Bad input fails with exit code 1 and a message naming the problem: missing and empty files,
   an item that is not an id, an id outside the vocabulary, fewer tokens than one window,
   --context below 2 or above max_model_len, no input flag.
"""

import json
import math
import os
import tempfile
import unittest

import numpy as np
import torch

from cli_support import run_dayzero, skip_unless_built
from dayzero_ref import make_tiny, test_prompts_hybrid

CONTEXT = 40
NLL_RTOL = 1e-3


def reference_window_nll(ref, window):
    """Mean −log p(window[t + 1] | window[≤ t]) over t < len − 1, float64 log-softmax."""
    with torch.no_grad():
        logits = ref.forward(window).double().numpy()
    log_probs = logits - logits.max(axis=1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(axis=1, keepdims=True))
    targets = np.asarray(window[1:])
    return float(-log_probs[np.arange(len(targets)), targets].mean())


class PerplexityCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "dayzero_hybrid-tiny")
        config = make_tiny.make_tiny("dayzero_hybrid", cls.dir,
                                     seed=test_prompts_hybrid.CHECKPOINT_SEED)
        cls.vocab = config["vocab_size"]
        cls.bos = config["bos_token_id"]
        rng = np.random.default_rng(5)
        # Window 0: the decisive prompt; window 1: random regular ids; a 7-token tail (dropped).
        cls.ids = (list(test_prompts_hybrid.PROMPTS[CONTEXT])
                   + [int(t) for t in rng.integers(0, 512, size=CONTEXT + 7)])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def perplexity(self, *flags):
        proc = run_dayzero("perplexity", "--model", self.dir, "--threads", 1, *flags)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc

    def check_summary(self, result, windows, per_window_predicted):
        self.assertEqual(result["windows"], windows)
        self.assertEqual(len(result["window_nll"]), windows)
        self.assertEqual(result["predicted_tokens"], windows * per_window_predicted)
        self.assertAlmostEqual(result["nll_sum"],
                               per_window_predicted * sum(result["window_nll"]), places=9)
        self.assertAlmostEqual(result["mean_nll"], result["nll_sum"] / result["predicted_tokens"],
                               places=12)
        self.assertAlmostEqual(result["perplexity"], math.exp(result["mean_nll"]), places=9)

    def test_matches_reference(self):
        from dayzero_ref import hybrid  # pylint: disable=import-outside-toplevel
        ref = hybrid.HybridReference(self.dir)
        path = self.write("ids.txt", " ".join(map(str, self.ids[:60])) + ",\n"
                          + ", ".join(map(str, self.ids[60:])) + "\n")
        results = {}
        for bos in (False, True):
            with self.subTest(bos=bos):
                flags = ("--bos",) if bos else ()
                proc = self.perplexity("--token-ids-file", path, "--context", CONTEXT, "--json",
                                       *flags)
                result = results[bos] = json.loads(proc.stdout)
                self.check_summary(result, 2, CONTEXT if bos else CONTEXT - 1)
                for w in range(2):
                    window = self.ids[w * CONTEXT:(w + 1) * CONTEXT]
                    expected = reference_window_nll(ref, [self.bos] * bos + window)
                    got = result["window_nll"][w]
                    print(f"\nbos {bos} window {w}: nll {got:.6f} vs reference {expected:.6f} "
                          f"(rel {abs(got - expected) / expected:.1e})")
                    self.assertLess(abs(got - expected), NLL_RTOL * expected)
        one = json.loads(self.perplexity("--token-ids-file", path, "--context", CONTEXT,
                                         "--max-windows", 1, "--json").stdout)
        self.assertEqual(one["windows"], 1)
        self.assertEqual(one["window_nll"], results[False]["window_nll"][:1])
        chunked = json.loads(self.perplexity("--token-ids-file", path, "--context", CONTEXT,
                                             "--prefill-chunk", 7, "--json").stdout)
        np.testing.assert_allclose(chunked["window_nll"], results[False]["window_nll"],
                                   rtol=NLL_RTOL)

    def test_text_file_matches_its_token_ids(self):
        text = ("The quick brown fox jumps over the lazy dog. Then it sat under a tree and "
                "thought about the weather for a long while, as foxes do.\n") * 3
        text_path = self.write("text.txt", text)
        proc = run_dayzero("tokenize", "--model", self.dir, "--text", text, "--no-special")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        ids = json.loads(proc.stdout)
        self.assertGreaterEqual(len(ids), 2 * 16)
        ids_path = self.write("text_ids.txt", " ".join(map(str, ids)))
        from_text = self.perplexity("--file", text_path, "--context", 16, "--json").stdout
        from_ids = self.perplexity("--token-ids-file", ids_path, "--context", 16, "--json").stdout
        self.assertEqual(json.loads(from_text), json.loads(from_ids))
        self.assertEqual(json.loads(from_text)["windows"], len(ids) // 16)
        plain = self.perplexity("--file", text_path, "--context", 16, "--max-windows", 2).stdout
        lines = plain.strip().split("\n")
        self.assertEqual(len(lines), 3, plain)
        self.assertTrue(lines[0].startswith("window 1/2: tokens [0, 16), nll "), plain)
        self.assertTrue(lines[1].startswith("window 2/2: tokens [16, 32), nll "), plain)
        self.assertRegex(lines[2], r"^windows 2, predicted tokens 30, mean nll [0-9.]+ nats, "
                                   r"perplexity [0-9.]+$")

    def test_errors(self):
        ids = self.write("ok_ids.txt", " ".join(map(str, self.ids)))
        missing = os.path.join(self.tmp.name, "no-such-file.txt")
        cases = [
            (("--token-ids-file", missing), f"--token-ids-file: cannot read {missing}"),
            (("--file", missing), f"--file: cannot read {missing}"),
            (("--file", self.write("empty.txt", "")), "empty.txt is empty"),
            (("--token-ids-file", self.write("blank.txt", " \n, \n")), "holds no token ids"),
            (("--token-ids-file", self.write("bad.txt", "1 2 x3 4")),
             'item 2 "x3" is not a token id'),
            (("--token-ids-file", self.write("neg.txt", "1,-2")), 'item 1 "-2" is not a token id'),
            (("--token-ids-file", self.write("oov.txt", f"1 2 {self.vocab} 3"), "--context", 2),
             f"token id {self.vocab} (index 2) is outside the vocabulary [0, {self.vocab})"),
            (("--token-ids-file", ids, "--context", 200),
             f"{len(self.ids)} tokens are fewer than one window of 200 tokens"),
            (("--token-ids-file", ids, "--context", 1), "must be an integer >= 2, got 1"),
            (("--token-ids-file", ids, "--context", 5000),
             "--context 5000 exceeds the model's max_model_len 4096"),
            (("--token-ids-file", ids, "--context", 4096, "--bos"),
             "--context 4096 + BOS exceeds the model's max_model_len 4096"),
            ((), "give --file or --token-ids-file"),
            (("--file", ids, "--token-ids-file", ids), "excludes"),
        ]
        for flags, message in cases:
            with self.subTest(flags=flags):
                proc = run_dayzero("perplexity", "--model", self.dir, "--threads", 1, *flags)
                self.assertNotEqual(proc.returncode, 0, proc.stdout)
                self.assertIn(message, proc.stderr)
                self.assertEqual(proc.stdout, "")


if __name__ == "__main__":
    unittest.main()
