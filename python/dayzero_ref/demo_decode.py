"""Incremental (token-by-token) decode of the demo model for the PyTorch peer benchmark
(bench/peer_demo.py): the same weights and modules as demo_model.DemoModel in "sparse" mode, with
the per-sequence state a serving engine keeps instead of recomputing the prefix:

- KDA layers: the recurrent state S [H, d_v, d_k] (V-first, kimi.kda_recurrent_naive's update in
  FP32) and the last K−1 pre-activation inputs of the q/k/v short convolutions;
- MLA layers: the latent cache (normalised c_kv [t, r_kv] and the rotated shared k_pe [t, d_r]) and
  the indexer's key cache [t, d_I]; attention runs in the absorbed form (q_nope through W_UK, the
  latent output through W_UV) over the indexer's top-k cached positions (all of them while there
  are ≤ index_topk);
- MoE: routing and the selected experts for the one new token (no padding to 256 rows);
- AttnRes: the per-token bank of block outputs, which is all that mixing needs.

Batch 1. `matmul` picks the GEMV path: "bf16" (weights cast to BF16 once, BF16 × BF16 → FP32 on
oneDNN, as DemoModel computes) or "fp32" (FP32 weights, Debian torch's generic BLAS). The KDA
recurrence, norms and softmaxes stay FP32. The incremental logits equal DemoModel's full-sequence
forward up to BF16 roundings (the chunked KDA and un-absorbed attention of the full form round at
different places): python/tests/test_demo_decode.py states the tolerance.
"""

import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dayzero_ref import demo_model
from dayzero_ref.ref_common import load_config, load_tensors

kDemoDir = Path(__file__).resolve().parents[2] / "models" / "demo"


def load_demo_model(model_dir=kDemoDir):
    """DemoModel with the shipped weights (MXFP4 experts decoded exactly), in eval mode."""
    model = demo_model.DemoModel(load_config(str(model_dir)))
    tensors = load_tensors(str(model_dir), model.config)
    state = model.state_dict()
    missing = [name for name in state if name not in tensors]
    if missing:
        raise ValueError(f"{model_dir}: checkpoint lacks {missing[:3]}")
    model.load_state_dict({name: tensors[name].float().reshape(state[name].shape) for name in state})
    return model.eval()


def _rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps))


def _rope_interleaved(x, cos, sin):
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def _rope_half(x, cos, sin):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class DemoDecoder:
    """decoder.reset(); logits = decoder.step(token_id) for each token in turn (prompt, then the
    generated ones); logits [vocab] FP32 for the next token."""

    def __init__(self, model, matmul="bf16"):
        if matmul not in ("bf16", "fp32"):
            raise ValueError(f"matmul must be 'bf16' or 'fp32', not {matmul!r}")
        self.model = model
        self.c = model.config
        self.eps = model.eps
        self.block = model.block
        self.inv_freq = model.inv_freq
        self.dtype = torch.bfloat16 if matmul == "bf16" else torch.float32
        self._w = {}
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, demo_model.Linear):
                    self._w[module] = module.weight.detach().to(self.dtype).contiguous()
            for layer in model.model.layers:
                if layer.is_kda:
                    continue
                attn = layer.self_attn
                up = attn.kv_b_proj.weight.detach().reshape(attn.heads, attn.dn + attn.dv, attn.rkv)
                attn.decode_w_uk = up[:, :attn.dn].to(self.dtype).contiguous()    # [H, d_n, r]
                attn.decode_w_uv = up[:, attn.dn:].to(self.dtype).contiguous()    # [H, d_v, r]
            for moe in model.moe_blocks():
                moe.decode_gate = moe.gate.weight.detach().to(self.dtype).contiguous()
        self.reset()

    # ------------------------------------------------------------ helpers

    def _lin(self, module, x):
        return F.linear(x.to(self.dtype), self._w[module]).float()

    def _mm(self, a, b):
        return torch.matmul(a.to(self.dtype), b.to(self.dtype)).float()

    def _mix(self, proj, norm, rows):
        cw = norm.weight * proj.weight[0]
        v = torch.stack(rows)                                     # [R, d]
        s = (v @ cw) * torch.rsqrt(v.pow(2).mean(-1) + self.eps)
        return (torch.softmax(s, dim=0)[:, None] * v).sum(0)

    def reset(self):
        """Forget the sequence: empty caches, zero recurrent states."""
        self.pos = 0
        self.state = []
        for layer in self.model.model.layers:
            if layer.is_kda:
                kda = layer.self_attn
                width = kda.heads * kda.dim
                taps = kda.q_conv1d.weight.shape[-1]
                self.state.append({
                    "conv": {n: torch.zeros(width, taps - 1) for n in "qkv"},
                    "S": torch.zeros(kda.heads, kda.dim, kda.dim)})
            else:
                mla = layer.self_attn
                self.state.append({"c_kv": torch.zeros(0, mla.rkv), "k_pe": torch.zeros(0, mla.dr),
                                   "idx_k": torch.zeros(0, mla.indexer.dim)})

    # ------------------------------------------------------------ blocks

    def _kda(self, kda, st, a):
        def conv(name):
            pre = self._lin(getattr(kda, f"{name}_proj"), a)      # [W]
            window = torch.cat([st["conv"][name], pre[:, None]], dim=1)   # [W, K]
            st["conv"][name] = window[:, 1:]
            w = getattr(kda, f"{name}_conv1d").weight[:, 0, :]    # [W, K], FP32
            return F.silu((w * window).sum(-1))

        shape = (kda.heads, kda.dim)
        q, k, v = conv("q").reshape(shape), conv("k").reshape(shape), conv("v").reshape(shape)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + demo_model.L2_NORM_EPS)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + demo_model.L2_NORM_EPS)
        f = (self._lin(kda.f_b_proj, self._lin(kda.f_a_proj, a)) + kda.dt_bias).reshape(shape)
        g = kda.lower_bound * torch.sigmoid(torch.exp(kda.A_log[:kda.heads])[:, None] * f)
        beta = torch.sigmoid(self._lin(kda.b_proj, a))           # [H]
        s = st["S"] * torch.exp(g)[:, None, :]                    # decay the key channels
        pred = torch.bmm(s, k[:, :, None])[..., 0]                # S k, [H, d_v]
        u = beta[:, None] * (v - pred)
        s = s + u[:, :, None] * k[:, None, :]
        st["S"] = s
        o = torch.bmm(s, (q * kda.dim ** -0.5)[:, :, None])[..., 0]
        z = self._lin(kda.g_b_proj, self._lin(kda.g_a_proj, a)).reshape(shape)
        y = _rms(o, kda.o_norm.weight, kda.o_norm.eps) * torch.sigmoid(z)
        return self._lin(kda.o_proj, y.reshape(-1))

    def _mla(self, mla, st, a, cos, sin):
        c_q = _rms(self._lin(mla.q_a_proj, a), mla.q_a_layernorm.weight, self.eps)
        q = self._lin(mla.q_b_proj, c_q).reshape(mla.heads, mla.dn + mla.dr)
        q_pe = _rope_interleaved(q[:, mla.dn:], cos, sin)
        kv = self._lin(mla.kv_a_proj_with_mqa, a)
        c_kv = _rms(kv[:mla.rkv], mla.kv_a_layernorm.weight, self.eps)
        k_pe = _rope_interleaved(kv[mla.rkv:], cos, sin)
        st["c_kv"] = torch.cat([st["c_kv"], c_kv[None]])
        st["k_pe"] = torch.cat([st["k_pe"], k_pe[None]])

        ind = mla.indexer
        qi = self._lin(ind.wq_b, c_q).reshape(ind.heads, ind.dim)
        qi = torch.cat([_rope_half(qi[:, :ind.rope], cos, sin), qi[:, ind.rope:]], -1)
        ki = F.layer_norm(self._lin(ind.wk, a), (ind.dim,), ind.k_norm.weight, ind.k_norm.bias,
                          ind.k_norm.eps)
        ki = torch.cat([_rope_half(ki[:ind.rope], cos, sin), ki[ind.rope:]], -1)
        st["idx_k"] = torch.cat([st["idx_k"], ki[None]])
        num_cached = st["c_kv"].shape[0]
        if mla.topk < num_cached:
            w = self._lin(ind.weights_proj, a) * (ind.heads ** -0.5 * ind.dim ** -0.5)
            dots = torch.relu(self._mm(qi, st["idx_k"].t()))        # [n_I, S]
            top = (dots * w[:, None]).sum(0).topk(mla.topk).indices
            lat, pe = st["c_kv"][top], st["k_pe"][top]
        else:
            lat, pe = st["c_kv"], st["k_pe"]
        q_abs = self._mm(q[:, None, :mla.dn], mla.decode_w_uk)[:, 0]   # [H, r]
        scores = (self._mm(q_abs, lat.t()) + self._mm(q_pe, pe.t())) * mla.scale
        probs = torch.softmax(scores, dim=-1)                        # [H, S']
        o_lat = self._mm(probs, lat)                                 # [H, r]
        o = self._mm(mla.decode_w_uv, o_lat[:, :, None])[..., 0]     # [H, d_v]
        return self._lin(mla.o_proj, o.reshape(-1))

    def _mlp(self, mlp, x):
        gate, up, down = (getattr(mlp, n) for n in mlp.names)
        return self._lin(down, F.silu(self._lin(gate, x)) * self._lin(up, x))

    def _moe(self, moe, x):
        scores = torch.sigmoid(self._mm(x, moe.decode_gate.t()))     # [E]
        ids = (scores + moe.gate.e_score_correction_bias).topk(moe.top_k).indices
        picked = scores[ids]
        weights = picked / (picked.sum() + 1e-20)
        z = self._lin(moe.routed_expert_down_proj, x)
        routed = torch.zeros_like(z)
        for slot, e in enumerate(ids.tolist()):
            routed = routed + self._mlp(moe.experts[e], z) * weights[slot]
        routed = _rms(routed, moe.routed_expert_norm.weight, self.eps)
        return self._lin(moe.routed_expert_up_proj, routed) + self._mlp(moe.shared_experts, x)

    # ------------------------------------------------------------ the step

    def step(self, token_id):
        """Feeds one token at the next position; returns the next-token logits [vocab]."""
        with torch.no_grad():
            m = self.model.model
            angle = float(self.pos) * self.inv_freq
            cos, sin = torch.cos(angle), torch.sin(angle)
            p = m.embed_tokens.weight[int(token_id)]
            bank = []
            for i, layer in enumerate(m.layers):
                h = self._mix(layer.self_attention_res_proj, layer.self_attention_res_norm,
                              bank + [p])
                if i % self.block == 0:
                    bank.append(p)
                    p = torch.zeros_like(p)
                a = _rms(h, layer.input_layernorm.weight, self.eps)
                if layer.is_kda:
                    p = p + self._kda(layer.self_attn, self.state[i], a)
                else:
                    p = p + self._mla(layer.self_attn, self.state[i], a, cos, sin)
                h = self._mix(layer.mlp_res_proj, layer.mlp_res_norm, bank + [p])
                f = _rms(h, layer.post_attention_layernorm.weight, self.eps)
                if hasattr(layer, "mlp"):
                    p = p + self._mlp(layer.mlp, f)
                else:
                    p = p + self._moe(layer.block_sparse_moe, f)
            x = self._mix(m.output_attn_res_proj, m.output_attn_res_norm, bank + [p])
            logits = self._lin(self.model.lm_head, _rms(x, m.norm.weight, self.eps))
        self.pos += 1
        return logits


def greedy(decoder, prompt_ids, max_tokens):
    """Feeds the prompt, then generates `max_tokens` greedily (EOS ignored). Returns (tokens, wall
    seconds and process CPU seconds of the decode steps, number of decode steps): the first token
    comes from the prompt's last logits; each later one costs one decode step (as `dayzero
    generate` counts)."""
    decoder.reset()
    for t in prompt_ids:
        logits = decoder.step(t)
    tokens = [int(torch.argmax(logits))]
    start, start_cpu = time.perf_counter(), time.process_time()
    while len(tokens) < max_tokens:
        tokens.append(int(torch.argmax(decoder.step(tokens[-1]))))
    return tokens, time.perf_counter() - start, time.process_time() - start_cpu, max_tokens - 1
