"""Pieces shared by the PyTorch references (deepseek_v32.py, kimi.py): checkpoint loading, DeepSeek-style
sigmoid routing (docs/models.md §6.1–6.2) and the numerics helpers of the issue-3 policy (BF16 rounding points,
with the optional noise the margin check injects there)."""

import argparse
import json
import math
import os

import torch

from dayzero_ref import formats, safetensors_io

GLOBAL_LAYER = -1


# ---------------------------------------------------------------- checkpoint

def load_config(model_dir):
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        return json.load(f)


def weight_files(model_dir):
    index = os.path.join(model_dir, safetensors_io.INDEX_FILE_NAME)
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            weight_map = json.load(f)["weight_map"]
        return [os.path.join(model_dir, name) for name in sorted(set(weight_map.values()))]
    single = os.path.join(model_dir, "model.safetensors")
    if not os.path.exists(single):
        raise FileNotFoundError(f"{model_dir}: neither model.safetensors nor "
                                f"{safetensors_io.INDEX_FILE_NAME}")
    return [single]


def load_tensors(model_dir, config, mxfp4_names=None):
    """name -> FP32 tensor for every weight of the checkpoint. FP8 block weights are dequantized
    exactly with their weight_scale_inv; compressed-tensors MXFP4 pairs `<m>.weight_packed` +
    `<m>.weight_scale` become `<m>.weight`, decoded exactly (E2M1 value · 2^(e−127), docs/formats.md §3.4).
    The scale tensors are dropped from the result. `config`: the (text) config holding
    quantization_config. `mxfp4_names`: a set that receives the names of the MXFP4 weights."""
    raw = {}
    for path in weight_files(model_dir):
        raw.update(safetensors_io.load_file(path))
    quant = config.get("quantization_config") or {}
    block = quant.get("weight_block_size", [128, 128])
    if block[0] != block[1]:
        raise ValueError(f"weight_block_size {block}: only square blocks are supported")
    out = {}
    for name, r in raw.items():
        if name.endswith("weight_scale_inv") or name.endswith(".weight_scale"):
            continue
        t = safetensors_io.to_torch(r)
        if name.endswith(".weight_packed"):
            base = name[:-len("_packed")]
            scale_name = base + "_scale"
            if r.dtype != "U8" or scale_name not in raw or raw[scale_name].dtype != "U8":
                raise ValueError(f"{name}: MXFP4 needs U8 weight_packed and U8 {scale_name}")
            scale = safetensors_io.to_torch(raw[scale_name])
            if tuple(scale.shape) != (t.shape[0], t.shape[1] * 2 // formats.MX_BLOCK):
                raise ValueError(f"{scale_name}: shape {list(scale.shape)} does not match "
                                 f"{name} {list(t.shape)}")
            out[base] = formats.dequantize_mxfp4_compressed_tensors(t, scale).float()
            if mxfp4_names is not None:
                mxfp4_names.add(base)
        elif r.dtype == "F8_E4M3":
            scale_name = name + "_scale_inv"
            if scale_name not in raw:
                raise ValueError(f"{name}: F8_E4M3 weight without {scale_name}")
            scale = safetensors_io.to_torch(raw[scale_name]).float()
            want = (-(-t.shape[0] // block[0]), -(-t.shape[1] // block[1]))
            if tuple(scale.shape) != want:
                raise ValueError(f"{scale_name}: shape {list(scale.shape)}, expected {list(want)}")
            out[name] = formats.dequantize_fp8_block(t, scale, block[0])
        elif r.dtype in ("BF16", "F16", "F32"):
            out[name] = t.float()
        else:
            raise ValueError(f"{name}: unsupported dtype {r.dtype}")
    return out


# ---------------------------------------------------------------- routing (docs/models.md §6.1)

def route_grouped_sigmoid(scores, bias, n_group, topk_group, top_k, norm_topk_prob,
                          routed_scaling_factor, renorm_eps=0.0):
    """docs/models.md §6.1 on σ(logits) `scores` [T, E]: (ids int64 [T, k] in rank order, weights
    float32 [T, k]). Ties go to the lower group id and the lower expert id."""
    num_tokens, num_experts = scores.shape
    biased = scores + bias[None, :]
    if n_group > 1:
        per_group = num_experts // n_group
        grouped = biased.reshape(num_tokens, n_group, per_group)
        top2 = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2]
        group_scores = top2[..., 0] + top2[..., 1]
        groups = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices
        keep = torch.zeros(num_tokens, n_group, dtype=torch.bool)
        keep.scatter_(1, groups[:, :topk_group], True)
        biased = biased.masked_fill(~keep.repeat_interleave(per_group, dim=1), -math.inf)
    ids = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, :top_k]
    return ids, routing_weights(scores, ids, norm_topk_prob, routed_scaling_factor, renorm_eps)


def routing_weights(scores, ids, norm_topk_prob, routed_scaling_factor, renorm_eps=0.0):
    """s_e / (Σ s + renorm_eps) (if norm_topk_prob) · routed_scaling_factor, FP32. DeepSeek: eps 0;
    Kimi (moe_renormalize): 1e-20 (docs/models.md §6.2)."""
    weights = scores.gather(1, ids)
    if norm_topk_prob:
        denominator = weights.sum(dim=-1, keepdim=True)
        if renorm_eps:
            denominator = denominator + torch.tensor(renorm_eps, dtype=torch.float32)
        weights = weights / denominator
    return weights * torch.tensor(routed_scaling_factor, dtype=torch.float32)


# ---------------------------------------------------------------- numerics

class ReferenceBase:
    """The rounding points of the numerics policy. `noise` (set by dayzero_ref.margins): (relative
    sigma, torch.Generator) or None; multiplies every BF16-rounded value by (1 + sigma·N(0, 1))."""

    eps = 1e-6
    noise = None
    w = None
    config = None
    # "mxint8": the MXFP4 weights (mxfp4_names, filled by load_tensors) multiply activations
    # through formats.mxint8_fake_quant, as the engine's --mxfp4-activations mxint8.
    mxfp4_activations = "bf16"
    mxfp4_names = frozenset()

    def _bf16(self, x):
        y = formats.round_to_bf16(x)
        if self.noise is not None:
            rel, gen = self.noise
            y = y * (1.0 + rel * torch.randn(y.shape, generator=gen))
        return y

    def _rms_norm(self, x, weight, eps=None):
        """RMSNorm in FP32, the product with the weight rounded once to BF16."""
        x = x.float()
        eps = self.eps if eps is None else eps
        normed = x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
        return self._bf16(weight * normed)

    def _linear(self, x, name):
        if self.mxfp4_activations == "mxint8" and name in self.mxfp4_names:
            x = formats.mxint8_fake_quant(x)
        return x @ self.w[name].t()

    @staticmethod
    def _tap(taps, layer_id, name, tensor):
        if taps is not None:
            taps[(layer_id, name)] = tensor.detach().to(torch.float32).clone()

    def _check_ids(self, token_ids, vocab=None):
        vocab = self.config["vocab_size"] if vocab is None else vocab
        ids = [int(t) for t in token_ids]
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} outside [0, {vocab})")
        return torch.tensor(ids, dtype=torch.int64)


def parse_token_ids(text):
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--token-ids {text!r}: {e}") from e
    if not ids:
        raise argparse.ArgumentTypeError("--token-ids: empty list")
    return ids
