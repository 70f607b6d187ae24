"""`dayzero verify` on the tiny deepseek_v32 checkpoint (docs/models.md §8.1).

1. It passes with fp8 and bf16 KV caches on the default decisive prompt (65 tokens, longer than
   index_topk 16, so the indexer selects and attention is sparse), printing operator rows (every
   block of every layer on the reference's inputs and decisions), layer rows and model rows.
2. It fails, with a non-zero exit and FAIL rows, when the engine and the reference disagree:
   a) the reference runs with a bf16 latent cache while the engine quantizes it to FP8 (a real
      numerical difference of ~E4M3 precision in every attention output);
   b) one tap of an otherwise correct reference dump is perturbed by 3 %: exactly that operator
      comparison fails, the others still pass.
3. Bad input (a missing or torch-less interpreter) is a clear error.
4. Under a parallel plan (`mpirun -np N dayzero verify --tp T --ep E`, docs/parallel.md §5) every rank
   runs the comparisons on its shard and rank 0 prints each row's worst rank: the tiny DeepSeek and
   Kimi-Linear (KDA heads split, each rank comparing its own heads) pass at TP 2, EP 2 and
   TP 2 x EP 2, and a tap perturbed only in rank 1's heads fails exactly there.
"""

import os
import shutil
import subprocess
import tempfile
import unittest

import numpy as np

from cli_support import DAYZERO, PYTHON, skip_unless_built
from dayzero_ref import make_tiny, verify_dump
from server_support import MPIRUN

PLANS = ((2, ("--tp", "2")), (2, ("--ep", "2")), (4, ("--tp", "2", "--ep", "2")),
         (2, ("--cp", "2")), (4, ("--tp", "2", "--cp", "2")))
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1")



def rows_of(stdout):
    """Table rows as (level, layer, quantity, metric, result)."""
    rows = []
    for line in stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in ("operator", "layer", "model") and parts[-1] in ("PASS", "FAIL"):
            rows.append((parts[0], parts[1], parts[2], parts[3], parts[-1]))
    return rows


class VerifyCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_dir = os.path.join(cls.tmp.name, "deepseek_v32-tiny")
        cls.config = make_tiny.make_tiny("deepseek_v32", cls.model_dir, seed=0)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def verify(self, *extra):
        return subprocess.run([DAYZERO, "verify", "--model", self.model_dir, "--threads", "1",
                               "--python", PYTHON, *extra],
                              capture_output=True, text=True, timeout=300, check=False)

    def check_complete(self, rows):
        layers = self.config["num_hidden_layers"]
        levels = {r[0] for r in rows}
        self.assertEqual(levels, {"operator", "layer", "model"})
        for layer in range(layers):
            ops = {r[2] for r in rows if r[0] == "operator" and r[1] == str(layer)}
            want = {"q_latent", "index_scores", "index_selection", "attn_out", "ffn_out"}
            if layer >= self.config["first_k_dense_replace"]:
                want |= {"router_scores", "routing_ids"}
            self.assertEqual(ops, want, f"layer {layer}")
        self.assertEqual(sum(r[0] == "layer" for r in rows), layers)
        self.assertEqual({r[3] for r in rows if r[0] == "model"},
                         {"median_rel_l2", "argmax_agree"})

    def test_passes_fp8_and_bf16(self):
        for dtype in ("fp8", "bf16"):
            with self.subTest(dtype=dtype):
                proc = self.verify("--kv-cache-dtype", dtype)
                print(proc.stdout)
                self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                self.assertIn("65 tokens", proc.stdout)
                rows = rows_of(proc.stdout)
                self.check_complete(rows)
                self.assertTrue(all(r[4] == "PASS" for r in rows))

    def test_mismatched_reference_cache_fails(self):
        proc = self.verify("--kv-cache-dtype", "fp8", "--reference-kv-cache-dtype", "bf16")
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        failed = [r for r in rows_of(proc.stdout) if r[4] == "FAIL"]
        # The FP8 round trip of c_kv changes every attention output by far more than 1e-2.
        self.assertIn(("operator", "0", "attn_out", "rel_rms", "FAIL"), failed)

    def test_perturbed_tap_fails_exactly_there(self):
        dump = os.path.join(self.tmp.name, "dump")
        shutil.rmtree(dump, ignore_errors=True)
        verify_dump.dump(self.model_dir, dump, verify_dump.test_prompts.PROMPTS[17], "bf16")
        name = os.path.join(dump, verify_dump.tap_file_name(2, "ffn_out"))
        ffn_out = np.load(name)
        np.save(name, ffn_out * np.float32(1.03))
        proc = self.verify("--kv-cache-dtype", "bf16", "--reference-dump", dump)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        failed = [r for r in rows_of(proc.stdout) if r[4] == "FAIL"]
        self.assertEqual(failed, [("operator", "2", "ffn_out", "rel_rms", "FAIL")], proc.stdout)

    def test_errors(self):
        proc = subprocess.run([DAYZERO, "verify", "--model", self.model_dir, "--python",
                               "/nonexistent/python3"],
                              capture_output=True, text=True, timeout=120, check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("cannot run the reference: python '/nonexistent/python3'", proc.stderr)

    def test_interpreter_without_torch(self):
        fake = os.path.join(self.tmp.name, "python-without-torch")
        with open(fake, "w", encoding="utf-8") as f:
            f.write("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\n"
                    "exit 1\n")
        os.chmod(fake, 0o755)
        proc = subprocess.run([DAYZERO, "verify", "--model", self.model_dir, "--python", fake],
                              capture_output=True, text=True, timeout=120, check=False)
        self.assertEqual(proc.returncode, 1)
        self.assertIn("the PyTorch reference needs torch and numpy", proc.stderr)


class VerifyUnderPlans(unittest.TestCase):
    """verify under --tp, --ep and --cp: the same comparisons as one process, each rank checking its
    own heads (TP) or its own pieces' rows (CP), rank 0 printing each row's worst rank."""

    @classmethod
    def setUpClass(cls):
        skip_unless_built()
        cls.tmp = tempfile.TemporaryDirectory()
        cls.models = {}
        for arch in ("deepseek_v32", "kimi_linear"):
            cls.models[arch] = os.path.join(cls.tmp.name, arch)
            make_tiny.make_tiny(arch, cls.models[arch], seed=0)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def verify(self, arch, ranks, plan, *extra):
        return subprocess.run([*MPIRUN, "-np", str(ranks), "-x", "OMP_NUM_THREADS", DAYZERO,
                               "--log-level", "warn", "verify", "--model", self.models[arch],
                               "--threads", "1", "--python", PYTHON, *plan, *extra],
                              capture_output=True, text=True, timeout=300, check=False,
                              env=MPI_ENV)

    def test_passes_under_every_plan(self):
        for arch in self.models:
            one = subprocess.run([DAYZERO, "verify", "--model", self.models[arch], "--threads", "1",
                                  "--python", PYTHON], capture_output=True, text=True, timeout=300,
                                 check=False)
            self.assertEqual(one.returncode, 0, one.stdout + one.stderr)
            want = [r[:4] for r in rows_of(one.stdout)]
            for ranks, plan in PLANS:
                with self.subTest(arch=arch, plan=plan):
                    proc = self.verify(arch, ranks, plan)
                    self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
                    self.assertIn("worst rank of each row", proc.stdout)
                    rows = rows_of(proc.stdout)
                    self.assertEqual([r[:4] for r in rows], want, "the same comparisons")
                    self.assertTrue(all(r[4] == "PASS" for r in rows), proc.stdout)

    def check_fails_exactly(self, arch, layer, tap, perturb, ranks, plan):
        """A reference tap changed by perturb(values) fails that one operator row under plan."""
        dump = os.path.join(self.tmp.name, f"{arch}-dump")
        shutil.rmtree(dump, ignore_errors=True)
        verify_dump.dump(self.models[arch], dump, verify_dump.test_prompts.PROMPTS[17], "bf16")
        name = os.path.join(dump, verify_dump.tap_file_name(layer, tap))
        values = np.load(name)
        perturb(values)
        np.save(name, values)
        proc = self.verify(arch, ranks, plan, "--kv-cache-dtype", "bf16", "--reference-dump", dump)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        failed = [r for r in rows_of(proc.stdout) if r[4] == "FAIL"]
        self.assertEqual(failed, [("operator", str(layer), tap, "rel_rms", "FAIL")], proc.stdout)

    def test_a_tap_wrong_in_one_ranks_heads_fails(self):
        def rank1_heads(q):  # the heads rank 1 holds at --tp 2
            q[:, q.shape[1] // 2:] *= np.float32(1.03)
        self.check_fails_exactly("kimi_linear", 0, "kda_q", rank1_heads, 2, ("--tp", "2"))

    def test_a_tap_wrong_in_one_ranks_pieces_fails(self):
        def rank1_tokens(out):  # zigzag at --cp 2: rank 1 runs pieces 1 and 2 of 4
            n = out.shape[0]
            out[n // 4:3 * n // 4] *= np.float32(1.03)
        self.check_fails_exactly("deepseek_v32", 1, "ffn_out", rank1_tokens, 2, ("--cp", "2"))

if __name__ == "__main__":
    unittest.main()
