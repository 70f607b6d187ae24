"""`dayzero bench decode` and `dayzero bench prefill` (issue 8 item 1): tiny sweeps on synthetic
models (bench/configs/small_mla.json: MLA + MoE, BF16; tests/data/bench_tiny_hybrid.json: KDA +
MLA with the DSA indexer + MXFP4 experts, FP8 KV) and on the shipped demo checkpoint, checking
the JSON is well formed, the figures positive and consistent with the formulas, that the
synthetic context really holds the requested number of tokens, and that bad input gives a clear
error. Timing values themselves are not asserted (benchmarks report, tests check behaviour)."""

import json
import math
import os
import unittest

from cli_support import SOURCE_DIR, run_dayzero, skip_unless_built

SMALL_MLA = os.path.join(SOURCE_DIR, "bench", "configs", "small_mla.json")
TINY_HYBRID = os.path.join(SOURCE_DIR, "tests", "data", "bench_tiny_hybrid.json")
DEMO = os.path.join(SOURCE_DIR, "models", "demo")
# Limits measured briefly (the figures are not judged here), one thread.
QUICK = ["--threads", "1", "--quick-limits", "--json"]
DECODE = ["--batch", "1,2", "--context", "64,256", "--seconds", "0.01", "--min-steps", "1",
          "--max-steps", "2"]


def run_json(*args):
    result = run_dayzero("bench", *args, *QUICK, timeout=120)
    if result.returncode != 0:
        raise AssertionError(f"exit {result.returncode}: {result.stderr[-2000:]}")
    return json.loads(result.stdout)


def positive(value):
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


class BenchDecodeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()

    def check_decode(self, out, synthetic):
        self.assertEqual(out["command"], "decode")
        self.assertTrue(out["context_is_synthetic"])
        self.assertTrue(positive(out["limits"]["dram_read_gbps_1thread"]))
        self.assertTrue(positive(out["dram_limit_gbps"]))
        rows = out["rows"]
        self.assertEqual([(r["context"], r["batch"]) for r in rows],
                         [(64, 1), (64, 2), (256, 1), (256, 2)])
        for r in rows:
            for key in ("ms_per_step", "tokens_per_second", "cache_bytes_per_step", "speedup",
                        "vs_first_context"):
                self.assertTrue(positive(r[key]), (key, r))
            self.assertGreaterEqual(r["steps"], 1)
            self.assertLessEqual(r["steps"], 2)
            # The fill wrote every cached position (read back from the cache).
            self.assertEqual(r["filled_positions"], r["context"], r)
            self.assertAlmostEqual(r["tokens_per_second"] * r["ms_per_step"] / 1e3, r["batch"],
                                   places=6)
            if synthetic:
                self.assertAlmostEqual(
                    r["bytes_per_step"],
                    r["weight_bytes_per_step"] + r["expert_bytes_per_step"] +
                    r["cache_bytes_per_step"], delta=1.0)
                for key in ("gbps", "dram_fraction", "ideal_speedup", "achieved_over_ideal"):
                    self.assertTrue(positive(r[key]), (key, r))
                self.assertLessEqual(r["ideal_speedup"], r["batch"] + 1e-9)
            else:
                self.assertNotIn("bytes_per_step", r)
        self.assertEqual(rows[0]["speedup"], 1.0)
        self.assertEqual(rows[2]["speedup"], 1.0)
        self.assertEqual(rows[0]["vs_first_context"], 1.0)
        return rows

    def test_small_mla(self):
        out = run_json("decode", "--config", SMALL_MLA, *DECODE)
        rows = self.check_decode(out, synthetic=True)
        # Dense MLA reads every cached record: small_mla's BF16 records are (128 + 16) · 2 bytes
        # in each of 4 layers, and a step at position p sees p + 1 of them (p >= context + 1).
        record = (128 + 16) * 2 * 4
        for r in rows:
            per_token = r["cache_bytes_per_step"] / r["batch"] / record
            self.assertGreaterEqual(per_token, r["context"] + 2)
            self.assertLessEqual(per_token, r["context"] + 1 + r["steps"])
        # MoE: 16 experts top-2 in 3 MoE layers; B = 2 touches between 2 and 4 per layer.
        self.assertAlmostEqual(rows[0]["distinct_experts_per_layer"], 2.0)
        self.assertGreaterEqual(rows[1]["distinct_experts_per_layer"], 2.0)
        self.assertLessEqual(rows[1]["distinct_experts_per_layer"], 4.0)
        self.assertGreater(out["model"]["per_step_weight_bytes"], 0)

    def test_tiny_hybrid_sparse_and_recurrent(self):
        out = run_json("decode", "--config", TINY_HYBRID, *DECODE)
        rows = self.check_decode(out, synthetic=True)
        # Per token: layer 0 KDA state (4·32·32 FP32 + 3·3·4·32 BF16 conv rows), layer 1
        # mla_dsa (min(p + 1, 64) FP8 records of 128 + 4 + 32 bytes and p + 1 indexer keys of
        # 132 bytes), layer 2 dense MLA (p + 1 records).
        state = 4 * 32 * 32 * 4 + 3 * 3 * 4 * 32 * 2
        record = 128 + 4 + 16 * 2
        for r in rows:
            low = sum(state + min(p, 64) * record + p * 132 + p * record
                      for p in [r["context"] + 2])
            high = sum(state + min(p, 64) * record + p * 132 + p * record
                       for p in [r["context"] + 1 + r["steps"]])
            per_token = r["cache_bytes_per_step"] / r["batch"]
            self.assertGreaterEqual(per_token, low - 1e-6)
            self.assertLessEqual(per_token, high + 1e-6)

    def test_long_context_sparse(self):
        # 128K cached tokens: the indexer kernel keeps one scored row (8 bytes a key) per thread;
        # the layer's scratch estimate once counted 4, and the step stopped on an exhausted arena.
        out = run_json("decode", "--config", TINY_HYBRID, "--batch", "1", "--context", "128K",
                       "--seconds", "0.01", "--min-steps", "1", "--max-steps", "1")
        self.assertEqual(out["rows"][0]["filled_positions"], 128 * 1024)
        self.assertTrue(positive(out["rows"][0]["ms_per_step"]))

    def test_demo_checkpoint(self):
        out = run_json("decode", "--model", DEMO, *DECODE)
        self.assertFalse(out["model"]["synthetic"])
        self.check_decode(out, synthetic=False)

    def test_bad_input(self):
        missing = run_dayzero("bench", "decode", "--config", "/nonexistent/x.json", *QUICK)
        self.assertNotEqual(missing.returncode, 0)
        self.assertIn("/nonexistent/x.json", missing.stderr)
        self.assertIn("cannot open", missing.stderr)
        bad = run_dayzero("bench", "decode", "--config", SMALL_MLA, "--batch", "1,x", *QUICK)
        self.assertNotEqual(bad.returncode, 0)
        self.assertIn("--batch", bad.stderr)
        self.assertIn('"x"', bad.stderr)
        zero = run_dayzero("bench", "decode", "--config", SMALL_MLA, "--context", "0", *QUICK)
        self.assertNotEqual(zero.returncode, 0)
        self.assertIn("--context", zero.stderr)
        neither = run_dayzero("bench", "prefill", *QUICK)
        self.assertNotEqual(neither.returncode, 0)
        self.assertIn("--config", neither.stderr)


class BenchPrefillTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()

    def test_synthetic(self):
        for config in (SMALL_MLA, TINY_HYBRID):
            with self.subTest(config=config):
                out = run_json("prefill", "--config", config, "--tokens", "32,96", "--chunk", "64")
                self.assertEqual(out["command"], "prefill")
                self.assertTrue(positive(out["gemm_peak_gflops"]))
                rows = out["rows"]
                self.assertEqual([(r["tokens"], r["chunk"]) for r in rows], [(32, 32), (96, 64)])
                for r in rows:
                    for key in ("seconds", "tokens_per_second", "linear_flops", "attention_flops",
                                "gflops", "gemm_fraction"):
                        self.assertTrue(positive(r[key]), (key, r))
                    self.assertAlmostEqual(
                        r["gflops"],
                        (r["linear_flops"] + r["attention_flops"]) / r["seconds"] / 1e9,
                        delta=1e-6 * r["gflops"])
                # Linear FLOPs grow with the tokens (lm_head once per chunk).
                self.assertGreater(rows[1]["linear_flops"], 2.9 * rows[0]["linear_flops"])

    def test_small_mla_attention_flops(self):
        # 4 MLA layers of 4 heads, d_qk 48, d_v 32: 2·H·(d_qk + d_v) per causal pair.
        out = run_json("prefill", "--config", SMALL_MLA, "--tokens", "10")
        self.assertEqual(out["rows"][0]["attention_flops"], 4 * 2 * 4 * (48 + 32) * 55)

    def test_demo_checkpoint(self):
        out = run_json("prefill", "--model", DEMO, "--tokens", "64")
        row = out["rows"][0]
        self.assertTrue(positive(row["tokens_per_second"]))
        self.assertNotIn("gflops", row)


if __name__ == "__main__":
    unittest.main()
