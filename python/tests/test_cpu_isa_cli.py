"""The lower kernel levels end to end (docs/cpu_dispatch.md): with DZ_CPU_ISA=generic every kernel
takes its path for CPUs without AVX-512, with DZ_CPU_ISA=avx512 the path for CPUs without AMX (AMD
Zen 4/5), and the binary must give the same answers as at the default level.

- demo model (MXFP4 experts, KDA, MLA + DSA indexer): greedy `generate` gives the same 24 tokens
  on two prompts chosen for their wide top-2 margins (test_demo_model.py: ≥ 0.038 against the
  PyTorch reference), and `dayzero logits` agree;
- tiny deepseek_v32 (FP8 block linears, the FP8 indexer keys and latent cache): logits agree.

"Agree": the two paths differ in FP32 summation order (~1e-6), which the engine's BF16 roundings
of activations between layers turn into one-ulp differences (2^-8 relative): measured relative
L2 per position 2e-3 – 4.5e-3, and once 0.067 where a near-tied discrete choice (expert routing
or the indexer's top-k) went the other way. Allowed: median ≤ 1e-2, every position ≤ 0.15 and
the same argmax on ≥ 95 % of the positions (the bounds test_hybrid_cli.py puts on the engine
against the PyTorch reference: median 2e-2, argmax 95 %);
- a bad value is refused, naming the variable and the accepted values;
- the slower paths a level selects are logged once at info level, and `--version` lists them.
"""

import json
import os
import subprocess
import tempfile
import unittest

import numpy as np

from cli_support import DAYZERO, SOURCE_DIR, rel_l2_per_row, skip_unless_built
from dayzero_ref import make_tiny

DEMO_DIR = os.path.join(SOURCE_DIR, "models", "demo")
PROMPTS = ("After the war, the", "The church was built in")
LOWER_LEVELS = ("generic", "avx512")
GREEDY_TOKENS = 24
MEDIAN_REL_L2 = 1e-2
MAX_REL_L2 = 0.15
ARGMAX_AGREEMENT = 0.95
IDS = [5, 912, 33, 1870, 7, 402, 2999, 61, 15, 288, 1024, 3, 77, 640, 2048, 9, 123, 4000, 31, 850,
       12, 1500, 64, 700]


def with_isa(isa):
    env = dict(os.environ)
    if isa is None:
        env.pop("DZ_CPU_ISA", None)
    else:
        env["DZ_CPU_ISA"] = isa
    return env


class CpuIsaCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def run_env(self, isa, *args):
        return subprocess.run([DAYZERO, *map(str, args)], capture_output=True, text=True,
                              timeout=600, check=False, env=with_isa(isa))

    def greedy_tokens(self, isa, prompt):
        result = self.run_env(isa, "generate", "--model", DEMO_DIR, "--prompt", prompt,
                              "--temperature", 0, "--repetition-penalty", 1,
                              "--max-tokens", GREEDY_TOKENS, "--ignore-eos",
                              "--timing", "--threads", 2)
        self.assertEqual(result.returncode, 0, result.stderr)
        timing = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
        self.assertEqual(len(timing), 1, result.stderr)
        self.assertEqual(timing[0]["generated"], GREEDY_TOKENS)
        return timing[0]["tokens"]

    def logits(self, isa, model_dir, ids):
        out = os.path.join(self.tmp.name, f"logits-{isa}.npy")
        result = self.run_env(isa, "logits", "--model", model_dir, "--token-ids",
                              ",".join(map(str, ids)), "--output", out, "--threads", 2)
        self.assertEqual(result.returncode, 0, result.stderr)
        logits = np.load(out)
        self.assertTrue(np.isfinite(logits).all())
        return logits

    def check_agree(self, default, lower):
        err = rel_l2_per_row(lower, default)
        self.assertLess(float(np.median(err)), MEDIAN_REL_L2, err)
        self.assertLess(float(err.max()), MAX_REL_L2, err)
        agree = float(np.mean(lower.argmax(axis=1) == default.argmax(axis=1)))
        self.assertGreaterEqual(agree, ARGMAX_AGREEMENT)

    def test_demo_greedy_tokens_are_the_same(self):
        for prompt in PROMPTS:
            default = self.greedy_tokens(None, prompt)
            for isa in LOWER_LEVELS:
                with self.subTest(prompt=prompt, isa=isa):
                    self.assertEqual(self.greedy_tokens(isa, prompt), default)

    def test_demo_logits_agree(self):
        default = self.logits(None, DEMO_DIR, IDS)
        for isa in LOWER_LEVELS:
            with self.subTest(isa=isa):
                self.check_agree(default, self.logits(isa, DEMO_DIR, IDS))

    def test_fp8_checkpoint_logits_agree(self):
        model_dir = os.path.join(self.tmp.name, "deepseek_v32-tiny")
        config = make_tiny.make_tiny("deepseek_v32", model_dir)
        ids = [i % config["vocab_size"] for i in IDS]
        default = self.logits(None, model_dir, ids)
        for isa in LOWER_LEVELS:
            with self.subTest(isa=isa):
                self.check_agree(default, self.logits(isa, model_dir, ids))

    def test_slower_paths_are_logged_once_and_listed_by_version(self):
        result = self.run_env("generic", "generate", "--model", DEMO_DIR, "--prompt", "Hello",
                              "--max-tokens", 2)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = [l for l in result.stderr.splitlines() if "slower paths, as DZ_CPU_ISA=generic" in l]
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn("[info]", lines[0])
        self.assertIn("portable C++", lines[0])
        version = self.run_env("avx512", "--version")
        self.assertEqual(version.returncode, 0, version.stderr)
        self.assertIn("DZ_CPU_ISA: avx512", version.stdout)
        self.assertIn("kernel paths:", version.stdout)
        self.assertNotIn("AMX-BF16 small-M GEMM", version.stdout)

    def test_unknown_value_is_refused(self):
        result = self.run_env("avx2", "generate", "--model", DEMO_DIR, "--prompt", "Hello",
                              "--max-tokens", 1)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("DZ_CPU_ISA", result.stderr)
        self.assertIn("avx2", result.stderr)
        self.assertIn("generic", result.stderr)


if __name__ == "__main__":
    unittest.main()
