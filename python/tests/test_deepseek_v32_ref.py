"""deepseek_v32 PyTorch reference: self-consistency, the indexer's selection rule, the RoPE erratum,
the KV-cache switch, the MTP head, the YaRN constants of DeepSeek-V3.2 and determinism.

All on the decisive tiny checkpoint (make_tiny deepseek_v32, seed test_prompts.CHECKPOINT_SEED) and
its margin-checked prompts."""

import json
import math
import os
import shutil
import tempfile
import unittest

import numpy as np
import torch

from dayzero_ref import deepseek_v32 as ds
from dayzero_ref import decisive_v32, formats, make_tiny, margins, test_prompts
from dayzero_ref import safetensors_io as st

PROMPTS = test_prompts.PROMPTS


def rel_l2(a, b):
    return float((a - b).norm() / b.norm())


class DeepseekV32ReferenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_grad_enabled(False)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = os.path.join(cls.tmp.name, "ds")
        make_tiny.make_tiny("deepseek_v32", cls.dir, seed=test_prompts.CHECKPOINT_SEED)
        cls.ref = ds.DeepseekV32Reference(cls.dir)
        cls.ref_bf16 = ds.DeepseekV32Reference(cls.dir, kv_cache_dtype="bf16")
        cls.config = cls.ref.config
        cls.taps65 = {}
        cls.logits65 = cls.ref.forward(PROMPTS[65], taps=cls.taps65)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def setUp(self):  # tests that change these put them back; make sure anyway
        for r in (self.ref, self.ref_bf16):
            r.index_topk = self.config["index_topk"]
            r.indexer_rope_interleave = False
            r.dense_attention = False

    # ------------------------------------------------------------ structure

    def test_taps_have_the_issue3_names_and_shapes(self):
        c, taps = self.config, self.taps65
        t, d = 65, c["hidden_size"]
        shapes = {"attn_norm": [t, d], "q_latent": [t, c["q_lora_rank"]], "index_scores": [t, t],
                  "index_selection": [t, c["index_topk"]], "attn_out": [t, d], "ffn_norm": [t, d],
                  "ffn_out": [t, d], "layer_out": [t, d]}
        for layer in range(c["num_hidden_layers"]):
            for name, shape in shapes.items():
                self.assertEqual(list(taps[(layer, name)].shape), shape, (layer, name))
            moe = layer >= c["first_k_dense_replace"]
            self.assertEqual((layer, "router_scores") in taps, moe)
            if moe:
                self.assertEqual(list(taps[(layer, "router_scores")].shape),
                                 [t, c["n_routed_experts"]])
        self.assertEqual(list(taps[(-1, "final_norm")].shape), [t, d])
        self.assertTrue(torch.equal(taps[(-1, "logits")], self.logits65))
        self.assertEqual(list(self.logits65.shape), [t, c["vocab_size"]])
        self.assertEqual(self.logits65.dtype, torch.float32)
        self.assertTrue(bool(torch.isfinite(self.logits65).all()))
        # Activations between blocks are BF16-valued (issue 3 numerics policy); logits are not.
        for name in ("attn_norm", "q_latent", "attn_out", "ffn_out", "layer_out"):
            x = taps[(2, name)]
            self.assertTrue(torch.equal(formats.round_to_bf16(x), x), name)
        self.assertFalse(torch.equal(formats.round_to_bf16(self.logits65), self.logits65))
        self.assertEqual({n for (layer, n) in taps if layer == 1},
                         set(ds.LAYER_TAPS) | {"routing_ids", "routing_weights"})

    def test_indexer_topk_equals_brute_force(self):
        k = self.config["index_topk"]
        for layer in range(self.config["num_hidden_layers"]):
            scores = self.taps65[(layer, "index_scores")].double()
            selection = self.taps65[(layer, "index_selection")].to(torch.int64).tolist()
            for t in range(scores.shape[0]):
                self.assertTrue(bool(torch.isinf(scores[t, t + 1:]).all()))
                self.assertTrue(bool(torch.isfinite(scores[t, :t + 1]).all()))
                row = [float(v) for v in scores[t, :t + 1]]
                best = sorted(range(t + 1), key=lambda s: (-row[s], s))[:min(k, t + 1)]
                self.assertEqual(selection[t], best + [-1] * (k - len(best)), (layer, t))

    def test_indexer_selection_is_sparse_and_content_dependent(self):
        sel = self.taps65[(1, "index_selection")].to(torch.int64)
        # Every row past K chooses K of t + 1 keys; the choices are not a sliding window.
        self.assertTrue(bool((sel[16:] >= 0).all()))
        windows = sum(set(sel[t].tolist()) == set(range(t - 15, t + 1)) for t in range(16, 65))
        self.assertLess(windows, 49)

    # ------------------------------------------------------------ attention paths

    def test_sparse_equals_dense_while_the_context_fits_index_topk(self):
        ids = PROMPTS[16]
        sparse = self.ref.forward(ids)
        self.ref.dense_attention = True
        self.assertTrue(torch.equal(self.ref.forward(ids), sparse))

    def test_index_topk_at_least_t_gives_dense_attention_and_smaller_k_does_not(self):
        ids = PROMPTS[33]
        self.ref.dense_attention = True
        dense = self.ref.forward(ids)
        self.ref.dense_attention = False
        self.ref.index_topk = 64
        wide = self.ref.forward(ids)
        self.ref.index_topk = self.config["index_topk"]
        sparse = self.ref.forward(ids)
        self.assertTrue(torch.equal(wide, dense))
        self.assertFalse(torch.equal(sparse, dense))
        self.assertGreater(rel_l2(sparse[16:], dense[16:]), 1e-3)  # sparsity is real
        self.assertTrue(torch.equal(sparse[:16], dense[:16]))      # rows t < K see every key

    def test_forced_decisions_reproduce_or_change_the_output(self):
        ids = PROMPTS[65]
        forced = {}
        for (layer, name), value in self.taps65.items():
            if name == "index_selection":
                forced[(layer, name)] = value.to(torch.int64)
            elif name == "routing_ids":
                forced[(layer, name)] = value.to(torch.int64)
        self.assertTrue(torch.equal(self.ref.forward(ids, forced=forced), self.logits65))
        shifted = dict(forced)
        window = torch.arange(65)[:, None] - torch.arange(16)[None, :]  # a sliding window
        shifted[(1, "index_selection")] = torch.where(window >= 0, window, torch.full_like(window, -1))
        taps = {}
        out = self.ref.forward(ids, taps=taps, forced=shifted)
        self.assertFalse(torch.equal(out, self.logits65))
        self.assertTrue(torch.equal(taps[(1, "index_selection")], shifted[(1, "index_selection")].float()))
        rerouted = dict(forced)
        rerouted[(2, "routing_ids")] = torch.arange(4).repeat(65, 1)
        taps = {}
        self.ref.forward(ids, taps=taps, forced=rerouted)
        w = taps[(2, "routing_weights")]
        s = taps[(2, "router_scores")][:, :4]
        self.assertTrue(torch.allclose(w, s / s.sum(-1, keepdim=True) * 2.5, rtol=1e-6))

    # ------------------------------------------------------------ the RoPE-layout erratum

    def test_erratum_indexer_rope_layout_changes_the_selection(self):
        # docs/models.md §3.5: with the MLA (interleaved) layout in the indexer, selections differ.
        ids = margins.candidate_prompt(self._marked(), 100, 0, None)  # many marked keys compete
        self.assertFalse(self.config.get("indexer_rope_interleave", False))
        rotate_half = {}
        self.ref.forward(ids, taps=rotate_half)
        self.ref.indexer_rope_interleave = True
        interleaved = {}
        self.ref.forward(ids, taps=interleaved)
        for layer in range(self.config["num_hidden_layers"]):
            key = (layer, "index_selection")
            self.assertFalse(torch.equal(rotate_half[key], interleaved[key]), layer)

    def _marked(self):
        emb = self.ref.w["model.embed_tokens.weight"]
        return [bool(emb[i, decisive_v32.MARKER_COORD] > 0) for i in range(emb.shape[0])]

    # ------------------------------------------------------------ KV cache dtype

    def test_fp8_and_bf16_cache_logits_differ_but_stay_close(self):
        ids = PROMPTS[65]
        fp8, bf16 = self.logits65, self.ref_bf16.forward(ids)
        self.assertTrue(bool(torch.isfinite(bf16).all()))
        self.assertFalse(torch.equal(fp8, bf16))
        per_row = [rel_l2(fp8[t], bf16[t]) for t in range(len(ids))]
        self.assertLess(float(np.median(per_row)), 2e-2)  # docs/models.md §8.1 logits tolerance
        self.assertTrue(torch.equal(fp8.argmax(-1), bf16.argmax(-1)))  # decisive prompt

    def test_fp8_cache_is_the_act_quant_round_trip(self):
        x = formats.round_to_bf16(torch.randn(3, 256) * 0.7)
        y = ds._dequant_act(x)
        codes, scales = formats.act_quant(x)
        self.assertTrue(torch.equal(y[1, 128:], formats.decode_e4m3(codes[1, 128:]) * scales[1, 1]))
        self.assertLess(rel_l2(y, x), 0.05)
        self.assertFalse(torch.equal(y, x))

    # ------------------------------------------------------------ MTP head

    def test_mtp_logits_shape_and_hidden_choice(self):
        ids = PROMPTS[17]
        c = self.config
        mtp = self.ref.mtp_logits(ids)
        self.assertEqual(list(mtp.shape), [16, c["vocab_size"]])
        self.assertTrue(bool(torch.isfinite(mtp).all()))
        with_next = self.ref.mtp_logits(ids, next_token=5)
        self.assertEqual(list(with_next.shape), [17, c["vocab_size"]])
        self.assertTrue(torch.equal(with_next[:16], mtp))  # causal: the extra row changes no other
        self.assertEqual(list(self.ref.mtp_logits([3]).shape), [0, c["vocab_size"]])
        pre = ds.DeepseekV32Reference(self.dir, mtp_hidden="pre_norm").mtp_logits(ids)
        self.assertFalse(torch.equal(pre, mtp))
        taps = {}
        self.ref.mtp_logits(ids, taps=taps)
        m = c["num_hidden_layers"]
        for name in ("mtp_input", "attn_norm", "index_selection", "router_scores", "layer_out",
                     "final_norm", "logits"):
            self.assertIn((m, name), taps)
        # The decisive head predicts a fixed successor of token t + 1, as the main head does of t.
        main = self.ref.forward(ids)
        self.assertTrue(torch.equal(mtp.argmax(-1), main[1:].argmax(-1)))

    # ------------------------------------------------------------ YaRN (docs/models.md §1.3)

    def test_yarn_constants_of_deepseek_v32(self):
        # Independent arithmetic for d_r 64, θ 10000, L0 4096, β 32/1, factor 40, mscale_all_dim 1.
        def cdim(n):
            return 64 * math.log(4096 / (2 * math.pi * n)) / (2 * math.log(10000))
        self.assertEqual((math.floor(cdim(32)), math.ceil(cdim(1))), (10, 23))
        self.assertEqual(ds.yarn_correction_range(64, 10000.0, 4096, 32, 1), (10, 23))
        m = 0.1 * math.log(40) + 1
        self.assertAlmostEqual(ds.yarn_mscale(40, 1.0), m, places=12)
        self.assertAlmostEqual(192 ** -0.5 * m * m, 0.135234, places=6)
        v32 = {"qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rope_theta": 10000,
               "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                                "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}
        self.assertAlmostEqual(ds.softmax_scale(v32), 0.135234, places=6)
        freqs, magnitude = ds.rope_frequencies(v32)
        self.assertEqual(magnitude, 1.0)  # M(40, 1) / M(40, 1): DeepSeek's cos/sin are unscaled
        plain = torch.tensor([10000.0 ** (-2 * i / 64) for i in range(32)], dtype=torch.float64)
        self.assertTrue(torch.allclose(freqs[:11].double(), plain[:11], rtol=1e-7))
        self.assertTrue(torch.allclose(freqs[23:].double(), plain[23:] / 40, rtol=1e-6))
        ramp = (16 - 10) / 13
        self.assertAlmostEqual(float(freqs[16]), float(plain[16] * (1 - ramp + ramp / 40)), places=9)
        # The tiny model runs the same YaRN (d_n + d_r = 128 there).
        self.assertAlmostEqual(self.ref.softmax_scale, 128 ** -0.5 * m * m, places=6)
        self.assertEqual(self.config["rope_scaling"]["factor"], 40)

    def test_rope_layouts(self):
        x = torch.randn(3, 2, 64)
        pos = torch.tensor([0, 5, 77])
        freqs, _ = ds.rope_frequencies(self.config)
        a = ds.apply_rope(x, pos, freqs, 1.0, interleaved=False)
        angle = 77 * float(freqs[3])
        self.assertAlmostEqual(float(a[2, 1, 3]), float(x[2, 1, 3] * math.cos(angle)
                                                         - x[2, 1, 35] * math.sin(angle)), places=4)
        b = ds.apply_rope(x, pos, freqs, 1.0, interleaved=True)
        self.assertAlmostEqual(float(b[2, 1, 7]), float(x[2, 1, 6] * math.sin(angle)
                                                         + x[2, 1, 7] * math.cos(angle)), places=4)
        self.assertTrue(torch.equal(a[0], x[0]) and torch.equal(b[0], x[0]))  # position 0

    # ------------------------------------------------------------ routing (docs/models.md §6.1)

    def test_routing_bias_selects_and_some_experts_idle(self):
        taps = {}
        self.ref.forward(PROMPTS[5], taps=taps)
        scores = taps[(1, "router_scores")]
        ids = taps[(1, "routing_ids")].to(torch.int64)
        unbiased, _ = ds.route_grouped_sigmoid(scores, torch.zeros(16), 4, 2, 4, True, 2.5)
        differ = [set(a.tolist()) != set(b.tolist()) for a, b in zip(ids, unbiased)]
        self.assertTrue(any(differ))  # the correction bias changes the selection
        self.assertLess(len(set(ids.flatten().tolist())), 16)  # some experts get no token
        w = taps[(1, "routing_weights")]
        self.assertTrue(torch.allclose(w, scores.gather(1, ids) / scores.gather(1, ids).sum(-1, True) * 2.5))

    def test_routing_ties_go_to_lower_ids(self):
        s = torch.full((1, 16), 0.5)
        ids, w = ds.route_grouped_sigmoid(s, torch.zeros(16), 4, 2, 4, True, 2.5)
        self.assertEqual(ids.tolist(), [[0, 1, 2, 3]])  # groups 0 and 1 win the tie, then ids 0..3
        self.assertTrue(torch.allclose(w, torch.full((1, 4), 0.625)))
        sel = ds.select_topk(torch.tensor([[0.0, -math.inf], [1.0, 1.0]]), 3)
        self.assertEqual(sel.tolist(), [[0, -1, -1], [0, 1, -1]])

    # ------------------------------------------------------------ loading, CLI, determinism

    def test_deterministic(self):
        ids = PROMPTS[33]
        a = self.ref.forward(ids)
        self.assertTrue(torch.equal(a, self.ref.forward(ids)))
        self.assertTrue(torch.equal(a, ds.DeepseekV32Reference(self.dir).forward(ids)))
        self.assertTrue(torch.equal(self.ref.forward(PROMPTS[65]), self.logits65))

    def test_sharded_checkpoint_gives_the_same_logits(self):
        sharded = os.path.join(self.tmp.name, "sharded")
        os.makedirs(sharded)
        shutil.copy(os.path.join(self.dir, "config.json"), sharded)
        tensors = st.load_file(os.path.join(self.dir, "model.safetensors"))
        self.assertGreater(len(st.save_sharded(sharded, tensors, 1 << 20)), 1)
        out = ds.DeepseekV32Reference(sharded).forward(PROMPTS[5])
        self.assertTrue(torch.equal(out, self.ref.forward(PROMPTS[5])))

    def test_fp8_weights_are_dequantized_exactly(self):
        raw = st.load_file(os.path.join(self.dir, "model.safetensors"))
        name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
        want = formats.dequantize_fp8_block(st.to_torch(raw[name]),
                                            st.to_torch(raw[name + "_scale_inv"]))
        self.assertTrue(torch.equal(self.ref.w[name], want))
        self.assertNotIn(name + "_scale_inv", self.ref.w)

    def test_cli_writes_float32_logits(self):
        out = os.path.join(self.tmp.name, "logits.npy")
        mtp = os.path.join(self.tmp.name, "mtp.npy")
        ids = PROMPTS[5]
        ds.main([self.dir, "--token-ids", ",".join(map(str, ids)), "--output", out,
                 "--kv-cache-dtype", "bf16", "--mtp-output", mtp])
        a = np.load(out)
        self.assertEqual((a.dtype, a.shape), (np.float32, (5, 512)))
        self.assertTrue(np.array_equal(a, self.ref_bf16.forward(ids).numpy()))
        self.assertEqual(np.load(mtp).shape, (4, 512))

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "kv_cache_dtype 'fp16'"):
            ds.DeepseekV32Reference(self.dir, kv_cache_dtype="fp16")
        with self.assertRaisesRegex(ValueError, r"token ids \[512\] outside \[0, 512\)"):
            self.ref.forward([1, 512])
        with self.assertRaisesRegex(ValueError, "empty token list"):
            self.ref.forward([])
        broken = os.path.join(self.tmp.name, "broken")
        os.makedirs(broken, exist_ok=True)
        with open(os.path.join(broken, "config.json"), "w", encoding="utf-8") as f:
            json.dump(self.config, f)
        raw = st.load_file(os.path.join(self.dir, "model.safetensors"))
        del raw["model.layers.2.mlp.experts.3.up_proj.weight_scale_inv"]
        st.save_file(os.path.join(broken, "model.safetensors"), raw)
        with self.assertRaisesRegex(ValueError, "experts.3.up_proj.weight: F8_E4M3 weight without"):
            ds.DeepseekV32Reference(broken)

    # ------------------------------------------------------------ decisive prompts (docs/models.md §8.1)

    def test_recorded_prompts_pass_the_margin_check(self):
        # The full check (6 trials, both cache dtypes, every length) is `python -m
        # dayzero_ref.margins DIR --test-prompts`; here two trials on the longest prompts.
        for length in (17, 65, 100):
            report = margins.check(self.ref, PROMPTS[length], trials=2)
            self.assertTrue(report["passed"], margins.format_report(str(length), report))
        self.assertEqual(sorted(PROMPTS), list(margins.TEST_LENGTHS))
        for length, ids in PROMPTS.items():
            self.assertEqual(len(ids), length)

    def test_margin_check_catches_a_near_tie(self):
        plain = os.path.join(self.tmp.name, "plain")
        make_tiny.make_tiny("deepseek_v32", plain, seed=test_prompts.CHECKPOINT_SEED, decisive=False)
        report = margins.check(ds.DeepseekV32Reference(plain), PROMPTS[65], trials=1)
        self.assertFalse(report["passed"])  # random weights are not decisive (docs/models.md §8.1)


if __name__ == "__main__":
    unittest.main()
