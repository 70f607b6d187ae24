"""bench/peer_llamacpp.sh's pieces that need neither llama.cpp nor a model: bench/peer_report.py on
the raw outputs of a real `--quick` run (tests/data/peer_llamacpp_quick, trimmed: the logs dropped),
the vocab-512 config bench/peer_gguf.py derives, its tokenizer, and the script's errors when a
piece of the llama.cpp build is missing. The figures themselves are not judged."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from cli_support import PYTHON, SOURCE_DIR

FIXTURE = os.path.join(SOURCE_DIR, "tests", "data", "peer_llamacpp_quick")
REPORT = os.path.join(SOURCE_DIR, "bench", "peer_report.py")
GGUF = os.path.join(SOURCE_DIR, "bench", "peer_gguf.py")
SCRIPT = os.path.join(SOURCE_DIR, "bench", "peer_llamacpp.sh")
SHAPE = os.path.join(SOURCE_DIR, "bench", "configs", "deepseek-v2-lite-shape.json")


def report(out_dir, *args):
    return subprocess.run([PYTHON, REPORT, out_dir, *args], capture_output=True, text=True,
                          timeout=60, check=False)


class PeerReportTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="dz_peer_report_")
        self.addCleanup(shutil.rmtree, self.tmp)
        with open(os.path.join(FIXTURE, "run.json")) as f:
            self.params = json.load(f)

    def copy_fixture(self):
        out = os.path.join(self.tmp, "out")
        shutil.copytree(FIXTURE, out)
        return out

    def expected_rows(self):
        p = self.params
        mid, threads = p["mid_context"], p["threads"]
        rows = [f"decode B=1, context 0–{p['short_gen']}", f"decode B=1, context {mid}, {threads} thr",
                f"decode B=1, context {mid}, 1 thr"]
        rows += [f"decode B={b}, context {mid}, {threads} thr (llama-batched-bench S_TG)"
                 for b in p["batches"]]
        rows += [f"prefill {t} tokens" for t in p["prompts"]]
        rows += [f"decode B=1, context {p['long_context']}, {threads} thr"]
        rows += ["DSA variant (dayzero only): decode B=1, context", "DSA variant: decode speed at"]
        return rows

    def test_table_has_every_row_and_ratio(self):
        table_json = os.path.join(self.tmp, "table.json")
        result = report(FIXTURE, "--json", table_json)
        self.assertEqual(result.returncode, 0, result.stderr)
        for row in self.expected_rows():
            self.assertIn(row, result.stdout)
        for limit in ("DRAM read, 1 thread", "FP32 GEMM, 1 thread", "BF16 GEMM"):
            self.assertIn(limit, result.stdout)
        for line in result.stdout.split("| what |")[1].splitlines():
            if line.startswith("| ") and "DSA variant" not in line:  # DSA rows: dayzero only
                self.assertNotIn("—", line)  # every figure is there
        with open(table_json) as f:
            table = json.load(f)
        rows = table["rows"]
        num_dsa_rows = len(self.params["dsa_contexts"].split(",")) + 1  # each context + the ratio
        self.assertEqual(len(rows), len(self.expected_rows()) - 2 + num_dsa_rows)
        both = [r for r in rows if r["llama_cpp"] is not None and r["dayzero"] is not None]
        self.assertEqual(len(both), len(rows) - num_dsa_rows)  # the DSA rows are dayzero's only
        for r in both:
            self.assertGreater(r["llama_cpp"], 0)
            self.assertAlmostEqual(r["ratio"], r["dayzero"] / r["llama_cpp"], places=9)
            self.assertIsNotNone(r["fraction"], r)
            self.assertIn(r["fraction_of"], ("DRAM", "best GEMM peak"))
            self.assertIn(f"{r['ratio']:.2f}×", result.stdout)
        for when in ("start", "end"):
            self.assertGreater(table["limits"][when]["threads"]["dram_read_gbps"], 0)
            self.assertGreater(table["limits"][when]["1thread"]["gemm_f32_gflops"], 0)
        dsa = [r for r in rows if r["what"].startswith("DSA variant (dayzero only)")]
        last_over_first = dsa[-1]["dayzero"] / dsa[0]["dayzero"]
        self.assertAlmostEqual(rows[-1]["ratio"], last_over_first, places=9)
        self.assertTrue(table["meta"]["quick"])

    def test_batched_bench_markdown_table(self):
        """A llama-batched-bench without --output-format prints a markdown table: same S_TG."""
        out = self.copy_fixture()
        path = os.path.join(out, "llama_batched_bench.out")
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.startswith("{")]
        self.assertTrue(lines)
        with open(path, "w") as f:
            f.write("|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s "
                    "|      T s |    S t/s |\n|-------|--------|------|--------|----------|----------"
                    "|----------|----------|----------|----------|\n")
            for r in lines:
                f.write(f"|{r['pp']:6d} | {r['tg']:6d} | {r['pl']:4d} | {r['n_kv']:6d} | "
                        f"{r['t_pp']:8.3f} | {r['speed_pp']:8.2f} | {r['t_tg']:8.3f} | "
                        f"{r['speed_tg']:8.2f} | {r['t']:8.3f} | {r['speed']:8.2f} |\n")
        a, b = os.path.join(self.tmp, "a.json"), os.path.join(self.tmp, "b.json")
        self.assertEqual(report(FIXTURE, "--json", a).returncode, 0)
        result = report(out, "--json", b)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(a) as fa, open(b) as fb:
            rows_a, rows_b = json.load(fa)["rows"], json.load(fb)["rows"]
        for ra, rb in zip(rows_a, rows_b):
            if "S_TG" in ra["what"]:
                self.assertAlmostEqual(ra["llama_cpp"], rb["llama_cpp"], delta=0.01)

    def test_missing_output_is_named(self):
        out = self.copy_fixture()
        os.remove(os.path.join(out, "dayzero_prefill.out"))
        result = report(out)
        self.assertEqual(result.returncode, 1)
        self.assertIn("dayzero_prefill.out", result.stderr)
        self.assertIn("prefill", result.stdout)  # the rest of the table still prints
        self.assertIn("—", result.stdout)


    def test_mxint8_rows(self):
        """--mxint8 runs: the batch and prefill rows again with dayzero's 8-bit activations."""
        out = self.copy_fixture()
        with open(os.path.join(out, "run.json"), "w") as f:
            json.dump(dict(self.params, mxint8=1), f)
        result = report(out)
        self.assertEqual(result.returncode, 1)  # the mxint8 outputs are not there yet
        self.assertIn("dayzero_mxint8_decode_batch.out", result.stderr)
        self.assertIn("dayzero_mxint8_prefill.out", result.stderr)
        for name in ("decode_batch", "prefill"):
            shutil.copy(os.path.join(out, f"dayzero_{name}.out"),
                        os.path.join(out, f"dayzero_mxint8_{name}.out"))
        table_json = os.path.join(self.tmp, "table.json")
        result = report(out, "--json", table_json)
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(table_json) as f:
            rows = [r for r in json.load(f)["rows"] if "MXINT8" in r["what"]]
        self.assertEqual(len(rows), len(self.params["batches"]) + len(self.params["prompts"]))
        for r in rows:
            self.assertIsNotNone(r["ratio"], r)


class PeerGgufTest(unittest.TestCase):
    def test_dayzero_config_is_the_repo_shape_with_vocab_512(self):
        with tempfile.TemporaryDirectory() as tmp:
            derived_path = os.path.join(tmp, "shape.json")
            subprocess.run([PYTHON, GGUF, "--config", SHAPE, "--dayzero-config", derived_path],
                           check=True, timeout=60)
            with open(SHAPE) as f, open(derived_path) as g:
                shape, derived = json.load(f), json.load(g)
        self.assertEqual(derived.pop("vocab_size"), 512)
        shape.pop("vocab_size")
        derived.pop("description")
        shape.pop("description")
        self.assertEqual(derived, shape)

    def test_tokenizer(self):
        spec = importlib.util.spec_from_file_location("peer_gguf", GGUF)
        peer_gguf = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peer_gguf)
        tokens, num_control, merges = peer_gguf.tokenizer(512)
        self.assertEqual(len(tokens), 512)
        self.assertEqual(len(set(tokens)), 512)
        self.assertEqual(len(merges), 512 - num_control - 256)
        known = set(tokens[:num_control + 256])
        for merge in merges:  # each merge joins two known tokens into the next token
            left, right = merge.split(" ")
            self.assertIn(left, known)
            self.assertIn(right, known)
            known.add(left + right)
        self.assertEqual(known, set(tokens))
        with self.assertRaises(SystemExit):
            peer_gguf.tokenizer(100)


class PeerScriptTest(unittest.TestCase):
    def run_script(self, llama):
        with tempfile.TemporaryDirectory() as tmp:
            return subprocess.run(
                ["bash", SCRIPT, "--llama", llama, "--dayzero", sys.executable,
                 "--gguf", os.path.join(tmp, "m.gguf"), "--out", os.path.join(tmp, "out"),
                 "--quick"], capture_output=True, text=True, timeout=60, check=False)

    def test_syntax(self):
        subprocess.run(["bash", "-n", SCRIPT], check=True, timeout=60)

    def test_missing_pieces_are_named(self):
        with tempfile.TemporaryDirectory() as llama:
            result = self.run_script(os.path.join(llama, "absent"))
            self.assertEqual(result.returncode, 1)
            self.assertIn("no such directory", result.stderr)
            result = self.run_script(llama)
            self.assertEqual(result.returncode, 1)
            self.assertIn("no llama-bench binary", result.stderr)
            bin_dir = os.path.join(llama, "build", "bin")
            os.makedirs(bin_dir)
            for name in ("llama-bench", "llama-batched-bench"):
                path = os.path.join(bin_dir, name)
                with open(path, "w") as f:
                    f.write("#!/bin/sh\nexit 1\n")
                os.chmod(path, 0o755)
            result = self.run_script(llama)
            self.assertEqual(result.returncode, 1)
            self.assertIn("no gguf-py", result.stderr)

    def test_usage(self):
        result = subprocess.run(["bash", SCRIPT], capture_output=True, text=True, timeout=60,
                                check=False)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--llama LLAMA_DIR", result.stderr)


if __name__ == "__main__":
    unittest.main()
