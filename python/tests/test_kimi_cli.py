"""`dayzero logits`, `verify` and `generate` on the tiny kimi_linear and kimi_k3 checkpoints
(docs/models.md §7.2–7.3, §8).

1. Every split of the same tokens agrees with the full prefill: --prefill-chunk 7 and 24 (chunks
   that split the KDA chunk of 16 unevenly, so the state and the conv rows carry across calls at
   every offset), --decode-from 1, 10, 16, 17 (the recurrent KDA step after a chunked prefill: the
   state layout written by one path is read by the other). Both paths run the same FP32 delta rule
   on the same BF16-valued activations; they differ in summation order only (chunked form vs
   recurrence, and the MLA absorbed vs prefill form). Tolerance: max |a − b| over [T, V] <
   5e-3 · max |full| and identical argmax at every position; a wrong state layout, a lost conv row
   or a state restarted mid-sequence moves logits by O(1) of that scale.
2. Against the PyTorch reference (dayzero_ref.kimi, same numerics policy): median over positions
   of the relative L2 error < 2e-2 and argmax agreement ≥ 0.95 (docs/models.md §8.1).
3. `dayzero verify` passes every operator, layer and model row on both checkpoints.
4. `dayzero generate` streams text and is reproducible for a seed; bad input is refused cleanly.
"""

import os
import tempfile
import unittest

import numpy as np
import torch

from cli_support import rel_l2_per_row, run_dayzero, skip_unless_built
from dayzero_ref import make_tiny


ARCHS = ("kimi_linear", "kimi_k3")
LENGTHS = (1, 5, 17, 33, 65, 100)
SPLITS = (("--prefill-chunk", 7), ("--prefill-chunk", 24), ("--decode-from", 1),
          ("--decode-from", 10), ("--decode-from", 16), ("--decode-from", 17))
SPLIT_TOLERANCE = 5e-3  # max abs difference relative to the logit scale, see the docstring
REF_MEDIAN_REL_L2 = 2e-2
REF_ARGMAX_AGREEMENT = 0.95


def prompt(length):
    """The Kimi test prompt of `length` ids (checked for decisive margins, docs/models.md §8.1)."""
    from dayzero_ref import test_prompts_kimi  # pylint: disable=import-outside-toplevel
    return [int(t) for t in test_prompts_kimi.PROMPTS[length]]


class KimiCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs, cls.vocab = {}, {}
        for arch in ARCHS:
            cls.dirs[arch] = os.path.join(cls.tmp.name, f"{arch}-tiny")
            config = make_tiny.make_tiny(arch, cls.dirs[arch], seed=0)
            cls.vocab[arch] = config.get("text_config", config)["vocab_size"]
        cls.full = {}  # (arch, length) -> logits of the full prefill

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def logits(self, arch, ids, *flags):
        out = os.path.join(self.tmp.name, "logits.npy")
        proc = run_dayzero("logits", "--model", self.dirs[arch], "--token-ids",
                                ",".join(map(str, ids)), "--output", out, "--threads", 1, *flags)
        self.assertEqual(proc.returncode, 0, f"dayzero logits {arch} {flags}: {proc.stderr}")
        logits = np.load(out)
        self.assertEqual(logits.dtype, np.float32)
        self.assertEqual(logits.shape, (len(ids), self.vocab[arch]))
        self.assertTrue(np.isfinite(logits).all())
        return logits

    def full_logits(self, arch, length):
        key = (arch, length)
        if key not in self.full:
            self.full[key] = self.logits(arch, prompt(length))
        return self.full[key]

    def test_prefill_chunked_and_decode_agree(self):
        worst = 0.0
        for arch in ARCHS:
            for length in LENGTHS:
                ids = prompt(length)
                full = self.full_logits(arch, length)
                for flag, value in SPLITS:
                    if value >= length:
                        continue
                    with self.subTest(arch=arch, length=length, split=f"{flag} {value}"):
                        split = self.logits(arch, ids, flag, value)
                        diff = np.abs(split - full).max() / np.abs(full).max()
                        worst = max(worst, diff)
                        self.assertLess(diff, SPLIT_TOLERANCE)
                        np.testing.assert_array_equal(split.argmax(axis=1), full.argmax(axis=1))
        print(f"\nsplits vs full prefill: worst max|diff|/max|full| = {worst:.2e}")

    def test_matches_reference(self):
        from dayzero_ref import kimi  # pylint: disable=import-outside-toplevel
        for arch in ARCHS:
            ref = kimi.KimiReference(self.dirs[arch])
            for length in LENGTHS:
                with self.subTest(arch=arch, length=length):
                    with torch.no_grad():
                        expected = ref.forward(prompt(length)).numpy()
                    ours = self.full_logits(arch, length)
                    rel = rel_l2_per_row(ours, expected)
                    agree = float((ours.argmax(axis=1) == expected.argmax(axis=1)).mean())
                    print(f"\nreference {arch}, length {length:3d}: median rel L2 "
                          f"{np.median(rel):.2e}, max {rel.max():.2e}, argmax agreement {agree:.3f}")
                    self.assertLess(np.median(rel), REF_MEDIAN_REL_L2)
                    self.assertGreaterEqual(agree, REF_ARGMAX_AGREEMENT)

    def test_verify_passes(self):
        for arch in ARCHS:
            with self.subTest(arch=arch):
                proc = run_dayzero("verify", "--model", self.dirs[arch], "--threads", 1)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn(" 0 failed", proc.stdout)
                self.assertIn("kda_core", proc.stdout)
                self.assertIn("attn_out", proc.stdout)
                if arch == "kimi_k3":
                    for quantity in ("attn_mix", "final_mix", "latent_in"):
                        self.assertIn(quantity, proc.stdout)

    def test_generate_streams_reproducible_text(self):
        for arch in ARCHS:
            with self.subTest(arch=arch):
                args = ("generate", "--model", self.dirs[arch], "--prompt", "hello world",
                        "--max-tokens", 12, "--threads", 1)
                greedy = run_dayzero(*args, "--temperature", 0)
                self.assertEqual(greedy.returncode, 0, greedy.stderr)
                sampled = [run_dayzero(*args, "--temperature", 0.9, "--seed", 5)
                           for _ in range(2)]
                for proc in sampled:
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(sampled[0].stdout, sampled[1].stdout)
                print(f"\n{arch} generate greedy: {greedy.stdout!r}")
                self.assertGreater(len(greedy.stdout) + len(sampled[0].stdout), 2)

    def test_bad_input_is_refused_cleanly(self):
        out = os.path.join(self.tmp.name, "bad.npy")
        arch = "kimi_k3"
        base = ("logits", "--model", self.dirs[arch], "--output", out)
        cases = [
            ((*base, "--token-ids", f"1,{self.vocab[arch]}"), "outside the vocabulary"),
            ((*base, "--token-ids", "1,2", "--kv-cache-dtype", "fp8"),
             "kv_lora_rank is 64; use bf16"),
            ((*base, "--token-ids", "1,2", "--mtp-output", out), "no MTP head"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                proc = run_dayzero(*args)
                self.assertGreater(proc.returncode, 0, proc.stderr)  # negative: killed by a signal
                self.assertIn(message, proc.stderr + proc.stdout)


if __name__ == "__main__":
    unittest.main()
