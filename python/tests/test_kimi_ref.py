"""Kimi reference (dayzero_ref.kimi): KDA chunked form against the float64 recurrence, gates at their
extremes, AttnRes mix properties, and the full kimi_linear / kimi_k3 tiny models (taps, prefix
consistency, the margin check of the stored test prompts)."""

import math
import os
import tempfile
import unittest

import torch

from dayzero_ref import decisive_kimi, kimi, make_tiny, margins, test_prompts_kimi, verify_dump

C = kimi.KDA_CHUNK
HEADS, DIM = 4, 32


def rms_ratio(out, ref):
    out, ref = out.double(), ref.double()
    return float((out - ref).norm() / ref.norm())


def kda_inputs(num_tokens, seed, bounded=False, f_scale=3.0, dtype=torch.float64):
    g = torch.Generator()
    g.manual_seed(seed)
    q = kimi.l2_normalize_heads(torch.randn(num_tokens, HEADS * DIM, generator=g), HEADS)
    k = kimi.l2_normalize_heads(torch.randn(num_tokens, HEADS * DIM, generator=g), HEADS)
    v = torch.randn(num_tokens, HEADS, DIM, generator=g)
    f = torch.randn(num_tokens, HEADS, DIM, generator=g) * f_scale
    a_log = torch.linspace(0.0, math.log(16.0), HEADS)
    gate = kimi.kda_gate(f.double(), a_log, -5.0 if bounded else None)
    beta = torch.rand(num_tokens, HEADS, generator=g)
    state = torch.randn(HEADS, DIM, DIM, generator=g) * 0.5
    # FP32-representable values, so that the FP32 runs and the float64 oracle see the same inputs
    # (g reaches −480 here: rounding it to FP32 alone would move exp(g) by ~3e-5).
    return [t.float().to(dtype) for t in (q, k, v, gate, beta, state)]


class KdaTest(unittest.TestCase):
    LENGTHS = (1, C - 1, C, C + 1, 3 * C + 5)

    def test_chunked_equals_recurrence_every_length_and_alignment(self):
        # Float64: exact algebra up to round-off (1e-12); float32: docs/models.md §8.1, RMS ratio < 1e-5
        # (outputs and final state, nonzero initial state, unbounded and bounded gates).
        for length in self.LENGTHS:
            for bounded in (False, True):
                q, k, v, g, beta, s0 = kda_inputs(length, seed=length, bounded=bounded)
                o_ref, s_ref = kimi.kda_recurrent_naive(q, k, v, g, beta, s0)
                for pos_begin in range(C):
                    with self.subTest(length=length, bounded=bounded, pos_begin=pos_begin):
                        o, s = kimi.kda_chunked(q, k, v, g, beta, C, s0, pos_begin)
                        self.assertLess(rms_ratio(o, o_ref), 1e-12)
                        self.assertLess(rms_ratio(s, s_ref), 1e-12)
                        o32, s32 = kimi.kda_chunked(*(t.float() for t in (q, k, v, g, beta)),
                                                    C, s0.float(), pos_begin)
                        self.assertEqual(o32.dtype, torch.float32)
                        self.assertLess(rms_ratio(o32, o_ref), 1e-5)
                        self.assertLess(rms_ratio(s32, s_ref), 1e-5)

    def test_zero_state_is_the_default(self):
        q, k, v, g, beta, _ = kda_inputs(C + 3, seed=7)
        a = kimi.kda_chunked(q, k, v, g, beta)
        b = kimi.kda_chunked(q, k, v, g, beta, state=torch.zeros(HEADS, DIM, DIM, dtype=q.dtype))
        self.assertTrue(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]))

    def test_split_calls_equal_one_call(self):
        # State carry: prefill(T) == prefill(n) + prefill(T − n) from position n, and == T single
        # recurrent steps; float64, 1e-12.
        length = 3 * C + 5
        q, k, v, g, beta, s0 = kda_inputs(length, seed=11)
        o_all, s_all = kimi.kda_chunked(q, k, v, g, beta, C, s0)
        for split in (1, 7, C - 1, C, C + 1, 2 * C + 3, length - 1):
            with self.subTest(split=split):
                o1, s1 = kimi.kda_chunked(q[:split], k[:split], v[:split], g[:split],
                                          beta[:split], C, s0, 0)
                o2, s2 = kimi.kda_chunked(q[split:], k[split:], v[split:], g[split:],
                                          beta[split:], C, s1, split)
                self.assertLess(rms_ratio(torch.cat([o1, o2]), o_all), 1e-12)
                self.assertLess(rms_ratio(s2, s_all), 1e-12)
        state, outs = s0, []
        for t in range(length):
            o, state = kimi.kda_recurrent_naive(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1],
                                                beta[t:t + 1], state)
            outs.append(o)
        self.assertLess(rms_ratio(torch.cat(outs), o_all), 1e-12)
        self.assertLess(rms_ratio(state, s_all), 1e-12)

    def test_state_layout_is_v_first(self):
        # One token from zero state with β = 1: S = k vᵀ in docs/models.md §4.4's [d_k, d_v], stored
        # V-first [H, d_v, d_k], so state[h, i, j] = v[i] · k[j].
        q, k, v, g, _, _ = kda_inputs(1, seed=5)
        beta = torch.ones(1, HEADS, dtype=torch.float64)
        _, s = kimi.kda_recurrent_naive(q, k, v, g, beta)
        want = torch.einsum("hv,hk->hvk", v[0], k[0])
        self.assertTrue(torch.allclose(s, want, atol=1e-12))
        _, s_chunk = kimi.kda_chunked(q, k, v, g, beta)
        self.assertTrue(torch.allclose(s_chunk, want, atol=1e-12))

    def test_gates_at_extremes(self):
        f = torch.linspace(-30.0, 30.0, 2 * DIM).reshape(2, DIM)[None].repeat(1, 2, 1)
        a_log = torch.tensor([0.0, math.log(4.0), math.log(8.0), math.log(16.0)])
        f32 = f.float()  # [1, 4, 32]
        g = kimi.kda_gate(f32, a_log)
        self.assertTrue(bool(torch.isfinite(g).all()) and bool((g <= 0).all()))
        f64 = f.double()
        soft = torch.where(f64 > 20, f64, torch.log1p(torch.exp(f64)))
        want = -torch.exp(a_log.double())[:, None] * soft
        self.assertLess(rms_ratio(g, want), 1e-6)
        self.assertAlmostEqual(float(g[0, 3, -1]), -16.0 * 30.0, places=3)  # f > 20: softplus = f
        gb = kimi.kda_gate(f32, a_log, -5.0)
        self.assertTrue(bool(torch.isfinite(gb).all()))
        self.assertTrue(bool((gb >= -5.0).all()) and bool((gb <= 0).all()))
        self.assertLess(float(gb[0, 3, -1]), -4.999)  # saturated: g at the lower bound
        want_b = -5.0 * torch.sigmoid(torch.exp(a_log.double())[:, None] * f64)
        self.assertLess(rms_ratio(gb, want_b), 1e-6)
        # The recurrence at those extremes (state decays to nothing on fast heads): chunked FP32
        # still matches the float64 oracle; D(r,c) is never factored, so nothing overflows.
        for bounded in (False, True):
            with self.subTest(bounded=bounded):
                q, k, v, g, beta, s0 = kda_inputs(2 * C + 3, seed=3, bounded=bounded, f_scale=30.0)
                o_ref, s_ref = kimi.kda_recurrent_naive(q, k, v, g, beta, s0)
                o, s = kimi.kda_chunked(*(t.float() for t in (q, k, v, g, beta)), C,
                                        s0.float(), 5)
                self.assertTrue(bool(torch.isfinite(o).all()) and bool(torch.isfinite(s).all()))
                self.assertLess(rms_ratio(o, o_ref), 1e-5)
                self.assertLess(rms_ratio(s, s_ref), 1e-5)


class AttnResTest(unittest.TestCase):
    def rows(self, count, seed=0):
        g = torch.Generator()
        g.manual_seed(seed)
        return [torch.randn(5, 16, generator=g) * (j + 1) for j in range(count)]

    def test_zero_proj_gives_the_uniform_average(self):
        rows = self.rows(3)
        out = kimi.attn_res_mix(rows, torch.zeros(1, 16), torch.rand(16) + 0.5, 1e-5)
        self.assertTrue(torch.allclose(out, sum(rows) / 3, atol=1e-6))

    def test_one_row_returns_the_row(self):
        row = self.rows(1)[0]
        out = kimi.attn_res_mix([row], torch.randn(1, 16), torch.rand(16), 1e-5)
        self.assertTrue(torch.allclose(out, row, atol=1e-6))

    def test_order_invariance_and_formula(self):
        rows = self.rows(4, seed=2)
        proj, norm = torch.randn(1, 16), torch.rand(16) + 0.5
        a = kimi.attn_res_mix(rows, proj, norm, 1e-5)
        b = kimi.attn_res_mix(rows[::-1], proj, norm, 1e-5)
        self.assertTrue(torch.allclose(a, b, atol=1e-6))
        cw = (norm * proj[0]).double()  # docs/models.md §5 in float64
        s = torch.stack([(r.double() @ cw) / torch.sqrt(r.double().pow(2).mean(-1) + 1e-5)
                         for r in rows])
        p = torch.softmax(s, dim=0)
        want = sum(p[j][:, None] * rows[j].double() for j in range(4))
        self.assertLess(rms_ratio(a, want), 1e-6)

    def test_situ(self):
        g, u = torch.randn(64) * 10, torch.randn(64) * 40
        want = 4 * torch.tanh(g / 4) * torch.sigmoid(g) * 25 * torch.tanh(u / 25)
        self.assertTrue(torch.allclose(kimi.situ(g, u, 4.0, 25.0), want))
        self.assertTrue(torch.allclose(kimi.situ(g, u, 4.0, None),
                                       4 * torch.tanh(g / 4) * torch.sigmoid(g) * u))


class KimiModelTest(unittest.TestCase):
    """Freshly generated decisive tiny models, seed test_prompts_kimi.CHECKPOINT_SEED."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.refs = {}
        for arch in ("kimi_linear", "kimi_k3"):
            out = os.path.join(cls.tmp.name, arch)
            make_tiny.make_tiny(arch, out, seed=test_prompts_kimi.CHECKPOINT_SEED)
            cls.refs[arch] = kimi.KimiReference(out)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def forward(self, arch, ids, taps=None, forced=None):
        with torch.no_grad():
            return self.refs[arch].forward(ids, taps=taps, forced=forced)

    def test_taps_present_with_the_brief_shapes(self):
        ids = test_prompts_kimi.PROMPTS[17]
        t = len(ids)
        for arch, ref in self.refs.items():
            c = ref.config
            d, v, hd = c["hidden_size"], c["vocab_size"], ref.kda_heads * ref.kda_dim
            taps = {}
            logits = self.forward(arch, ids, taps)
            with self.subTest(arch=arch):
                self.assertEqual(tuple(logits.shape), (t, v))
                self.assertTrue(bool(torch.isfinite(logits).all()))
                k3 = arch == "kimi_k3"
                want = {(-1, "final_norm"): (t, d), (-1, "logits"): (t, v)}
                if k3:
                    want[(-1, "final_mix")] = (t, d)
                for i in range(ref.num_layers):
                    for name in ("attn_norm", "attn_out", "ffn_norm", "ffn_out", "layer_out"):
                        want[(i, name)] = (t, d)
                    if k3:
                        want[(i, "attn_mix")] = want[(i, "ffn_mix")] = (t, d)
                    if i in ref.kda_layers:
                        for name in ("kda_q", "kda_k", "kda_v", "kda_g", "kda_core"):
                            want[(i, name)] = (t, hd)
                        want[(i, "kda_beta")] = (t, ref.kda_heads)
                    elif k3:  # q LoRA: the MLA q latent
                        want[(i, "q_latent")] = (t, c["q_lora_rank"])
                    if ref._is_moe(i):
                        want[(i, "router_scores")] = (t, c["num_experts"])
                        want[(i, "routing_ids")] = (t, c["num_experts_per_token"])
                        want[(i, "routing_weights")] = (t, c["num_experts_per_token"])
                        if k3:
                            want[(i, "latent_in")] = (t, c["routed_expert_hidden_size"])
                self.assertEqual({key: tuple(val.shape) for key, val in taps.items()}, want)
                self.assertEqual({name for _, name in taps},
                                 set(n for n in kimi.LAYER_TAPS + kimi.GLOBAL_TAPS
                                     + kimi.REFERENCE_ONLY_TAPS
                                     if k3 or n not in ("attn_mix", "ffn_mix", "final_mix",
                                                        "latent_in", "q_latent")))
                for key, val in taps.items():
                    self.assertTrue(bool(torch.isfinite(val).all()), key)

    def test_gates_spread_in_the_tiny_models(self):
        ids = test_prompts_kimi.PROMPTS[33]
        taps = {}
        self.forward("kimi_k3", ids, taps)
        g = taps[(0, "kda_g")].reshape(len(ids), 4, -1)
        self.assertLess(float(g[:, -1].median()), -4.9)  # decisive_kimi: the fast head at −5
        self.assertGreater(float(g[:, 0].max()), -1.0)  # and slow channels elsewhere
        taps = {}
        self.forward("kimi_linear", ids, taps)
        g = taps[(0, "kda_g")].reshape(len(ids), 4, -1)
        self.assertLess(float(g[:, -1].min()), -20.0)  # unbounded: very fast decay exists
        self.assertGreater(float(g[:, 0].max()), -0.2)

    def test_prefix_consistency(self):
        # The first n rows of a longer prompt's logits are the logits of its first n tokens; they
        # differ only by FP32 summation order (chunk lengths, matmul blocking) that BF16 rounding
        # can lift to a BF16 ulp, so rel L2 per row < 1e-2 and the same argmax.
        ids = test_prompts_kimi.PROMPTS[65]
        for arch in self.refs:
            full = self.forward(arch, ids)
            for n in (1, C - 1, C + 1, 33):
                with self.subTest(arch=arch, n=n):
                    part = self.forward(arch, ids[:n])
                    err = (part - full[:n]).norm(dim=-1) / full[:n].norm(dim=-1)
                    self.assertLess(float(err.max()), 1e-2)
                    self.assertTrue(torch.equal(part.argmax(-1), full[:n].argmax(-1)))

    def test_recurrent_path_agrees_with_chunked(self):
        ids = test_prompts_kimi.PROMPTS[33]
        for arch, ref in self.refs.items():
            chunked = self.forward(arch, ids)
            ref.kda_path = "recurrent"
            try:
                recurrent = self.forward(arch, ids)
            finally:
                ref.kda_path = "chunked"
            with self.subTest(arch=arch):
                err = (recurrent - chunked).norm(dim=-1) / chunked.norm(dim=-1)
                self.assertLess(float(err.median()), 2e-2)
                self.assertTrue(torch.equal(recurrent.argmax(-1), chunked.argmax(-1)))

    def test_forced_routing(self):
        ids = test_prompts_kimi.PROMPTS[16]
        for arch in self.refs:
            taps = {}
            base = self.forward(arch, ids, taps)
            forced = {k: v.to(torch.int64) for k, v in taps.items() if k[1] == "routing_ids"}
            with self.subTest(arch=arch):
                self.assertTrue(torch.equal(self.forward(arch, ids, forced=forced), base))
                layer = min(k[0] for k in forced)
                forced[(layer, "routing_ids")] = torch.flip(forced[(layer, "routing_ids")], [0])
                other = {}
                self.assertFalse(torch.equal(self.forward(arch, ids, other, forced), base))
                self.assertTrue(torch.equal(other[(layer, "routing_ids")],
                                            forced[(layer, "routing_ids")].float()))

    def test_routing_decisive_by_construction(self):
        # Saturated routers: selected experts have σ ≈ 1 unless fewer than k bits are set, and
        # the weights are renormalised σ·scale (Σ = routed_scaling_factor when renormalised).
        for arch, ref in self.refs.items():
            taps = {}
            self.forward(arch, test_prompts_kimi.PROMPTS[15], taps)
            scale = ref.config["routed_scaling_factor"]
            for (layer, name), w in taps.items():
                if name == "routing_weights":
                    with self.subTest(arch=arch, layer=layer):
                        self.assertTrue(torch.allclose(w.sum(-1), torch.full((w.shape[0],), scale),
                                                       atol=1e-4))
            self.assertGreater(decisive_kimi.ROUTER_GAIN, 1)

    def test_stored_prompts_pass_the_margin_check(self):
        # docs/models.md §8.1: activation noise at the rounding scale flips no routing or argmax. Fewer
        # trials than the CLI default (10; the stored prompts pass that) to stay within the time.
        for arch, ref in self.refs.items():
            for length, ids in test_prompts_kimi.PROMPTS.items():
                with self.subTest(arch=arch, length=length):
                    self.assertEqual(len(ids), length)
                    self.assertTrue(all(0 <= t < make_tiny.KIMI_NUM_RANKS for t in ids))
                    report = margins.check(ref, ids, trials=2, with_mtp=False)
                    self.assertTrue(report["passed"], margins.format_report(arch, report))

    def test_verify_dump_default_prompt(self):
        with tempfile.TemporaryDirectory() as out:
            model_dir = os.path.join(self.tmp.name, "kimi_k3")
            self.assertEqual(verify_dump.main([model_dir, out]), 0)
            names = set(os.listdir(out))
            self.assertIn("L0.kda_core.npy", names)
            self.assertIn("L1.routing_ids.npy", names)
            self.assertIn("Lg.final_mix.npy", names)
            self.assertIn("token_ids.json", names)
            self.assertEqual(verify_dump.default_prompt(model_dir), test_prompts_kimi.PROMPTS[65])


if __name__ == "__main__":
    unittest.main()
