"""make_tiny: determinism and the published layouts (docs/models.md §7 tensor tables at the §8 sizes)."""

import hashlib
import json
import math
import os
import tempfile
import unittest

import torch

from dayzero_ref import formats, make_tiny
from dayzero_ref import safetensors_io as st


def file_hashes(directory):
    hashes = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            hashes[name] = hashlib.sha256(f.read()).hexdigest()
    return hashes


def read_text(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_all(directory):
    """name -> RawTensor over the single file or every shard."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            out.update(st.load_file(os.path.join(directory, name)))
    return out


class MakeTinyTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dirs = {}
        cls.tensors = {}
        cls.configs = {}
        for arch in make_tiny.ARCHS:
            out = os.path.join(cls.tmp.name, arch)
            make_tiny.make_tiny(arch, out, seed=3)
            cls.dirs[arch] = out
            cls.tensors[arch] = load_all(out)
            cls.configs[arch] = json.loads(read_text(os.path.join(out, "config.json")))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def expect(self, arch, name, dtype, shape):
        t = self.tensors[arch].get(name)
        self.assertIsNotNone(t, f"{arch}: {name} missing")
        self.assertEqual((t.dtype, tuple(t.shape)), (dtype, tuple(shape)), f"{arch}: {name}")

    def test_same_seed_gives_identical_bytes(self):
        for arch in make_tiny.ARCHS:
            with self.subTest(arch=arch), tempfile.TemporaryDirectory() as again:
                make_tiny.make_tiny(arch, again, seed=3)
                self.assertEqual(file_hashes(again), file_hashes(self.dirs[arch]))

    def test_other_seed_gives_other_weights(self):
        with tempfile.TemporaryDirectory() as other:
            make_tiny.make_tiny("kimi_linear", other, seed=4)
            a = st.load_file(os.path.join(other, "model.safetensors"))
            b = self.tensors["kimi_linear"]
            self.assertEqual(sorted(a), sorted(b))
            self.assertNotEqual(a["model.norm.weight"].data, b["model.norm.weight"].data)

    def test_deepseek_v32_layout(self):
        a = "deepseek_v32"
        p = "model.layers.1."  # a MoE layer; §7.1 table at the §8 sizes
        self.expect(a, p + "input_layernorm.weight", "BF16", [256])
        self.expect(a, p + "self_attn.q_a_proj.weight", "F8_E4M3", [128, 256])
        self.expect(a, p + "self_attn.q_a_proj.weight_scale_inv", "F32", [1, 2])
        self.expect(a, p + "self_attn.q_b_proj.weight", "F8_E4M3", [4 * 128, 128])
        # kv_a_proj out 256 + 64 = 320: three row tiles, the last partial (64 rows).
        self.expect(a, p + "self_attn.kv_a_proj_with_mqa.weight", "F8_E4M3", [320, 256])
        self.expect(a, p + "self_attn.kv_a_proj_with_mqa.weight_scale_inv", "F32", [3, 2])
        self.expect(a, p + "self_attn.kv_b_proj.weight", "F8_E4M3", [4 * 128, 256])
        self.expect(a, p + "self_attn.o_proj.weight", "F8_E4M3", [256, 4 * 64])
        self.expect(a, p + "self_attn.indexer.wq_b.weight", "F8_E4M3", [8 * 128, 128])
        self.expect(a, p + "self_attn.indexer.wk.weight", "F8_E4M3", [128, 256])
        self.expect(a, p + "self_attn.indexer.k_norm.bias", "F32", [128])
        self.expect(a, p + "self_attn.indexer.weights_proj.weight", "BF16", [8, 256])
        self.expect(a, p + "mlp.gate.weight", "BF16", [16, 256])
        self.expect(a, p + "mlp.gate.e_score_correction_bias", "F32", [16])
        self.expect(a, p + "mlp.experts.15.down_proj.weight", "F8_E4M3", [256, 128])
        self.expect(a, p + "mlp.experts.15.down_proj.weight_scale_inv", "F32", [2, 1])
        self.expect(a, p + "mlp.shared_experts.gate_proj.weight", "F8_E4M3", [128, 256])
        self.expect(a, "model.layers.0.mlp.gate_proj.weight", "F8_E4M3", [512, 256])
        for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
            self.expect(a, "model.layers.4." + name, "BF16", [256])
        self.expect(a, "model.layers.4.eh_proj.weight", "BF16", [256, 512])
        self.expect(a, "model.layers.4.shared_head.head.weight", "BF16", [512, 256])
        self.expect(a, "model.layers.4.embed_tokens.weight", "BF16", [512, 256])
        self.expect(a, "model.layers.4.mlp.experts.0.up_proj.weight", "F8_E4M3", [128, 256])
        self.expect(a, "lm_head.weight", "BF16", [512, 256])
        self.assertNotIn("model.layers.0.mlp.gate.weight", self.tensors[a])
        self.assertNotIn("model.layers.5.input_layernorm.weight", self.tensors[a])
        fp8 = [n for n, t in self.tensors[a].items() if t.dtype == "F8_E4M3"]
        for name in fp8:  # every FP8 weight has its scale, and nothing else is FP8-scaled
            self.assertIn(name + "_scale_inv", self.tensors[a])
        scales = [n for n in self.tensors[a] if n.endswith("weight_scale_inv")]
        self.assertEqual(len(scales), len(fp8))

    def test_deepseek_v32_fp8_dequantizes_to_a_plausible_weight(self):
        t = self.tensors["deepseek_v32"]
        name = "model.layers.1.self_attn.kv_a_proj_with_mqa.weight"
        w = formats.dequantize_fp8_block(st.to_torch(t[name]), st.to_torch(t[name + "_scale_inv"]))
        # Drawn N(0, 1/in): the RMS is about in^-1/2 = 1/16, within sampling and FP8 error.
        rms = w.pow(2).mean().sqrt().item()
        self.assertAlmostEqual(rms, 1 / 16, delta=0.1 / 16)
        scales = st.to_torch(t[name + "_scale_inv"])
        self.assertTrue(torch.all(torch.log2(scales) == torch.round(torch.log2(scales))))

    def test_kimi_linear_layout(self):
        a = "kimi_linear"
        kda, mla = "model.layers.0.", "model.layers.3."
        for n in "qkv":
            self.expect(a, kda + f"self_attn.{n}_proj.weight", "BF16", [128, 128])
            self.expect(a, kda + f"self_attn.{n}_conv1d.weight", "BF16", [128, 1, 4])
        self.expect(a, kda + "self_attn.f_a_proj.weight", "BF16", [32, 128])
        self.expect(a, kda + "self_attn.f_b_proj.weight", "BF16", [128, 32])
        self.expect(a, kda + "self_attn.g_a_proj.weight", "BF16", [32, 128])
        self.expect(a, kda + "self_attn.g_b_proj.weight", "BF16", [128, 32])
        self.expect(a, kda + "self_attn.b_proj.weight", "BF16", [4, 128])
        self.expect(a, kda + "self_attn.A_log", "F32", [1, 1, 4, 1])
        self.expect(a, kda + "self_attn.dt_bias", "F32", [128])
        self.expect(a, kda + "self_attn.o_norm.weight", "BF16", [32])
        self.expect(a, kda + "self_attn.o_proj.weight", "BF16", [128, 128])
        self.expect(a, mla + "self_attn.q_proj.weight", "BF16", [4 * 48, 128])
        self.expect(a, mla + "self_attn.kv_a_proj_with_mqa.weight", "BF16", [80, 128])
        self.expect(a, mla + "self_attn.kv_a_layernorm.weight", "BF16", [64])
        self.expect(a, mla + "self_attn.kv_b_proj.weight", "BF16", [4 * 64, 64])
        self.expect(a, mla + "self_attn.o_proj.weight", "BF16", [128, 128])
        self.expect(a, "model.layers.0.mlp.down_proj.weight", "BF16", [128, 256])
        self.expect(a, "model.layers.5.block_sparse_moe.experts.7.w2.weight", "BF16", [128, 64])
        self.expect(a, "model.layers.5.block_sparse_moe.shared_experts.up_proj.weight", "BF16",
                    [64, 128])
        self.expect(a, "model.layers.5.block_sparse_moe.gate.e_score_correction_bias", "F32", [8])
        self.assertNotIn(mla + "self_attn.q_a_proj.weight", self.tensors[a])
        self.assertNotIn(kda + "self_attn.q_proj.weight_scale_inv", self.tensors[a])
        # MLA exactly at 0-based 3 and 5 (kda_layers [1,2,3,5], full_attn_layers [4,6]).
        mla_layers = sorted(int(n.split(".")[2]) for n in self.tensors[a]
                            if n.endswith("kv_b_proj.weight"))
        self.assertEqual(mla_layers, [3, 5])

    def test_kimi_linear_gate_parameters_spread(self):
        t = self.tensors["kimi_linear"]
        a_log = st.to_torch(t["model.layers.0.self_attn.A_log"]).flatten()
        self.assertTrue(torch.allclose(a_log, torch.linspace(0, math.log(16), 4)))
        dt = st.to_torch(t["model.layers.0.self_attn.dt_bias"])
        self.assertTrue(bool(dt.min() >= -3) and bool(dt.max() <= 3) and float(dt.std()) > 1.0)

    def test_kimi_k3_layout(self):
        a = "kimi_k3"
        c = self.configs[a]
        self.assertEqual(c["model_type"], "kimi_k3")
        self.assertEqual(c["text_config"]["model_type"], "kimi_linear")
        self.assertIn("quantization_config", c["text_config"])
        self.assertTrue(os.path.exists(os.path.join(self.dirs[a], st.INDEX_FILE_NAME)))
        p = "language_model.model.layers."
        self.expect(a, "language_model.model.embed_tokens.weight", "BF16", [768, 128])
        self.expect(a, "language_model.lm_head.weight", "BF16", [768, 128])
        self.expect(a, "language_model.model.output_attn_res_proj.weight", "BF16", [1, 128])
        self.expect(a, "language_model.model.output_attn_res_norm.weight", "BF16", [128])
        self.expect(a, p + "0.self_attn.g_proj.weight", "BF16", [128, 128])
        self.expect(a, p + "0.self_attn.q_conv1d.weight", "F32", [128, 1, 4])
        self.expect(a, p + "0.self_attn.A_log", "F32", [32])
        self.expect(a, p + "0.self_attn.o_norm.weight", "F32", [32])
        self.expect(a, p + "0.self_attn.dt_bias", "F32", [128])
        self.expect(a, p + "3.self_attn.q_a_proj.weight", "BF16", [64, 128])
        self.expect(a, p + "3.self_attn.q_b_proj.weight", "BF16", [4 * 48, 64])
        self.expect(a, p + "4.self_attn.g_proj.weight", "BF16", [128, 128])
        self.expect(a, p + "0.mlp.gate_proj.weight", "BF16", [256, 128])
        m = p + "1.block_sparse_moe."
        self.expect(a, m + "gate.weight", "BF16", [16, 128])
        self.expect(a, m + "routed_expert_down_proj.weight", "BF16", [64, 128])
        self.expect(a, m + "routed_expert_norm.weight", "BF16", [64])
        self.expect(a, m + "routed_expert_up_proj.weight", "BF16", [128, 64])
        self.expect(a, m + "shared_experts.gate_proj.weight", "BF16", [128, 128])
        self.expect(a, m + "experts.15.w1.weight_packed", "U8", [64, 32])
        self.expect(a, m + "experts.15.w1.weight_scale", "U8", [64, 2])
        self.expect(a, m + "experts.0.w2.weight_packed", "U8", [64, 32])
        self.expect(a, m + "experts.0.w2.weight_scale", "U8", [64, 2])
        for i in range(5):
            self.expect(a, p + f"{i}.self_attention_res_proj.weight", "BF16", [1, 128])
            self.expect(a, p + f"{i}.mlp_res_norm.weight", "BF16", [128])
        self.assertFalse(any(n.startswith("model.") for n in self.tensors[a]))
        v = "vision_tower."
        self.expect(a, v + "patch_embed.proj.weight", "BF16", [64, 3, 14, 14])
        self.expect(a, v + "patch_embed.pos_emb.weight", "BF16", [8, 8, 64])
        for i in range(2):
            b = f"{v}encoder.blocks.{i}."
            self.expect(a, b + "norm0.weight", "BF16", [64])
            self.expect(a, b + "norm1.weight", "BF16", [64])
            self.expect(a, b + "wqkv.weight", "BF16", [384, 64])
            self.expect(a, b + "wo.weight", "BF16", [64, 128])
            self.expect(a, b + "mlp.fc0.weight", "BF16", [128, 64])
            self.expect(a, b + "mlp.fc1.weight", "BF16", [64, 128])
        self.expect(a, v + "encoder.final_layernorm.weight", "BF16", [64])
        self.expect(a, "mm_projector.proj.0.weight", "BF16", [256, 256])
        self.expect(a, "mm_projector.proj.2.weight", "BF16", [128, 256])
        self.expect(a, "mm_projector.post_norm.weight", "BF16", [128])
        self.assertEqual(len([n for n in self.tensors[a]
                              if n.startswith((v, "mm_projector."))]), 18)
        vc = c["vision_config"]
        self.assertEqual((vc["vt_hidden_size"], vc["qkv_hidden_size"], vc["text_hidden_size"],
                          vc["mm_projector_type"], vc["norm_type"]),
                         (64, 128, 128, "patchmergerv2", "rmsnorm"))
        proc = json.loads(read_text(os.path.join(self.dirs[a], "preprocessor_config.json")))
        self.assertEqual(proc, make_tiny.K3_TINY_PREPROCESSOR)
        self.assertEqual(proc["media_proc_cfg"]["transparent_bg_fill_stage"], "after_resize")
        for arch in ("deepseek_v32", "kimi_linear", "dayzero_hybrid"):
            self.assertNotIn("vision_config", self.configs[arch])
            self.assertFalse(os.path.exists(os.path.join(self.dirs[arch],
                                                         "preprocessor_config.json")))
        a_log = st.to_torch(self.tensors[a][p + "0.self_attn.A_log"])
        self.assertTrue(torch.all(a_log[4:] == 0))  # padded: only the first num_heads used

    def test_kimi_k3_vision_draws(self):
        # Drawn after the text's decisive shaping: the text tensors are those of a checkpoint
        # without vision_config, byte for byte; the tower's draws have the §8 spreads; the
        # projector's last linear and post-norm are shaped (decisive_kimi.shape_projector).
        config = make_tiny.kimi_k3_config()
        with_vision = make_tiny.weights("kimi_k3", config, seed=3)
        del config["vision_config"]
        text_only = make_tiny.weights("kimi_k3", config, seed=3)
        self.assertEqual({n: r.data for n, r in with_vision.items() if n in text_only},
                         {n: r.data for n, r in text_only.items()})
        self.assertEqual(len(with_vision) - len(text_only), 18)
        t = self.tensors["kimi_k3"]
        rms = lambda name: st.to_torch(t[name]).float().pow(2).mean().sqrt().item()  # noqa: E731
        self.assertAlmostEqual(rms("vision_tower.patch_embed.proj.weight"), 588 ** -0.5,
                               delta=0.003)
        self.assertAlmostEqual(rms("vision_tower.patch_embed.pos_emb.weight"), 0.3, delta=0.02)
        self.assertAlmostEqual(rms("mm_projector.proj.0.weight"), 256 ** -0.5, delta=0.003)
        self.assertTrue(torch.all(st.to_torch(t["mm_projector.post_norm.weight"]).float() == 1))
        # Coordinate 0 and the codes: constant rows (the image token's structure over Σ gelu).
        proj = st.to_torch(t["mm_projector.proj.2.weight"]).float()
        self.assertTrue(torch.all(proj[:17] == proj[:17, :1]))
        self.assertTrue(torch.all(proj[0] > 0))

    def test_kimi_k3_mxfp4_experts_dequantize(self):
        t = self.tensors["kimi_k3"]
        name = "language_model.model.layers.2.block_sparse_moe.experts.3.w3"
        w = formats.dequantize_mxfp4_compressed_tensors(st.to_torch(t[name + ".weight_packed"]),
                                                        st.to_torch(t[name + ".weight_scale"]))
        self.assertEqual(list(w.shape), [64, 64])
        rms = w.pow(2).mean().sqrt().item()
        self.assertAlmostEqual(rms, 1 / 8, delta=0.2 / 8)  # N(0, 1/64) through 4-bit rounding

    def test_tokenizers_and_generation_config(self):
        ds = self.dirs["deepseek_v32"]
        tok = json.loads(read_text(os.path.join(ds, "tokenizer.json")))
        ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok["added_tokens"]]
        self.assertEqual(max(ids) + 1, 512)
        for arch in ("kimi_linear", "kimi_k3"):
            lines = read_text(os.path.join(self.dirs[arch], "tiktoken.model")).split("\n")
            ranks = len([line for line in lines if line.strip()])
            vocab = self.configs[arch].get("text_config", self.configs[arch])["vocab_size"]
            self.assertEqual(ranks + 256, vocab)
        for arch in make_tiny.ARCHS:
            gen = json.loads(read_text(os.path.join(self.dirs[arch], "generation_config.json")))
            text = self.configs[arch].get("text_config", self.configs[arch])
            self.assertEqual(gen["eos_token_id"], text["eos_token_id"])

    def test_shard_bytes_shards_any_arch(self):
        with tempfile.TemporaryDirectory() as out:
            make_tiny.make_tiny("kimi_linear", out, seed=3, shard_bytes=1 << 20)
            self.assertTrue(os.path.exists(os.path.join(out, st.INDEX_FILE_NAME)))
            self.assertEqual({n: r.data for n, r in load_all(out).items()},
                             {n: r.data for n, r in self.tensors["kimi_linear"].items()})


if __name__ == "__main__":
    unittest.main()
