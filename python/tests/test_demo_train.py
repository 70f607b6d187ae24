"""The demo model's training code (python/dayzero_ref/demo_model.py, train_demo.py), without the
corpus: the chunked KDA form against the float64 recurrence, the exported checkpoint against the
engine's tensor table (`dayzero inspect` validates every name, shape and dtype), and the pieces
that make a run deterministic and resumable."""

import argparse
import json
import os
import tempfile
import unittest
from pathlib import Path

import torch

from cli_support import run_dayzero, skip_unless_built
from dayzero_ref import demo_model, kimi, train_demo

# Intra-chunk products run as BF16 matmuls (8 significant bits): a few parts in 10³ of the output.
KDA_ATOL = 2e-2


class ChunkedKda(unittest.TestCase):
    def test_matches_recurrence(self):
        g = torch.Generator().manual_seed(7)
        bsz, num_tokens, heads, dim = 2, 48, 3, 16
        q = torch.nn.functional.normalize(torch.randn(bsz, num_tokens, heads, dim, generator=g), dim=-1)
        k = torch.nn.functional.normalize(torch.randn(bsz, num_tokens, heads, dim, generator=g), dim=-1)
        v = torch.randn(bsz, num_tokens, heads, dim, generator=g)
        # The bounded gate's full range, including the strongest decay −5 per step.
        gate = -5.0 * torch.sigmoid(3.0 * torch.randn(bsz, num_tokens, heads, dim, generator=g))
        beta = torch.sigmoid(torch.randn(bsz, num_tokens, heads, generator=g))
        out = demo_model.kda_chunked_batched(q, k, v, gate, beta)
        for b in range(bsz):
            ref, _ = kimi.kda_recurrent_naive(q[b], k[b], v[b], gate[b], beta[b])
            err = (out[b].double() - ref).abs().max().item()
            self.assertLess(err, KDA_ATOL * ref.abs().max().item())

    def test_gradients_are_finite(self):
        torch.manual_seed(3)
        model = demo_model.DemoModel(demo_model.config_copy({"vocab_size": 512}))
        ids = torch.randint(0, 512, (2, 64))
        stats = {}
        logits = model(ids, "sparse", stats)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 512), ids.reshape(-1))
        (loss + stats["indexer_ce"]).backward()
        for name, p in model.named_parameters():
            if p.grad is not None:
                self.assertTrue(torch.isfinite(p.grad).all(), name)
        # The indexer learns only from its own loss: its inputs are detached.
        self.assertIsNotNone(model.model.layers[2].self_attn.indexer.wk.weight.grad)


class Export(unittest.TestCase):
    def test_engine_accepts_the_exported_layout(self):
        skip_unless_built()
        torch.manual_seed(0)
        model = demo_model.DemoModel()
        with tempfile.TemporaryDirectory() as tmp:
            train_demo.export(model, Path(tmp), lambda _: None)
            with open(os.path.join(tmp, "config.json"), encoding="utf-8") as f:
                config = json.load(f)
            self.assertEqual(config["model_type"], "dayzero_hybrid")
            result = run_dayzero("inspect", tmp)
            self.assertEqual(result.returncode, 0, result.stderr)
            self.assertIn("dayzero_hybrid", result.stdout)
            self.assertIn("MXFP4", result.stdout.upper())


class Determinism(unittest.TestCase):
    def test_batches_depend_only_on_seed_and_step(self):
        tokens = torch.arange(10_000)
        a = train_demo.batch_at(tokens, 17, 0, 4, 32)
        b = train_demo.batch_at(tokens, 17, 0, 4, 32)
        c = train_demo.batch_at(tokens, 18, 0, 4, 32)
        self.assertTrue(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))
        self.assertFalse(torch.equal(a[0], c[0]))
        self.assertTrue(torch.equal(a[0][:, 1:], a[1][:, :-1]))  # targets are inputs shifted

    def test_phases_and_schedule(self):
        args = argparse.Namespace(
            steps=1000, dense_frac=0.5, quant_frac=0.85, warmup=40, lr=2e-3)
        self.assertEqual(train_demo.phase_of(499, args), "dense")
        self.assertEqual(train_demo.phase_of(500, args), "sparse")
        self.assertEqual(train_demo.phase_of(849, args), "sparse")
        self.assertEqual(train_demo.phase_of(850, args), "mxfp4")
        self.assertAlmostEqual(train_demo.learning_rate(39, args), 2e-3)
        self.assertAlmostEqual(train_demo.learning_rate(999, args), 2e-4, delta=1e-6)

    def test_rebalance_raises_underloaded_experts(self):
        moe = demo_model.LatentMoe(demo_model.config_copy())
        load = torch.tensor([10, 0, 5, 5, 5, 5, 5, 5])
        train_demo.rebalance({"loads": [(moe, load)]}, 0.5)
        bias = moe.gate.e_score_correction_bias
        self.assertLess(float(bias[0]), 0.0)
        self.assertGreater(float(bias[1]), 0.0)


if __name__ == "__main__":
    unittest.main()
