"""`dayzero logits`, `verify` and `generate` on the tiny dayzero_hybrid checkpoint
(docs/recipe_dayzero_hybrid.md): KDA + RoPE MLA with the DSA indexer + AttnRes + latent MXFP4 MoE.

1. Against the PyTorch reference (dayzero_ref.hybrid, same numerics policy) on the decisive prompts
   of test_prompts_hybrid (12 tokens: within index_topk 8 only for the first rows; 40 tokens: sparse),
   kv cache bf16 and fp8, the main logits and the MTP head's (--mtp-output): median relative L2
   over positions < 2e-2, argmax agreement >= 0.95 (docs/models.md §8.1). The sparse selection
   matters: the dense-attention reference is further from the engine than the sparse one.
2. Every split agrees with the full prefill, both heads: --prefill-chunk 7 and 24, --decode-from 1,
   9 and 30 (the index cache, the MTP layer's cache and the KDA state written by one path and read
   by the other); max |a − b| < 5e-3 · max |full| and identical argmax.
3. `dayzero verify` passes every operator, layer and model row (indexer selections included).
   With --mxfp4-activations mxint8 (8-bit activations of the MXFP4 experts) 1–3 hold against the
   reference with the same activations, which the engine is closer to than to the BF16 one, in
   one process and under `mpirun -np 2 verify --tp 2` and `--ep 2`.
4. The default model: `generate` without --model runs $DAYZERO_MODEL and logs the pick; a missing
   one fails with a message; `--help` names the default.
"""

import os
import subprocess
import tempfile
import unittest

import numpy as np
import torch

from cli_support import DAYZERO, SOURCE_DIR, rel_l2_per_row, run_dayzero, skip_unless_built
from dayzero_ref import make_tiny, test_prompts_hybrid
from server_support import MPI_ENV, MPIRUN

SPLITS = (("--prefill-chunk", 7), ("--prefill-chunk", 24), ("--decode-from", 1),
          ("--decode-from", 9), ("--decode-from", 30))
SPLIT_TOLERANCE = 5e-3
REF_MEDIAN_REL_L2 = 2e-2
REF_ARGMAX_AGREEMENT = 0.95


def prompt(length):
    return [int(t) for t in test_prompts_hybrid.PROMPTS[length]]


class HybridCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "dayzero_hybrid-tiny")
        config = make_tiny.make_tiny("dayzero_hybrid", cls.dir,
                                     seed=test_prompts_hybrid.CHECKPOINT_SEED)
        cls.vocab = config["vocab_size"]
        cls.full = {}

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def logits(self, ids, *flags):
        """(logits [T, V], MTP logits [T − 1, V])."""
        out = os.path.join(self.tmp.name, "logits.npy")
        mtp_out = os.path.join(self.tmp.name, "mtp.npy")
        proc = run_dayzero("logits", "--model", self.dir, "--token-ids", ",".join(map(str, ids)),
                           "--output", out, "--mtp-output", mtp_out, "--threads", 1, *flags)
        self.assertEqual(proc.returncode, 0, f"dayzero logits {flags}: {proc.stderr}")
        logits, mtp = np.load(out), np.load(mtp_out)
        for array, rows in ((logits, len(ids)), (mtp, len(ids) - 1)):
            self.assertEqual(array.shape, (rows, self.vocab))
            self.assertTrue(np.isfinite(array).all())
        return logits, mtp

    def full_logits(self, length, kv="bf16"):
        if (length, kv) not in self.full:
            self.full[(length, kv)] = self.logits(prompt(length), "--kv-cache-dtype", kv)
        return self.full[(length, kv)]

    def test_matches_reference(self):
        from dayzero_ref import hybrid  # pylint: disable=import-outside-toplevel
        for kv, lengths in (("bf16", (12, 40)), ("fp8", (40,))):
            ref = hybrid.HybridReference(self.dir, kv_cache_dtype=kv)
            for length in lengths:
                with torch.no_grad():
                    expected = (ref.forward(prompt(length)).numpy(),
                                ref.mtp_logits(prompt(length)).numpy())
                for head, ours, exp in zip(("main", "mtp"), self.full_logits(length, kv),
                                           expected):
                    with self.subTest(kv=kv, length=length, head=head):
                        rel = rel_l2_per_row(ours, exp)
                        agree = float((ours.argmax(axis=1) == exp.argmax(axis=1)).mean())
                        print(f"\nreference {kv}, length {length}, {head}: median rel L2 "
                              f"{np.median(rel):.2e}, max {rel.max():.2e}, argmax agreement "
                              f"{agree:.3f}")
                        self.assertLess(np.median(rel), REF_MEDIAN_REL_L2)
                        self.assertGreaterEqual(agree, REF_ARGMAX_AGREEMENT)
        # The indexer's selection is used: dense attention is a different model on 40 tokens.
        ref = hybrid.HybridReference(self.dir)
        with torch.no_grad():
            sparse = ref.forward(prompt(40)).numpy()
            ref.dense_attention = True
            dense = ref.forward(prompt(40)).numpy()
        ours = self.full_logits(40)[0]
        sparse_err = np.median(rel_l2_per_row(ours, sparse))
        dense_err = np.median(rel_l2_per_row(ours, dense))
        print(f"\nsparse vs dense reference: median rel L2 {sparse_err:.2e} vs {dense_err:.2e}")
        self.assertGreater(dense_err, 3 * sparse_err)

    def test_prefill_chunked_and_decode_agree(self):
        ids = prompt(40)
        full = self.full_logits(40)
        worst = 0.0
        for flag, value in SPLITS:
            for head, split, whole in zip(("main", "mtp"), self.logits(ids, flag, value), full):
                with self.subTest(split=f"{flag} {value}", head=head):
                    diff = np.abs(split - whole).max() / np.abs(whole).max()
                    worst = max(worst, diff)
                    self.assertLess(diff, SPLIT_TOLERANCE)
                    np.testing.assert_array_equal(split.argmax(axis=1), whole.argmax(axis=1))
        print(f"\nsplits vs full prefill: worst max|diff|/max|full| = {worst:.2e}")

    def test_mxint8_activations(self):
        """--mxfp4-activations mxint8: against the reference with the same MXINT8 activations
        (closer to it than to the BF16-activation reference), every split equal to the full
        prefill (one kernel for every token count), and `verify` passing every row."""
        from dayzero_ref import hybrid  # pylint: disable=import-outside-toplevel
        ids = prompt(40)
        flag = ("--mxfp4-activations", "mxint8")
        ours = self.logits(ids, *flag)
        ref = hybrid.HybridReference(self.dir)
        with torch.no_grad():
            bf16 = ref.forward(ids).numpy()
            ref.mxfp4_activations = "mxint8"
            mxint8 = (ref.forward(ids).numpy(), ref.mtp_logits(ids).numpy())
        for head, mine, exp in zip(("main", "mtp"), ours, mxint8):
            rel = rel_l2_per_row(mine, exp)
            agree = float((mine.argmax(axis=1) == exp.argmax(axis=1)).mean())
            print(f"\nmxint8 vs its reference, {head}: median rel L2 {np.median(rel):.2e}, "
                  f"argmax agreement {agree:.3f}")
            self.assertLess(np.median(rel), REF_MEDIAN_REL_L2)
            self.assertGreaterEqual(agree, REF_ARGMAX_AGREEMENT)
        to_mxint8 = np.median(rel_l2_per_row(ours[0], mxint8[0]))
        to_bf16 = np.median(rel_l2_per_row(ours[0], bf16))
        print(f"\nmxint8 engine: median rel L2 {to_mxint8:.2e} to the mxint8 reference, "
              f"{to_bf16:.2e} to the bf16 one")
        self.assertLess(2 * to_mxint8, to_bf16)
        for split in (("--prefill-chunk", 7), ("--decode-from", 9)):
            for head, got, whole in zip(("main", "mtp"), self.logits(ids, *flag, *split), ours):
                with self.subTest(split=split, head=head):
                    diff = np.abs(got - whole).max() / np.abs(whole).max()
                    self.assertLess(diff, SPLIT_TOLERANCE)
                    np.testing.assert_array_equal(got.argmax(axis=1), whole.argmax(axis=1))
        proc = run_dayzero("verify", "--model", self.dir, "--threads", 1, *flag)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(" 0 failed", proc.stdout)
        # Every rank of a parallel plan runs the MXINT8 kernel: a rank left on BF16 activations
        # would put the logits as far from the MXINT8 reference as the BF16 engine is.
        for plan in (("--tp", "2"), ("--ep", "2")):
            with self.subTest(plan=plan):
                proc = subprocess.run(
                    [*MPIRUN, "-np", "2", "-x", "OMP_NUM_THREADS", DAYZERO, "--log-level", "warn",
                     "verify", "--model", self.dir, "--threads", "1", *plan, *flag],
                    capture_output=True, text=True, timeout=300, check=False,
                    env=dict(os.environ, **MPI_ENV, OMP_NUM_THREADS="1"))
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn(" 0 failed", proc.stdout)
                median = [float(f[4]) for f in map(str.split, proc.stdout.splitlines())
                          if f[:1] == ["model"] and f[2:4] == ["logits", "median_rel_l2"]]
                self.assertEqual(len(median), 1, proc.stdout)
                print(f"\nmxint8 under {' '.join(plan)}: logits median rel L2 {median[0]:.2e}")
                self.assertLess(2 * median[0], to_bf16)

    def test_verify_passes(self):
        proc = run_dayzero("verify", "--model", self.dir, "--threads", 1)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn(" 0 failed", proc.stdout)
        for quantity in ("kda_core", "index_selection", "attn_out", "attn_mix", "latent_in"):
            self.assertIn(quantity, proc.stdout)

    def test_inspect(self):
        proc = run_dayzero("inspect", self.dir)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("dayzero_hybrid", proc.stdout)
        self.assertIn("MLA+DSA", proc.stdout)

    def test_default_model_from_env(self):
        env = dict(os.environ, DAYZERO_MODEL=self.dir)
        args = [DAYZERO, "generate", "--prompt", "hello world", "--max-tokens", "4",
                "--threads", "1"]
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300,
                              check=False)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(f"model: {self.dir} (from DAYZERO_MODEL)", proc.stderr)
        missing = os.path.join(self.tmp.name, "no-such-model")
        env["DAYZERO_MODEL"] = missing
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300,
                              check=False)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(missing, proc.stderr)
        help_text = run_dayzero("generate", "--help").stdout
        self.assertIn("DAYZERO_MODEL", help_text)
        self.assertIn(os.path.join("models", "demo"), help_text)
        # Neither --model nor DAYZERO_MODEL: the demo model when it is there, else a clear error.
        env.pop("DAYZERO_MODEL")
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300,
                              check=False)
        demo = os.path.join(SOURCE_DIR, "models", "demo")
        if os.path.exists(os.path.join(demo, "config.json")):
            self.assertIn("(from the default demo model)", proc.stderr)
        else:
            self.assertNotEqual(proc.returncode, 0)
            self.assertIn("no --model given and the default model was not found at", proc.stderr)
            self.assertIn("pass --model DIR", proc.stderr)


if __name__ == "__main__":
    unittest.main()
