"""`dayzero bench ops` (issue 8): every operator case in one process, against the limits measured
in the same run. Runs the tiny shapes (--quick, --seconds 0.01: a few seconds) and checks the JSON
report's structure and arithmetic, not speeds: every case ran with positive time, bytes and FLOPs,
its rates are bytes (FLOPs) / time, its fraction is the rate over the limit of its kind, and the
derived ratios are the quotients of the two cases' times. Also --list, --filter and bad options."""

import json
import math
import unittest

from cli_support import run_dayzero, skip_unless_built

# Every family the issue asks for must be in the run (names carry the shape, so match prefixes).
FAMILIES = ["linear.bf16.gemv.", "linear.fp8.gemv.", "linear.fp8.t", "linear.mxfp4.gemv.",
            "linear.mxfp4.t", "linear.bf16.t", "indexer.decode.", "mla.sparse.decode.",
            "mla.dense.decode.", "kda.chunked.", "kda.recurrent.", "mla_absorb.", "moe.latent."]
LIMIT_KEYS = {"dram": ("gbps", "dram_read_gbps"), "gemm_f32": ("gflops", "gemm_f32_gflops"),
              "gemm_bf16": ("gflops", "gemm_bf16_gflops")}


class BenchOpsCli(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        skip_unless_built()

    def run_json(self, *flags):
        proc = run_dayzero("bench", "ops", "--quick", "--seconds", "0.01", "--threads", 1,
                           "--json", *flags, timeout=120)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return json.loads(proc.stdout)

    def test_quick_json_report(self):
        report = self.run_json()
        self.assertTrue(report["quick"])
        self.assertEqual(report["threads"], 1)
        limits = report["limits"]
        for key in ("dram_read_gbps", "dram_read_gbps_1thread", "gemm_f32_gflops",
                    "gemm_bf16_gflops"):
            self.assertTrue(math.isfinite(limits[key]) and limits[key] > 0, key)
        names = [c["name"] for c in report["cases"]]
        self.assertEqual(len(names), len(set(names)))
        for family in FAMILIES:
            self.assertTrue(any(n.startswith(family) for n in names), family)
        for case in report["cases"]:
            name = case["name"]
            for key in ("ms", "wall_ms", "cpu_ms", "bytes", "flops", "gbps", "gflops", "limit",
                        "fraction"):
                self.assertTrue(math.isfinite(case[key]) and case[key] > 0, f"{name} {key}")
            self.assertGreaterEqual(case["calls"], 2, name)
            seconds = case["ms"] / 1e3
            self.assertAlmostEqual(case["gbps"], case["bytes"] / seconds / 1e9,
                                   delta=1e-9 * case["gbps"], msg=name)
            self.assertAlmostEqual(case["gflops"], case["flops"] / seconds / 1e9,
                                   delta=1e-9 * case["gflops"], msg=name)
            rate_key, limit_key = LIMIT_KEYS[case["limit_kind"]]
            self.assertEqual(case["limit"], limits[limit_key], name)
            self.assertAlmostEqual(case["fraction"], case[rate_key] / case["limit"],
                                   delta=1e-9 * case["fraction"], msg=name)
        by_name = {c["name"]: c for c in report["cases"]}
        ratio_names = [r["name"] for r in report["ratios"]]
        self.assertTrue(any(n.startswith("mla.sparse_speedup.") for n in ratio_names))
        self.assertTrue(any(n.startswith("kda.chunked_speedup.") for n in ratio_names))
        for ratio in report["ratios"]:
            expected = by_name[ratio["slow_case"]]["ms"] / by_name[ratio["fast_case"]]["ms"]
            self.assertAlmostEqual(ratio["value"], expected, delta=1e-9 * expected)

    def test_filter_and_list(self):
        report = self.run_json("--filter", "kda.", "--clock", "cpu")
        self.assertEqual(report["clock"], "cpu")
        names = sorted(c["name"] for c in report["cases"])
        self.assertEqual(len(names), 2)
        self.assertTrue(names[0].startswith("kda.chunked."), names)
        self.assertTrue(names[1].startswith("kda.recurrent."), names)
        self.assertEqual(len(report["ratios"]), 1)
        proc = run_dayzero("bench", "ops", "--quick", "--list")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        listed = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
        for family in FAMILIES:
            self.assertTrue(any(n.startswith(family) for n in listed), family)

    def test_bad_options(self):
        proc = run_dayzero("bench", "ops", "--quick", "--filter", "no-such-case")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("no case matches", proc.stderr)
        proc = run_dayzero("bench", "ops", "--threads", "-1")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--threads", proc.stderr + proc.stdout)
        proc = run_dayzero("bench", "ops", "--clock", "sundial")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--clock", proc.stderr + proc.stdout)
        proc = run_dayzero("bench", "ops", "--no-such-flag")
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("--no-such-flag", proc.stderr + proc.stdout)


if __name__ == "__main__":
    unittest.main()
