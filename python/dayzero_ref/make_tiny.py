"""Tiny random checkpoints in exactly the published layout (docs/models.md §7, §8).

    /usr/bin/python3 -m dayzero_ref.make_tiny ARCH OUTDIR --seed N [--shard-bytes B]
        [--plain [--set FIELD=JSON ...]]

ARCH is deepseek_v32, kimi_linear, kimi_k3 or dayzero_hybrid. OUTDIR receives config.json
(published field names and nesting), generation_config.json, the tokenizer files, and the
weights: model.safetensors, or shards plus model.safetensors.index.json (kimi_k3 by default, any
arch with --shard-bytes); for kimi_k3 also preprocessor_config.json (the image processor's config).

Weights (docs/models.md §8), N(mean, variance): projections N(0, 1/in); norm weights 1 + N(0, 0.1); router
bias N(0, 0.5); embeddings N(0, 1); KDA A_log spread evenly over [0, ln 16] across heads and dt_bias
uniform over [-3, 3]. Each tensor draws from its own generator seeded by (seed, name), so the bytes of
a tensor do not depend on which other tensors exist. Quantized tensors go through the bit-exact
emulation in formats.py (FP8 128x128 blocks for deepseek_v32, compressed-tensors MXFP4 for the K3
routed experts).

The weights are then reshaped for decisive tests (docs/models.md §8.1): a constant and a coded part of
the embedding, saturated code-reading routers with spread biases (Golomb-ruler marks for the grouped
deepseek_v32 routing), for deepseek_v32 an indexer that ranks marked tokens by recency, small sublayer
outputs and a bigram-like lm_head (details and numbers in dayzero_ref/decisive_v32.py and
dayzero_ref/decisive_kimi.py; `--plain` skips this).

Choices not pinned by docs/models.md §8 (also in the report that introduced this file):
- The Kimi tokenizer has 256 special ids after its ranks, so vocab 512 cannot hold a BPE with merges;
  the Kimi tiny models use 512 ranks + 256 specials = vocab_size 768.
- KDA low-rank gates have rank head_dim (32), as in the published modeling code, not 16.
- kimi_k3-tiny has a tiny K3 vision tower (top-level vision_config, K3 field names: D 64, 2 blocks,
  2 heads of 64, MLP 128, an 8x8 position table, PatchMergerMLPV2 to the text width) and a
  preprocessor_config.json (in_patch_limit 96, at most 16 patches a side, the K3 chessboard
  background); the vision tensors are plain draws (the conv N(0, 1/588), pos_emb 0.3·N(0, 1)),
  outside the decisive structure, so the text weights are those of a checkpoint without them.
"""

import argparse
import json
import math
import os
import zlib
from collections import namedtuple

import torch

from dayzero_ref import (decisive_hybrid, decisive_kimi, decisive_v32, formats, safetensors_io,
                         tokenizer_gen, vision)

ARCHS = ("deepseek_v32", "kimi_linear", "kimi_k3", "dayzero_hybrid")

# One stored tensor: `kind` says how it is drawn, `dtype` the published safetensors tag.
# kind: "linear" (logical [out, in]; fp8 → F8_E4M3 + weight_scale_inv, mxfp4 → weight_packed +
# weight_scale), "norm", "embed", "bias" (router correction bias), "small" (N(0, 0.1): LayerNorm bias),
# "conv" (N(0, 1/fan_in), fan_in = all but the first dim), "pos_emb" (0.3·N(0, 1)), "a_log",
# "dt_bias".
Entry = namedtuple("Entry", "name shape kind dtype")

KIMI_NUM_RANKS = 512
DEFAULT_K3_SHARD_BYTES = 512 * 1024


# ---------------------------------------------------------------- configs (docs/models.md §8 table)

def deepseek_v32_config():
    return {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "vocab_size": 512, "hidden_size": 256, "intermediate_size": 512,
        "moe_intermediate_size": 128, "num_hidden_layers": 4, "num_nextn_predict_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 128, "kv_lora_rank": 256,
        "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
        "n_routed_experts": 16, "n_shared_experts": 1, "num_experts_per_tok": 4,
        "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "index_n_heads": 8, "index_head_dim": 128, "index_topk": 16,
        "hidden_act": "silu", "attention_bias": False, "attention_dropout": 0.0,
        "max_position_embeddings": 163840, "rope_theta": 10000, "rms_norm_eps": 1e-06,
        "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,
                         "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                "weight_block_size": [128, 128], "scale_fmt": "ue8m0"},
        "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1,
        "torch_dtype": "bfloat16", "use_cache": True,
    }


def _kimi_common(num_layers, kda_layers, full_attn_layers):
    return {
        "vocab_size": KIMI_NUM_RANKS + tokenizer_gen.KIMI_NUM_RESERVED_SPECIAL_TOKENS,
        "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": num_layers,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "mla_use_nope": True, "moe_router_activation_func": "sigmoid", "moe_renormalize": True,
        "use_grouped_topk": True, "num_expert_group": 1, "topk_group": 1,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "rms_norm_eps": 1e-05,
        "num_nextn_predict_layers": 0, "tie_word_embeddings": False,
        "linear_attn_config": {"kda_layers": kda_layers, "full_attn_layers": full_attn_layers,
                               "num_heads": 4, "head_dim": 32, "short_conv_kernel_size": 4},
        "bos_token_id": KIMI_NUM_RANKS, "eos_token_id": KIMI_NUM_RANKS + 2,
    }


def kimi_linear_config():
    c = {"architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear"}
    c.update(_kimi_common(6, [1, 2, 3, 5], [4, 6]))
    c.update({
        "q_lora_rank": None, "head_dim": 72, "num_experts": 8, "num_experts_per_token": 2,
        "num_shared_experts": 1, "moe_intermediate_size": 64, "routed_scaling_factor": 2.446,
        "hidden_act": "silu", "rope_theta": 10000.0, "rope_scaling": None,
        "model_max_length": 1048576, "pad_token_id": KIMI_NUM_RANKS + 255, "dtype": "bfloat16",
    })
    return c


def kimi_k3_config():
    text = {"model_type": "kimi_linear"}
    text.update(_kimi_common(5, [1, 2, 3], [4, 5]))
    text["linear_attn_config"].update({"use_full_rank_gate": True, "gate_lower_bound": -5.0})
    text.update({
        "q_lora_rank": 64, "mla_use_output_gate": True, "max_position_embeddings": 1048576,
        "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
        "moe_intermediate_size": 64, "routed_expert_hidden_size": 64, "latent_moe_use_norm": True,
        "topk_method": "noaux_tc", "routed_scaling_factor": 1.0, "hidden_act": "situ",
        "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "attn_res_block_size": 2,
        "quantization_config": mxfp4_experts_config(("re:.*vision_tower.*", "re:.*mm_projector.*")),
    })
    return {
        "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
        "text_config": text, "media_placeholder_token_id": KIMI_NUM_RANKS + 21,
        "pad_token_id": 0, "eos_token_id": KIMI_NUM_RANKS + 2, "tie_word_embeddings": False,
        "vision_config": k3_vision_config(text["hidden_size"]),
    }


def k3_vision_config(text_hidden_size):
    """The K3 vision_config fields (published names and options) at tiny sizes."""
    return {
        "patch_size": 14, "vt_hidden_size": 64, "vt_num_hidden_layers": 2,
        "vt_num_attention_heads": 2, "qkv_hidden_size": 128, "vt_intermediate_size": 128,
        "init_pos_emb_height": 8, "init_pos_emb_width": 8, "init_pos_emb_time": 4,
        "pos_emb_type": "divided_fixed", "pos_emb_interpolation_mode": "bilinear",
        "norm_type": "rmsnorm", "attn_bias": False, "linear_bias": False,
        "patch_embed_proj_bias": False, "activation_func": "gelu_pytorch_tanh", "mlp_type": "mlp2",
        "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool",
        "mm_projector_type": "patchmergerv2", "projector_hidden_act": "gelu", "mm_hidden_size": 64,
        "text_hidden_size": text_hidden_size, "projector_ln_eps": 1e-05,
    }


# The K3 processor's media_proc_cfg (published field names), at the tiny tower's sizes.
K3_TINY_PREPROCESSOR = {"media_proc_cfg": {
    "patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 96, "patch_limit_on_one_side": 16,
    "fixed_output_tokens": None, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "transparent_bg_config": {"pattern": "chessboard", "chessboard_square_size": 8,
                              "chessboard_square_on_top_left": True,
                              "chessboard_white_value": 255, "chessboard_gray_value": 180},
    "transparent_bg_fill_stage": "after_resize"}}


def mxfp4_experts_config(extra_ignore=()):
    """compressed-tensors `mxfp4-pack-quantized` for the routed experts only (Kimi-K3's layout):
    everything but `experts.*` is listed in `ignore`."""
    return {
        "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
        "quantization_status": "compressed", "kv_cache_scheme": None,
        "config_groups": {"group_0": {
            "targets": ["Linear"], "input_activations": None, "output_activations": None,
            "weights": {"num_bits": 4, "type": "float", "group_size": 32, "strategy": "group",
                        "symmetric": True, "dynamic": False, "actorder": None,
                        "block_structure": None, "observer": "minmax", "observer_kwargs": {}}}},
        "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", r"re:.*mlp\.(gate|up|down)_proj$",
                   r"re:.*routed_expert_(down|up)_proj$", "re:.*_res_proj$", "re:.*lm_head$",
                   *extra_ignore],
    }


def dayzero_hybrid_config():
    """KDA layers 1, 3 and RoPE MLA + DSA layers 2, 4 (1-based); kv_lora_rank 128 so the FP8
    cache works; index_topk 8 so ~40-token prompts are sparse; latent MXFP4 MoE; AttnRes; one MTP
    layer (layer 4, 0-based: MLA + DSA + latent MoE, plain residual)."""
    c = {"architectures": ["DayzeroHybridForCausalLM"], "model_type": "dayzero_hybrid"}
    c.update(_kimi_common(4, [1, 3], [2, 4]))
    del c["mla_use_nope"]
    c.update({
        "kv_lora_rank": 128, "q_lora_rank": 64, "mla_use_output_gate": True,
        "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 4096,
        "index_n_heads": 4, "index_head_dim": 128, "index_topk": 8,
        "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 1,
        "moe_intermediate_size": 64, "routed_expert_hidden_size": 64, "latent_moe_use_norm": True,
        "routed_scaling_factor": 2.0, "hidden_act": "silu", "attn_res_block_size": 2,
        "num_nextn_predict_layers": 1, "quantization_config": mxfp4_experts_config(),
    })
    return c


CONFIGS = {"deepseek_v32": deepseek_v32_config, "kimi_linear": kimi_linear_config,
           "kimi_k3": kimi_k3_config, "dayzero_hybrid": dayzero_hybrid_config}


# ---------------------------------------------------------------- tensor layouts (docs/models.md §7)

def mtp_entries(p, d, v):
    """The MTP layer's own tensors under prefix p (DeepSeek's layout, shared by dayzero_hybrid)."""
    return [Entry(p + "enorm.weight", (d,), "norm", "BF16"),
            Entry(p + "hnorm.weight", (d,), "norm", "BF16"),
            Entry(p + "eh_proj.weight", (d, 2 * d), "linear", "BF16"),
            Entry(p + "shared_head.norm.weight", (d,), "norm", "BF16"),
            Entry(p + "embed_tokens.weight", (v, d), "embed", "BF16"),
            Entry(p + "shared_head.head.weight", (v, d), "linear", "BF16")]


def deepseek_v32_layout(c):
    d, h, v = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    rq, rkv, nope, rope, vd = (c["q_lora_rank"], c["kv_lora_rank"], c["qk_nope_head_dim"],
                               c["qk_rope_head_dim"], c["v_head_dim"])
    fp8 = "F8_E4M3"
    out = [Entry("model.embed_tokens.weight", (v, d), "embed", "BF16"),
           Entry("model.norm.weight", (d,), "norm", "BF16"),
           Entry("lm_head.weight", (v, d), "linear", "BF16")]
    num_layers = c["num_hidden_layers"] + c["num_nextn_predict_layers"]
    for i in range(num_layers):
        p = f"model.layers.{i}."
        lin = lambda name, o, n, dtype=fp8: out.append(Entry(p + name + ".weight", (o, n), "linear", dtype))  # noqa: E731
        out += [Entry(p + "input_layernorm.weight", (d,), "norm", "BF16"),
                Entry(p + "post_attention_layernorm.weight", (d,), "norm", "BF16")]
        lin("self_attn.q_a_proj", rq, d)
        out.append(Entry(p + "self_attn.q_a_layernorm.weight", (rq,), "norm", "BF16"))
        lin("self_attn.q_b_proj", h * (nope + rope), rq)
        lin("self_attn.kv_a_proj_with_mqa", rkv + rope, d)
        out.append(Entry(p + "self_attn.kv_a_layernorm.weight", (rkv,), "norm", "BF16"))
        lin("self_attn.kv_b_proj", h * (nope + vd), rkv)
        lin("self_attn.o_proj", d, h * vd)
        ni, di = c["index_n_heads"], c["index_head_dim"]
        lin("self_attn.indexer.wq_b", ni * di, rq)
        lin("self_attn.indexer.wk", di, d)
        out += [Entry(p + "self_attn.indexer.k_norm.weight", (di,), "norm", "F32"),
                Entry(p + "self_attn.indexer.k_norm.bias", (di,), "small", "F32")]
        lin("self_attn.indexer.weights_proj", ni, d, "BF16")
        if i < c["first_k_dense_replace"] or i % c["moe_layer_freq"]:
            inter = c["intermediate_size"]
            lin("mlp.gate_proj", inter, d)
            lin("mlp.up_proj", inter, d)
            lin("mlp.down_proj", d, inter)
        else:
            e_num, mi = c["n_routed_experts"], c["moe_intermediate_size"]
            lin("mlp.gate", e_num, d, "BF16")
            out.append(Entry(p + "mlp.gate.e_score_correction_bias", (e_num,), "bias", "F32"))
            for e in range(e_num):
                lin(f"mlp.experts.{e}.gate_proj", mi, d)
                lin(f"mlp.experts.{e}.up_proj", mi, d)
                lin(f"mlp.experts.{e}.down_proj", d, mi)
            si = mi * c["n_shared_experts"]
            lin("mlp.shared_experts.gate_proj", si, d)
            lin("mlp.shared_experts.up_proj", si, d)
            lin("mlp.shared_experts.down_proj", d, si)
        if i >= c["num_hidden_layers"]:  # MTP head; eh_proj dtype is (unverified), BF16 here
            out += mtp_entries(p, d, v)
    return out


def kimi_layout(c, prefix=""):
    d, h, v = c["hidden_size"], c["num_attention_heads"], c["vocab_size"]
    la = c["linear_attn_config"]
    kh, hd, width = la["num_heads"], la["head_dim"], la["num_heads"] * la["head_dim"]
    bounded = "gate_lower_bound" in la
    small = "F32" if bounded else "BF16"  # K3 ships conv and o_norm in F32 (docs/models.md §7.3.3)
    mxfp4 = "quantization_config" in c
    kda = {i - 1 for i in la["kda_layers"]}
    pm = prefix + "model."
    out = [Entry(pm + "embed_tokens.weight", (v, d), "embed", "BF16"),
           Entry(pm + "norm.weight", (d,), "norm", "BF16"),
           Entry(prefix + "lm_head.weight", (v, d), "linear", "BF16")]
    if c.get("attn_res_block_size"):
        out += [Entry(pm + "output_attn_res_proj.weight", (1, d), "linear", "BF16"),
                Entry(pm + "output_attn_res_norm.weight", (d,), "norm", "BF16")]
    for i in range(c["num_hidden_layers"] + c.get("num_nextn_predict_layers", 0)):
        p = f"{pm}layers.{i}."
        lin = lambda name, o, n, dtype="BF16": out.append(Entry(p + name + ".weight", (o, n), "linear", dtype))  # noqa: E731
        out += [Entry(p + "input_layernorm.weight", (d,), "norm", "BF16"),
                Entry(p + "post_attention_layernorm.weight", (d,), "norm", "BF16")]
        mtp = i >= c["num_hidden_layers"]  # dayzero_hybrid's MTP layer: MLA + DSA, no AttnRes
        if mtp:
            out += mtp_entries(p, d, v)
        if c.get("attn_res_block_size") and not mtp:
            lin("self_attention_res_proj", 1, d)
            out.append(Entry(p + "self_attention_res_norm.weight", (d,), "norm", "BF16"))
            lin("mlp_res_proj", 1, d)
            out.append(Entry(p + "mlp_res_norm.weight", (d,), "norm", "BF16"))
        if i in kda and not mtp:
            for name in "qkv":
                lin(f"self_attn.{name}_proj", width, d)
                out.append(Entry(p + f"self_attn.{name}_conv1d.weight",
                                 (width, 1, la["short_conv_kernel_size"]), "conv", small))
            lin("self_attn.f_a_proj", hd, d)
            lin("self_attn.f_b_proj", width, hd)
            lin("self_attn.b_proj", kh, d)
            out += [Entry(p + "self_attn.A_log", (hd,) if bounded else (1, 1, kh, 1), "a_log", "F32"),
                    Entry(p + "self_attn.dt_bias", (width,), "dt_bias", "F32")]
            if la.get("use_full_rank_gate"):
                lin("self_attn.g_proj", width, d)
            else:
                lin("self_attn.g_a_proj", hd, d)
                lin("self_attn.g_b_proj", width, hd)
            out.append(Entry(p + "self_attn.o_norm.weight", (hd,), "norm", small))
            lin("self_attn.o_proj", d, width)
        else:
            qk = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
            if c.get("q_lora_rank"):
                lin("self_attn.q_a_proj", c["q_lora_rank"], d)
                out.append(Entry(p + "self_attn.q_a_layernorm.weight", (c["q_lora_rank"],), "norm",
                                 "BF16"))
                lin("self_attn.q_b_proj", h * qk, c["q_lora_rank"])
            else:
                lin("self_attn.q_proj", h * qk, d)
            lin("self_attn.kv_a_proj_with_mqa", c["kv_lora_rank"] + c["qk_rope_head_dim"], d)
            out.append(Entry(p + "self_attn.kv_a_layernorm.weight", (c["kv_lora_rank"],), "norm",
                             "BF16"))
            lin("self_attn.kv_b_proj", h * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"])
            if c.get("mla_use_output_gate"):
                lin("self_attn.g_proj", h * c["v_head_dim"], d)
            lin("self_attn.o_proj", d, h * c["v_head_dim"])
            if "index_topk" in c:  # dayzero_hybrid: the DSA indexer, as deepseek_v32
                ni, di = c["index_n_heads"], c["index_head_dim"]
                lin("self_attn.indexer.wq_b", ni * di, c["q_lora_rank"])
                lin("self_attn.indexer.wk", di, d)
                out += [Entry(p + "self_attn.indexer.k_norm.weight", (di,), "norm", "F32"),
                        Entry(p + "self_attn.indexer.k_norm.bias", (di,), "small", "F32")]
                lin("self_attn.indexer.weights_proj", ni, d)
        if i < c["first_k_dense_replace"] or i % c["moe_layer_freq"]:
            lin("mlp.gate_proj", c["intermediate_size"], d)
            lin("mlp.up_proj", c["intermediate_size"], d)
            lin("mlp.down_proj", d, c["intermediate_size"])
            continue
        m, e_num, mi = "block_sparse_moe.", c["num_experts"], c["moe_intermediate_size"]
        lin(m + "gate", e_num, d)
        out.append(Entry(p + m + "gate.e_score_correction_bias", (e_num,), "bias", "F32"))
        width_e = d
        if c.get("routed_expert_hidden_size"):
            width_e = c["routed_expert_hidden_size"]
            lin(m + "routed_expert_down_proj", width_e, d)
            if c.get("latent_moe_use_norm"):
                out.append(Entry(p + m + "routed_expert_norm.weight", (width_e,), "norm", "BF16"))
            lin(m + "routed_expert_up_proj", d, width_e)
        expert_dtype = "MXFP4" if mxfp4 else "BF16"
        for e in range(e_num):
            lin(f"{m}experts.{e}.w1", mi, width_e, expert_dtype)
            lin(f"{m}experts.{e}.w3", mi, width_e, expert_dtype)
            lin(f"{m}experts.{e}.w2", width_e, mi, expert_dtype)
        si = mi * c["num_shared_experts"]
        lin(m + "shared_experts.gate_proj", si, d)
        lin(m + "shared_experts.up_proj", si, d)
        lin(m + "shared_experts.down_proj", d, si)
    return out


def vision_layout(vc):
    """Kimi-K3's vision tower and PatchMergerMLPV2 projector: the reference's table of names and
    shapes (vision.expected_shapes), all BF16, each drawn by its kind."""
    def kind(name):
        if name.endswith("patch_embed.proj.weight"):
            return "conv"
        if name.endswith("pos_emb.weight"):
            return "pos_emb"
        return "norm" if "norm" in name.rsplit(".", 2)[-2] else "linear"
    return [Entry(name, shape, kind(name), "BF16")
            for name, shape in vision.expected_shapes(vc).items()]


def layout(arch, config):
    """The logical tensors of a tiny checkpoint, in generation order."""
    if arch == "deepseek_v32":
        return deepseek_v32_layout(config)
    if arch in ("kimi_linear", "dayzero_hybrid"):
        return kimi_layout(config)
    return kimi_layout(config["text_config"], prefix="language_model.")


# ---------------------------------------------------------------- weights

def _generator(seed, name):
    g = torch.Generator()
    g.manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) & 0x7FFFFFFFFFFFFFFF)
    return g


def _draw(entry, seed, kda_heads):
    g = _generator(seed, entry.name)
    shape = entry.shape
    if entry.kind == "linear":
        return torch.randn(shape, generator=g) * math.sqrt(1.0 / shape[-1])
    if entry.kind == "conv":
        return torch.randn(shape, generator=g) * math.sqrt(1.0 / math.prod(shape[1:]))
    if entry.kind == "pos_emb":
        return torch.randn(shape, generator=g) * 0.3
    if entry.kind == "norm":
        return 1.0 + torch.randn(shape, generator=g) * math.sqrt(0.1)
    if entry.kind == "embed":
        return torch.randn(shape, generator=g)
    if entry.kind == "bias":
        return torch.randn(shape, generator=g) * math.sqrt(0.5)
    if entry.kind == "small":
        return torch.randn(shape, generator=g) * math.sqrt(0.1)
    if entry.kind == "dt_bias":
        return torch.rand(shape, generator=g) * 6.0 - 3.0
    if entry.kind == "a_log":
        # Spread evenly over [0, ln 16] across the heads; K3's padded form keeps the tail zero.
        values = torch.zeros(math.prod(shape))
        values[:kda_heads] = torch.linspace(0.0, math.log(16.0), kda_heads)
        return values.reshape(shape)
    raise ValueError(f"unknown kind {entry.kind}")


def weights(arch, config, seed, decisive=True):
    """name -> RawTensor for every stored tensor of the tiny checkpoint. `decisive`: reshape the
    draws so that every discrete decision has a clear margin (docs/models.md §8.1, see
    dayzero_ref.decisive_v32 and dayzero_ref.decisive_kimi)."""
    text = config.get("text_config", config)
    kda_heads = text.get("linear_attn_config", {}).get("num_heads")
    entries = layout(arch, config)
    logical = {e.name: _draw(e, seed, kda_heads) for e in entries}
    if arch == "deepseek_v32" and decisive:
        decisive_v32.shape_weights(config, logical, seed)
    elif arch == "dayzero_hybrid" and decisive:
        decisive_hybrid.shape_weights(config, logical, seed, KIMI_NUM_RANKS)
    elif decisive:
        prefix = "language_model." if arch == "kimi_k3" else ""
        decisive_kimi.shape_weights(text, logical, seed, prefix, KIMI_NUM_RANKS)
    if arch == "kimi_k3" and config.get("vision_config"):  # drawn after (and outside) the shaping
        vision = vision_layout(config["vision_config"])
        logical.update({e.name: _draw(e, seed, kda_heads) for e in vision})
        entries = entries + vision
        if decisive:
            decisive_kimi.shape_projector(text, logical, seed, "language_model.")
    tensors = {}
    for e in entries:
        w = logical[e.name]
        base = e.name[:-len(".weight")] if e.name.endswith(".weight") else e.name
        if e.dtype == "F8_E4M3":
            codes, scale_inv = formats.quantize_fp8_block(w)
            tensors[e.name] = safetensors_io.raw(codes, "F8_E4M3")
            tensors[base + ".weight_scale_inv"] = safetensors_io.raw(scale_inv.float())
        elif e.dtype == "MXFP4":
            packed, scale = formats.quantize_mxfp4_compressed_tensors(w)
            tensors[base + ".weight_packed"] = safetensors_io.raw(packed.to(torch.uint8))
            tensors[base + ".weight_scale"] = safetensors_io.raw(scale.to(torch.uint8))
        elif e.dtype == "BF16":
            tensors[e.name] = safetensors_io.raw(w.to(torch.bfloat16))
        else:
            tensors[e.name] = safetensors_io.raw(w.float())
    return tensors


# ---------------------------------------------------------------- files

def generation_config(config):
    text = config.get("text_config", config)
    return {"_from_model_config": True, "bos_token_id": text["bos_token_id"],
            "eos_token_id": text["eos_token_id"], "do_sample": True, "temperature": 0.6,
            "top_p": 0.95, "transformers_version": "4.46.3"}


def make_tiny(arch, out_dir, seed=0, shard_bytes=None, decisive=True, overrides=None):
    """Writes the tiny `arch` checkpoint into out_dir; returns the config dict. decisive=False gives
    the plain §8 draws (no margins by construction). overrides: config fields replaced before the
    weights are drawn (plain draws only: the decisive structure is worked out for the tiny sizes),
    e.g. a larger model for a benchmark."""
    if arch not in CONFIGS:
        raise ValueError(f"unknown arch {arch!r} (supported: {', '.join(ARCHS)})")
    config = CONFIGS[arch]()
    if overrides:
        if decisive:
            raise ValueError("config overrides need --plain")
        unknown = sorted(set(overrides) - set(config))
        if unknown:
            raise ValueError(f"--set: {', '.join(unknown)} not in the {arch} config")
        config.update(overrides)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(generation_config(config), f, indent=2)
        f.write("\n")
    if arch == "deepseek_v32":
        tokenizer_gen.write_hf_tokenizer(out_dir, config["vocab_size"], seed=seed)
    else:
        # K3 names special offset 18 "<|media_begin|>" (its image prompt), Kimi-K2 "<|media_start|>".
        media_begin = "<|media_begin|>" if arch == "kimi_k3" else "<|media_start|>"
        tokenizer_gen.write_tiktoken_tokenizer(out_dir, KIMI_NUM_RANKS, seed=seed,
                                               media_begin=media_begin)
    if arch == "kimi_k3" and config.get("vision_config"):
        with open(os.path.join(out_dir, "preprocessor_config.json"), "w", encoding="utf-8") as f:
            json.dump(K3_TINY_PREPROCESSOR, f, indent=2)
            f.write("\n")
    tensors = weights(arch, config, seed, decisive)
    metadata = {"format": "pt"}
    if shard_bytes is None and arch == "kimi_k3":
        shard_bytes = DEFAULT_K3_SHARD_BYTES
    if shard_bytes:
        safetensors_io.save_sharded(out_dir, tensors, shard_bytes, metadata)
    else:
        safetensors_io.save_file(os.path.join(out_dir, "model.safetensors"), tensors, metadata)
    return config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("arch", choices=ARCHS)
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shard-bytes", type=int, default=None,
                        help="shard the weights at this many bytes (default: kimi_k3 512 KiB, "
                             "others one file)")
    parser.add_argument("--plain", action="store_true",
                        help="plain random draws, without the decisive structure")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="replace a config field (with --plain), e.g. --set hidden_size=2048")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        field, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--set {item}: expected FIELD=JSON")
        overrides[field] = json.loads(value)
    make_tiny(args.arch, args.out_dir, args.seed, args.shard_bytes, decisive=not args.plain,
              overrides=overrides)


if __name__ == "__main__":
    main()
