"""FP32 PyTorch reference of `deepseek_v32` (DeepSeek-V3.2 / V3.2-Exp), docs/models.md §1–§3, §6.1, §7.1.

    /usr/bin/python3 -m dayzero_ref.deepseek_v32 MODEL_DIR --token-ids 1,2,3 --output logits.npy \
        [--kv-cache-dtype fp8|bf16] [--mtp-output mtp.npy]

writes float32 logits [T, V] of a full-sequence prefill from position 0. Written from the semantics
of DeepSeek's published inference demo (`deepseek-ai/DeepSeek-V3.2-Exp: inference/model.py`,
`kernel.py`, the version with the indexer RoPE fix), with the numerics policy of issue 3, which the
C++ engine follows too:

- Activations are BF16-valued FP32: every linear output, every norm output, the residual stream
  (adds in FP32, then rounded). Reductions, softmax and routing in FP32. Logits FP32, not rounded.
- FP8 block weights are dequantized exactly (decode(code) · weight_scale_inv); activations are not
  quantized on their way into a linear (W8A16, docs/formats.md §4.1 engine option).
- MLA (prefill form, §2.2): q_pe and k_pe after interleaved YaRN RoPE rounded to BF16; c_kv =
  RMSNorm(kv_a part) rounded, then with kv_cache_dtype "fp8" through act_quant (ue8m0, tiles of 128)
  and back before it is used (§2.4); k_nope/v = kv_b_proj(c_kv) rounded (a linear output); scores and
  softmax FP32 with softmax_scale = (d_n + d_r)^-1/2 · M(factor, mscale_all_dim)²; per-head output
  rounded before o_proj.
- Indexer: exactly §3.2 (rotate-half RoPE unless config `indexer_rope_interleave`), selection §3.3
  with ties broken by (score desc, position asc) and −1 padding; attention over the selection is
  dense scores with −inf outside it (§3.4, the reference path).
- MoE §6.1 with ties to the lower group / expert id; expert gate/up outputs and silu(g)·u rounded,
  down outputs FP32, the weighted sum plus the shared expert rounded once.

Taps (issue 3 tap names; `taps` maps (layer_id, name) -> float32 tensor), per layer:
  attn_norm [T,d], q_latent [T,r_q], index_scores [T,T] (−inf above the diagonal),
  index_selection [T,K] (float; positions in rank order, score desc then position asc, −1 padded),
  attn_out [T,d] (after o_proj), ffn_norm [T,d], router_scores [T,E] (σ(logits), unbiased; MoE
  layers only), ffn_out [T,d], layer_out [T,d];
  reference-only extras: routing_ids [T,k] and routing_weights [T,k] (float, rank order) on MoE layers;
  globals with layer −1: final_norm [T,d], logits [T,V].
  The MTP head (layer L = num_hidden_layers) taps its decoder layer under L, plus (L, "mtp_input")
  [n,d] = eh_proj output, (L, "final_norm") = shared_head.norm output, (L, "logits").

`forced` maps (layer_id, "index_selection") -> int [T, K'] (−1 padded) and (layer_id,
"routing_ids") -> int [T, k] (weights recomputed as s/Σs·scale from the unbiased scores) or also
(layer_id, "routing_weights") -> float [T, k]: the decision is used instead of the layer's own, for
operator-level comparisons through discrete decisions (docs/models.md §8.1).
"""

import argparse
import math

import numpy as np
import torch
import torch.nn.functional as F

from dayzero_ref import formats
from dayzero_ref.ref_common import (  # noqa: F401  (re-exported: the tools import them from here)
    GLOBAL_LAYER, ReferenceBase, load_config, load_tensors, parse_token_ids, route_grouped_sigmoid,
    routing_weights)
LAYER_TAPS = ("attn_norm", "q_latent", "index_scores", "index_selection", "attn_out", "ffn_norm",
              "router_scores", "ffn_out", "layer_out")
GLOBAL_TAPS = ("final_norm", "logits")
KV_CACHE_DTYPES = ("fp8", "bf16")
MTP_HIDDEN = ("post_norm", "pre_norm")


# ---------------------------------------------------------------- YaRN (docs/models.md §1.3)

def yarn_mscale(factor, mscale):
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_correction_range(rope_dim, theta, original_max_position, beta_fast, beta_slow):
    """(low, high) pair indices of the YaRN ramp; high gets +0.001 when they meet."""
    def correction_dim(num_rotations):
        return (rope_dim * math.log(original_max_position / (2 * math.pi * num_rotations))
                / (2 * math.log(theta)))
    low = max(math.floor(correction_dim(beta_fast)), 0)
    high = min(math.ceil(correction_dim(beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001
    return low, high


def rope_frequencies(config):
    """(inv_freq float32 [d_r/2], magnitude): YaRN when rope_scaling.type is "yarn", else plain.
    Each f_i is computed in double and rounded to float32, the blend in double from that float,
    as dz::kernels::yarn_rope_frequencies does."""
    d_r, theta = config["qk_rope_head_dim"], float(config.get("rope_theta", 10000.0))
    base = [float(np.float32(1.0 / theta ** (2 * i / d_r))) for i in range(d_r // 2)]
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind != "yarn":
        return torch.tensor(base, dtype=torch.float32), 1.0
    factor = float(scaling["factor"])
    low, high = yarn_correction_range(d_r, theta, scaling["original_max_position_embeddings"],
                                      scaling.get("beta_fast", 32), scaling.get("beta_slow", 1))
    freqs = []
    for i, f in enumerate(base):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        freqs.append(f * (1 - ramp) + f / factor * ramp)
    magnitude = (yarn_mscale(factor, scaling.get("mscale", 1.0))
                 / yarn_mscale(factor, scaling.get("mscale_all_dim", 0.0)))
    return torch.tensor(freqs, dtype=torch.float32), float(np.float32(magnitude))


def softmax_scale(config):
    """(d_n + d_r)^-1/2 · M(factor, mscale_all_dim)² (docs/models.md §1.3), as a float32 value."""
    scale = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) ** -0.5
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type", scaling.get("rope_type")) == "yarn":
        scale *= yarn_mscale(float(scaling["factor"]), scaling.get("mscale_all_dim", 0.0)) ** 2
    return float(np.float32(scale))


def apply_rope(x, positions, inv_freq, magnitude, interleaved):
    """x [T, ..., d_r] rotated at angle fl32(p · f_i) (docs/models.md §1.2); float32 throughout."""
    angle = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, d_r/2]
    cos = torch.cos(angle) * magnitude
    sin = torch.sin(angle) * magnitude
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


# ---------------------------------------------------------------- selection and routing

def select_topk(scores, index_topk):
    """scores [T, T] (−inf above the diagonal) -> int64 [T, K]: row t holds the top
    k_t = min(K, t + 1) positions by (score desc, position asc), then −1 (docs/models.md §3.3)."""
    num_tokens = scores.shape[0]
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    width = min(index_topk, num_tokens)
    out = torch.full((num_tokens, index_topk), -1, dtype=torch.int64)
    out[:, :width] = order[:, :width]
    column = torch.arange(index_topk)[None, :]
    visible = torch.arange(num_tokens)[:, None] + 1
    return torch.where(column < visible, out, torch.full_like(out, -1))


def _dequant_act(x):
    """act_quant (ue8m0, groups of 128) and back: the FP8 round trip of docs/formats.md §4.1/§4.3."""
    codes, scales = formats.act_quant(x)
    groups = formats.decode_e4m3(codes).reshape(*x.shape[:-1], -1, formats.ACT_QUANT_GROUP)
    return (groups * scales.unsqueeze(-1)).reshape(x.shape)


# ---------------------------------------------------------------- the DSA indexer (§3.2–3.3)

def indexer_select(ref, layer_id, p, x, c_q, positions, taps, forced, n_heads, head_dim, d_r,
                   index_topk, interleaved):
    """The lightning indexer of docs/models.md §3.2–3.3 for a reference `ref` (a ReferenceBase with
    weights `w` and RoPE `inv_freq`, `rope_magnitude`): x [T, d] attention input, c_q [T, r_q],
    tensors under prefix p ("...self_attn.indexer."). Taps index_scores [T, T] and
    index_selection [T, K]; returns the selection int64 [T, K] (−1 padded), or the forced one."""
    num_tokens = x.shape[0]
    q = ref._bf16(ref._linear(c_q, p + "wq_b.weight")).reshape(num_tokens, n_heads, head_dim)
    q_pe = ref._bf16(apply_rope(q[..., :d_r], positions, ref.inv_freq, ref.rope_magnitude,
                                interleaved))
    q = torch.cat([q_pe, q[..., d_r:]], dim=-1)  # rope first, unlike MLA
    k = ref._bf16(ref._linear(x, p + "wk.weight"))
    k = ref._bf16(F.layer_norm(k, (head_dim,), ref.w[p + "k_norm.weight"],
                               ref.w[p + "k_norm.bias"], 1e-6))
    k_pe = ref._bf16(apply_rope(k[:, :d_r], positions, ref.inv_freq, ref.rope_magnitude,
                                interleaved))
    k = torch.cat([k_pe, k[:, d_r:]], dim=-1)
    q = ref._bf16(formats.hadamard(q))
    k = ref._bf16(formats.hadamard(k))
    q_codes, q_scale = formats.act_quant(q)  # [T, n_I, d_I], [T, n_I, 1]
    k_codes, k_scale = formats.act_quant(k)  # [T, d_I], [T, 1]
    head_weights = (ref._linear(x, p + "weights_proj.weight")
                    * torch.tensor(n_heads ** -0.5, dtype=torch.float32)
                    * torch.tensor(head_dim ** -0.5, dtype=torch.float32)
                    * q_scale[..., 0])  # [T, n_I]
    dots = torch.einsum("thd,sd->ths", formats.decode_e4m3(q_codes), formats.decode_e4m3(k_codes))
    scores = torch.einsum("ths,th->ts", torch.relu(dots), head_weights) * k_scale[:, 0][None, :]
    causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, -math.inf)
    selection = select_topk(scores, index_topk)
    if forced and (layer_id, "index_selection") in forced:
        selection = torch.as_tensor(forced[(layer_id, "index_selection")]).to(torch.int64)
    ref._tap(taps, layer_id, "index_scores", scores)
    ref._tap(taps, layer_id, "index_selection", selection)
    return selection


def selection_mask(selection, num_tokens):
    """selection int64 [T, K] (−1 padded) -> bool [T, T]: True at the selected positions."""
    # −1 padding goes to a spare column, so it never overwrites a selected position.
    column = torch.where(selection >= 0, selection, torch.full_like(selection, num_tokens))
    mask = torch.zeros(num_tokens, num_tokens + 1, dtype=torch.bool)
    mask.scatter_(1, column, True)
    return mask[:, :num_tokens]


# ---------------------------------------------------------------- the model

class DeepseekV32Reference(ReferenceBase):
    """The deepseek_v32 model of a checkpoint folder, evaluated as a full prefill from position 0.

    kv_cache_dtype: "fp8" passes c_kv through the act_quant round trip (the reference's FP8 cache
    simulation), "bf16" keeps it. mtp_hidden: which main-model state feeds the MTP head's hnorm;
    "post_norm" (default) is what vLLM passes (`DeepseekV2Model.forward` returns the final-norm
    output, `deepseek_mtp.py` takes it as previous_hidden_states), "pre_norm" the residual stream
    before model.norm; which one DeepSeek trained with is (unverified), docs/models.md §7.1.
    mtp_zero_position0: vLLM zeroes the MTP input embedding at position 0; off by default
    (docs/models.md §7.1 has no such step).

    Attributes a test may change: index_topk, indexer_rope_interleave, dense_attention (True: causal
    attention over every key; the indexer still runs and taps).
    """

    def __init__(self, model_dir, kv_cache_dtype="fp8", mtp_hidden="post_norm",
                 mtp_zero_position0=False):
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: expected one of {KV_CACHE_DTYPES}")
        if mtp_hidden not in MTP_HIDDEN:
            raise ValueError(f"mtp_hidden {mtp_hidden!r}: expected one of {MTP_HIDDEN}")
        self.config = c = load_config(model_dir)
        self.mxfp4_names = set()
        self.w = load_tensors(model_dir, c, self.mxfp4_names)
        self.kv_cache_dtype = kv_cache_dtype
        self.mtp_hidden = mtp_hidden
        self.mtp_zero_position0 = mtp_zero_position0
        self.num_layers = c["num_hidden_layers"]
        self.eps = float(c.get("rms_norm_eps", 1e-6))
        self.index_topk = c["index_topk"]
        self.indexer_rope_interleave = bool(c.get("indexer_rope_interleave", False))
        self.dense_attention = False
        self.inv_freq, self.rope_magnitude = rope_frequencies(c)
        self.softmax_scale = softmax_scale(c)
        # Margin checks (dayzero_ref.margins): (relative sigma, torch.Generator) or None.
        self.noise = None

    def _is_moe(self, layer_id):
        c = self.config
        return (c.get("n_routed_experts") is not None and layer_id >= c["first_k_dense_replace"]
                and layer_id % c.get("moe_layer_freq", 1) == 0)

    # ------------------------------------------------------------ blocks

    def _indexer(self, layer_id, p, x, c_q, positions, taps, forced):
        """docs/models.md §3.2–3.3: selection int64 [T, K]."""
        c = self.config
        return indexer_select(self, layer_id, p, x, c_q, positions, taps, forced,
                              c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"],
                              self.index_topk, self.indexer_rope_interleave)

    def _attention(self, layer_id, p, x, positions, taps, forced):
        c = self.config
        num_tokens = x.shape[0]
        heads, d_n, d_r, d_v, r_kv = (c["num_attention_heads"], c["qk_nope_head_dim"],
                                      c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"])
        c_q = self._rms_norm(self._bf16(self._linear(x, p + "q_a_proj.weight")),
                             self.w[p + "q_a_layernorm.weight"])
        self._tap(taps, layer_id, "q_latent", c_q)
        q = self._bf16(self._linear(c_q, p + "q_b_proj.weight")).reshape(num_tokens, heads, d_n + d_r)
        q_nope = q[..., :d_n]
        q_pe = self._bf16(apply_rope(q[..., d_n:], positions, self.inv_freq, self.rope_magnitude,
                                     True))
        kv = self._bf16(self._linear(x, p + "kv_a_proj_with_mqa.weight"))
        c_kv = self._rms_norm(kv[:, :r_kv], self.w[p + "kv_a_layernorm.weight"])
        if self.kv_cache_dtype == "fp8":
            c_kv = _dequant_act(c_kv)
        k_pe = self._bf16(apply_rope(kv[:, r_kv:], positions, self.inv_freq, self.rope_magnitude,
                                     True))
        selection = self._indexer(layer_id, p + "indexer.", x, c_q, positions, taps, forced)

        kv_up = self._bf16(self._linear(c_kv, p + "kv_b_proj.weight")).reshape(num_tokens, heads,
                                                                              d_n + d_v)
        k_nope, v = kv_up[..., :d_n], kv_up[..., d_n:]
        scores = (torch.einsum("thd,shd->hts", q_nope, k_nope)
                  + torch.einsum("thr,sr->hts", q_pe, k_pe)) * self.softmax_scale
        allowed = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
        if not self.dense_attention:
            allowed = allowed & self._selection_mask(selection, num_tokens)
        probs = torch.softmax(scores.masked_fill(~allowed[None], -math.inf), dim=-1)
        o = self._bf16(torch.einsum("hts,shd->thd", probs, v)).reshape(num_tokens, heads * d_v)
        return self._bf16(self._linear(o, p + "o_proj.weight"))

    @staticmethod
    def _selection_mask(selection, num_tokens):
        return selection_mask(selection, num_tokens)

    def _swiglu(self, x, p, round_output):
        g = self._bf16(self._linear(x, p + "gate_proj.weight"))
        u = self._bf16(self._linear(x, p + "up_proj.weight"))
        y = self._linear(self._bf16(F.silu(g) * u), p + "down_proj.weight")
        return self._bf16(y) if round_output else y

    def _moe(self, layer_id, p, x, taps, forced):
        c = self.config
        scores = torch.sigmoid(self._linear(x, p + "gate.weight"))
        self._tap(taps, layer_id, "router_scores", scores)
        key_ids, key_weights = (layer_id, "routing_ids"), (layer_id, "routing_weights")
        if forced and key_ids in forced:
            ids = torch.as_tensor(forced[key_ids]).to(torch.int64)
            weights = (torch.as_tensor(forced[key_weights]).float() if key_weights in forced else
                       routing_weights(scores, ids, c.get("norm_topk_prob", True),
                                       float(c["routed_scaling_factor"])))
        else:
            ids, weights = route_grouped_sigmoid(
                scores, self.w[p + "gate.e_score_correction_bias"], c["n_group"], c["topk_group"],
                c["num_experts_per_tok"], c.get("norm_topk_prob", True),
                float(c["routed_scaling_factor"]))
        self._tap(taps, layer_id, "routing_ids", ids)
        self._tap(taps, layer_id, "routing_weights", weights)
        out = torch.zeros_like(x)
        for e in torch.unique(ids).tolist():
            rows, slots = torch.nonzero(ids == e, as_tuple=True)
            y = self._swiglu(x[rows], f"{p}experts.{e}.", round_output=False)
            out.index_add_(0, rows, y * weights[rows, slots][:, None])
        out = out + self._swiglu(x, p + "shared_experts.", round_output=False)
        return self._bf16(out)

    def _decoder_layer(self, layer_id, x, positions, taps, forced):
        p = f"model.layers.{layer_id}."
        a = self._rms_norm(x, self.w[p + "input_layernorm.weight"])
        self._tap(taps, layer_id, "attn_norm", a)
        attn = self._attention(layer_id, p + "self_attn.", a, positions, taps, forced)
        self._tap(taps, layer_id, "attn_out", attn)
        h = self._bf16(x + attn)
        f_in = self._rms_norm(h, self.w[p + "post_attention_layernorm.weight"])
        self._tap(taps, layer_id, "ffn_norm", f_in)
        if self._is_moe(layer_id):
            f = self._moe(layer_id, p + "mlp.", f_in, taps, forced)
        else:
            f = self._swiglu(f_in, p + "mlp.", round_output=True)
        self._tap(taps, layer_id, "ffn_out", f)
        out = self._bf16(h + f)
        self._tap(taps, layer_id, "layer_out", out)
        return out

    # ------------------------------------------------------------ entry points

    def hidden_states(self, token_ids, taps=None, forced=None):
        """(residual stream after the last layer [T, d], final-norm output [T, d]), both BF16-valued."""
        ids = self._check_ids(token_ids)
        if ids.numel() == 0:
            raise ValueError("empty token list")
        x = self.w["model.embed_tokens.weight"][ids]
        positions = torch.arange(ids.numel())
        for layer_id in range(self.num_layers):
            x = self._decoder_layer(layer_id, x, positions, taps, forced)
        final = self._rms_norm(x, self.w["model.norm.weight"])
        self._tap(taps, GLOBAL_LAYER, "final_norm", final)
        return x, final

    def forward(self, token_ids, taps=None, forced=None):
        """FP32 logits [T, V] of a prefill of token_ids from position 0."""
        _, final = self.hidden_states(token_ids, taps, forced)
        logits = self._linear(final, "lm_head.weight")
        self._tap(taps, GLOBAL_LAYER, "logits", logits)
        return logits

    def mtp_logits(self, token_ids, next_token=None, taps=None, forced=None):
        """MTP logits [n, V] (docs/models.md §7.1): row t predicts token t + 2 from h_t and token t + 1,
        z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]) at position t through decoder layer L, then
        shared_head. The inputs x_{t+1} are token_ids[1:] and `next_token` if given, so n = T − 1
        or T. The head's own embed_tokens / shared_head.head are used (copies of the main ones)."""
        m = self.num_layers
        if self.config.get("num_nextn_predict_layers", 0) < 1:
            raise ValueError("checkpoint has no MTP layer (num_nextn_predict_layers = 0)")
        pre, post = self.hidden_states(token_ids, taps, forced)
        if taps is not None:  # the main logits too, so one call taps every decision
            self._tap(taps, GLOBAL_LAYER, "logits", self._linear(post, "lm_head.weight"))
        inputs = [int(t) for t in token_ids[1:]] + ([] if next_token is None else [int(next_token)])
        p = f"model.layers.{m}."
        head = self.w.get(p + "shared_head.head.weight", self.w["lm_head.weight"])
        if not inputs:
            return torch.zeros(0, head.shape[0])
        ids = self._check_ids(inputs)
        n = ids.numel()
        h = (post if self.mtp_hidden == "post_norm" else pre)[:n]
        e = self.w.get(p + "embed_tokens.weight", self.w["model.embed_tokens.weight"])[ids]
        positions = torch.arange(n)
        if self.mtp_zero_position0:
            e = e.masked_fill((positions == 0)[:, None], 0.0)
        z = torch.cat([self._rms_norm(e, self.w[p + "enorm.weight"]),
                       self._rms_norm(h, self.w[p + "hnorm.weight"])], dim=-1)
        z = self._bf16(self._linear(z, p + "eh_proj.weight"))
        self._tap(taps, m, "mtp_input", z)
        z = self._decoder_layer(m, z, positions, taps, forced)
        final = self._rms_norm(z, self.w[p + "shared_head.norm.weight"])
        self._tap(taps, m, "final_norm", final)
        logits = final @ head.t()
        self._tap(taps, m, "logits", logits)
        return logits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--token-ids", type=parse_token_ids, required=True,
                        help="comma-separated token ids")
    parser.add_argument("--output", required=True, help="float32 [T, V] logits (.npy)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="fp8")
    parser.add_argument("--mtp-output", help="also write the MTP head's float32 [T-1, V] logits")
    args = parser.parse_args(argv)
    ref = DeepseekV32Reference(args.model_dir, kv_cache_dtype=args.kv_cache_dtype)
    with torch.no_grad():
        np.save(args.output, ref.forward(args.token_ids).numpy().astype(np.float32))
        if args.mtp_output:
            np.save(args.mtp_output, ref.mtp_logits(args.token_ids).numpy().astype(np.float32))


if __name__ == "__main__":
    main()
