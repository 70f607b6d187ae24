"""`dayzero logits` and `dayzero generate` on the tiny deepseek_v32 checkpoint (docs/models.md §8).

1. Every split of the same tokens agrees: full prefill, --prefill-chunk 7 and 24, --decode-from 1,
   10, 16, 17, at lengths crossing index_topk 16 (so both the dense-equivalent and the sparse regime
   run in prefill and in decode, reading keys from earlier chunks through the paged caches), with
   fp8 and bf16 latent caches. They run the same math on the same BF16-valued activations; what may
   differ is the MLA form (MlaBlock uses the absorbed form for ≤ 4 new tokens and for sparse
   attention over a range > 4·index_topk, the prefill form otherwise, so a chunk and the full
   prefill can take different forms: the prefill form rounds up-projected k_nope/v to BF16, the
   absorbed form never materialises them) and FP32 summation order. Tolerance: max |a − b| over the
   whole [T, V] array < 5e-3 · max |full| (measured worst 1.6e-3, at length 100 with a bf16 cache),
   and identical argmax at every position; a wrong position, a wrong cache slot or a skipped
   indexer key moves logits by O(1) of that scale.
2. Against the FP32 PyTorch reference (dayzero_ref.deepseek_v32, same numerics policy): median over
   positions of ‖ours − ref‖₂ / ‖ref‖₂ < 2e-2 and argmax agreement ≥ 0.95 (docs/models.md §8.1), for
   the main logits and for the MTP head (--mtp-output; the reference's default post-norm h_t and
   the head's own embed_tokens / shared_head.head). The MTP logits are held to the split checks of
   item 1 too.
3. `dayzero generate` streams text and is reproducible for a seed.
4. Bad input gives a clear error and a non-zero exit, never a crash.
"""

import os
import tempfile
import unittest

import numpy as np
import torch

from cli_support import rel_l2_per_row, run_dayzero, skip_unless_built
from dayzero_ref import make_tiny


LENGTHS = (17, 33, 65, 100)
DTYPES = ("fp8", "bf16")
SPLITS = (("--prefill-chunk", 7), ("--prefill-chunk", 24), ("--decode-from", 1),
          ("--decode-from", 10), ("--decode-from", 16), ("--decode-from", 17))
SPLIT_TOLERANCE = 5e-3  # max abs difference relative to the logit scale, see the docstring
REF_MEDIAN_REL_L2 = 2e-2
REF_ARGMAX_AGREEMENT = 0.95


def prompt(length, vocab):
    """Test prompt of `length` ids: dayzero_ref.test_prompts when it has one (prompts checked for
    decisive margins, docs/models.md §8.1), else a fixed pseudo-random draw."""
    try:
        from dayzero_ref import test_prompts  # pylint: disable=import-outside-toplevel
        prompts = dict(test_prompts.PROMPTS)
        if length in prompts:
            return [int(t) for t in prompts[length]]
    except ImportError:
        pass
    gen = torch.Generator().manual_seed(1000 + length)
    return torch.randint(2, vocab, (length,), generator=gen).tolist()


class DeepseekV32Cli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = os.path.join(cls.tmp.name, "deepseek_v32-tiny")
        cls.config = make_tiny.make_tiny("deepseek_v32", cls.model_dir, seed=0)
        cls.vocab = cls.config["vocab_size"]
        cls.full = {}  # (length, dtype) -> logits of the full prefill

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def logits(self, ids, *flags, threads=1):
        """(logits [T, V], MTP logits [T − 1, V]). One thread by default: the tiny model is too
        small to gain from more, and on a loaded machine OpenMP barriers make multi-threaded runs
        many times slower."""
        out = os.path.join(self.tmp.name, "logits.npy")
        mtp_out = os.path.join(self.tmp.name, "mtp.npy")
        proc = run_dayzero("logits", "--model", self.model_dir, "--token-ids",
                                ",".join(map(str, ids)), "--output", out, "--mtp-output", mtp_out,
                                "--threads", threads, *flags)
        self.assertEqual(proc.returncode, 0, f"dayzero logits {flags}: {proc.stderr}")
        logits, mtp = np.load(out), np.load(mtp_out)
        for array, rows in ((logits, len(ids)), (mtp, len(ids) - 1)):
            self.assertEqual(array.dtype, np.float32)
            self.assertEqual(array.shape, (rows, self.vocab))
            self.assertTrue(np.isfinite(array).all())
        return logits, mtp

    def full_logits(self, length, dtype):
        key = (length, dtype)
        if key not in self.full:
            self.full[key] = self.logits(prompt(length, self.vocab), "--kv-cache-dtype", dtype)
        return self.full[key]

    def assert_agree(self, ours, full):
        diff = np.abs(ours - full).max() / np.abs(full).max()
        self.assertLess(diff, SPLIT_TOLERANCE)
        np.testing.assert_array_equal(ours.argmax(axis=1), full.argmax(axis=1))
        return diff

    def test_prefill_chunked_and_decode_agree(self):
        worst = 0.0
        for length in LENGTHS:
            ids = prompt(length, self.vocab)
            for dtype in DTYPES:
                full = self.full_logits(length, dtype)
                for flag, value in SPLITS:
                    with self.subTest(length=length, dtype=dtype, split=f"{flag} {value}"):
                        split = self.logits(ids, "--kv-cache-dtype", dtype, flag, value)
                        for ours, expected in zip(split, full):  # main head, then MTP head
                            worst = max(worst, self.assert_agree(ours, expected))
        print(f"\nsplits vs full prefill: worst max|diff|/max|full| = {worst:.2e}")

    def test_thread_count_does_not_change_results(self):
        length = LENGTHS[-1]
        ids = prompt(length, self.vocab)
        for flags in ((), ("--decode-from", 16)):
            with self.subTest(flags=flags):
                one = self.logits(ids, "--kv-cache-dtype", "fp8", *flags)
                three = self.logits(ids, "--kv-cache-dtype", "fp8", *flags, threads=3)
                for ours, expected in zip(three, one):
                    self.assert_agree(ours, expected)

    def test_matches_reference(self):
        from dayzero_ref import deepseek_v32  # pylint: disable=import-outside-toplevel
        for dtype in DTYPES:
            ref = deepseek_v32.DeepseekV32Reference(self.model_dir, kv_cache_dtype=dtype)
            for length in LENGTHS:
                with self.subTest(length=length, dtype=dtype):
                    ids = prompt(length, self.vocab)
                    with torch.no_grad():
                        expected = (ref.forward(ids).numpy(), ref.mtp_logits(ids).numpy())
                    for head, ours, exp in zip(("main", "mtp"), self.full_logits(length, dtype),
                                               expected):
                        rel = rel_l2_per_row(ours, exp)
                        agree = float((ours.argmax(axis=1) == exp.argmax(axis=1)).mean())
                        print(f"\nreference {head}, length {length:3d} kv {dtype}: median rel L2 "
                              f"{np.median(rel):.2e}, max {rel.max():.2e}, argmax agreement "
                              f"{agree:.3f}")
                        self.assertLess(np.median(rel), REF_MEDIAN_REL_L2)
                        self.assertGreaterEqual(agree, REF_ARGMAX_AGREEMENT)

    def test_generate_streams_reproducible_text(self):
        args = ("generate", "--model", self.model_dir, "--prompt", "hello world",
                "--max-tokens", 12, "--threads", 1)
        greedy = run_dayzero(*args, "--temperature", 0)
        self.assertEqual(greedy.returncode, 0, greedy.stderr)
        self.assertTrue(greedy.stdout.endswith("\n"))
        sampled = [run_dayzero(*args, "--temperature", 0.9, "--top-p", 0.9, "--seed", 5)
                   for _ in range(2)]
        for proc in sampled:
            self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(sampled[0].stdout, sampled[1].stdout)
        print(f"\ngenerate greedy: {greedy.stdout!r}\ngenerate T=0.9: {sampled[0].stdout!r}")
        self.assertGreater(len(greedy.stdout) + len(sampled[0].stdout), 2)

    def test_bad_input_is_refused_cleanly(self):
        out = os.path.join(self.tmp.name, "bad.npy")
        base = ("logits", "--model", self.model_dir, "--output", out)
        cases = [
            (("logits", "--model", os.path.join(self.tmp.name, "nope"), "--token-ids", "1,2",
              "--output", out), "config.json"),
            ((*base, "--token-ids", "1,x,3"), "\"x\" is not a token id"),
            ((*base, "--token-ids", "1,-2"), "\"-2\" is not a token id"),
            ((*base, "--token-ids", ""), "--token-ids"),
            ((*base, "--token-ids", f"1,{self.vocab}"), "outside the vocabulary"),
            ((*base, "--token-ids", "1,2,3", "--prefill-chunk", 0), "--prefill-chunk"),
            ((*base, "--token-ids", "1,2,3", "--decode-from", 4), "--decode-from 4 exceeds"),
            ((*base, "--token-ids", "1,2", "--kv-cache-dtype", "fp16"), "--kv-cache-dtype"),
            ((*base, "--token-ids", "7", "--mtp-output", out), "at least 2 token ids"),
            (("generate", "--model", self.model_dir, "--prompt", "hi", "--top-p", 0),
             "top_p must be in (0, 1]"),
            (("generate", "--model", self.model_dir, "--prompt", "hi", "--temperature", -1),
             "temperature must be"),
            (("generate", "--model", self.model_dir, "--prompt", ""), "encodes to no tokens"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                proc = run_dayzero(*args)
                self.assertGreater(proc.returncode, 0, proc.stderr)  # negative: killed by a signal
                self.assertIn(message, proc.stderr + proc.stdout)


if __name__ == "__main__":
    unittest.main()
