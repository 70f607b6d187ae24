"""FP32 PyTorch reference of `kimi_linear` (Kimi-Linear) and `kimi_k3` (Kimi-K3 text decoder),
docs/models.md §1.1, §2.5, §4, §5, §6.2–6.3, §7.2–7.3.

    /usr/bin/python3 -m dayzero_ref.kimi MODEL_DIR --token-ids 1,2,3 --output logits.npy \
        [--kv-cache-dtype bf16|fp8]

writes float32 logits [T, V] of a full-sequence prefill from position 0, with the Kimi numerics
policy of issue 4 (docs/models.md §0, §4.1; the issue-3 policy plus):

- KDA: q̂/k̂/v̂ = linear outputs rounded BF16; q, k, v = SiLU(causal depthwise conv, FP32 weights and
  accumulation, zero state at position 0) rounded BF16; q, k per-head L2-normalised in FP32 (ε 1e-6
  inside the root, not rounded); f = round(f_b(round(f_a(x)))) + dt_bias (FP32); gate §4.2
  (unbounded: −exp(A_log)·softplus(f), softplus(f) = f above 20; bounded: lb·σ(exp(A_log)·f));
  β = σ(round(b_proj(x))); the §4.4 recurrence in FP32 through the chunked form of §4.7 (C = 16,
  chunks aligned to absolute positions), state V-first [H, d_v, d_k]; y_h = RMSNorm(o_h; o_norm,
  rms_norm_eps) ⊙ σ(z_h) in FP32, rounded once; out = round(o_proj(y)).
- MLA (NoPE): q from q_proj (Kimi-Linear) or q LoRA (K3: round(RMSNorm(round(q_a_proj(x))))) and
  round(q_b_proj); kv = round(kv_a_proj(x)); c_kv = round(RMSNorm(kv[:r_kv])) with ε 1e-6 (Kimi-
  Linear) or rms_norm_eps (K3), with kv_cache_dtype "fp8" through the act_quant round trip; no
  rotation; k_nope / v = W_UK c_kv, W_UV c_kv in FP32 (NOT rounded: as the engine's MlaBlock, which
  keeps them FP32 so its two attention forms agree); softmax_scale = (d_n + d_r)^−1/2; per-head output
  (K3: times σ(round(g_proj(x))) per element, FP32) rounded BF16, then round(o_proj).
- MoE (§6.2): σ(FP32 router logits), bias for selection only, top-k (n_group = 1), weights
  s/(Σs + 1e-20)·routed_scaling_factor; experts SwiGLU (w1 gate, w3 up, w2 down) or SiTU (§1.1):
  gate/up rounded, activation FP32, product rounded, down FP32; weighted sum + shared FP32, rounded
  once. Latent MoE (K3, §6.3): z = round(routed_expert_down_proj(x)); y_lat = Σ p_e·Expert_e(z) FP32;
  y = routed_expert_up_proj(round(RMSNorm(y_lat))) FP32 + shared(x) FP32, rounded once. MXFP4
  experts are decoded exactly at load.
- AttnRes (K3, §5, exactly): bank rows and the running prefix P in FP32, never rounded; the mix in
  FP32 (ε = rms_norm_eps); sublayer outputs added to P in FP32; final mix over bank ++ [P], then
  final norm (rounded) and lm_head (FP32). Without AttnRes: the DeepSeek residual (FP32 add, rounded).

Taps (`taps` maps (layer_id, name) -> float32 tensor), per layer: attn_mix [T,d] (AttnRes only),
attn_norm [T,d]; KDA layers: kda_q, kda_k, kda_v, kda_g [T,H·d], kda_beta [T,H], kda_core [T,H·d];
attn_out [T,d]; ffn_mix [T,d] (AttnRes only); ffn_norm [T,d]; MoE layers: router_scores [T,E] and the
reference-only routing_ids [T,k], routing_weights [T,k] (float, rank order), latent MoE: latent_in
[T,r]; ffn_out [T,d]; layer_out [T,d] (AttnRes: P after the layer). Globals (layer −1): final_mix
[T,d] (AttnRes only), final_norm [T,d], logits [T,V].

`forced` maps (layer_id, "routing_ids") -> int [T, k] (weights recomputed from the unbiased scores)
and optionally (layer_id, "routing_weights") -> float [T, k]: that routing replaces the layer's own
(operator-level comparison through discrete decisions, docs/models.md §8.1).

`input_embeds` (positions, rows [n, d]) replaces the embedding rows at those positions, in order
(rounded to BF16, as a BF16 model holds inputs_embeds): K3 image embeddings (dayzero_ref.vision) at
the <|media_pad|> positions, media_positions(token_ids).
"""

import argparse
import math

import numpy as np
import torch
import torch.nn.functional as F

from dayzero_ref import formats
from dayzero_ref.ref_common import (GLOBAL_LAYER, ReferenceBase, load_config, load_tensors,
                                    parse_token_ids, route_grouped_sigmoid, routing_weights)

KV_CACHE_DTYPES = ("bf16", "fp8")
KIMI_MODEL_TYPES = ("kimi_linear", "kimi_k3")
KDA_CHUNK = 16
L2_NORM_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0
ROUTING_RENORM_EPS = 1e-20
KIMI_LINEAR_KV_NORM_EPS = 1e-6  # docs/models.md §2.5: the modeling file's default, not rms_norm_eps
LAYER_TAPS = ("attn_mix", "attn_norm", "q_latent", "kda_q", "kda_k", "kda_v", "kda_g", "kda_beta", "kda_core",
              "attn_out", "ffn_mix", "ffn_norm", "router_scores", "latent_in", "ffn_out", "layer_out")
REFERENCE_ONLY_TAPS = ("routing_ids", "routing_weights")
GLOBAL_TAPS = ("final_mix", "final_norm", "logits")


# ---------------------------------------------------------------- KDA (docs/models.md §4)

def kda_gate(f, a_log, lower_bound=None):
    """f [..., H, d] (including dt_bias), a_log [H] -> natural-log decay g [..., H, d] (§4.2).
    Unbounded (lower_bound None): −exp(A_log[h])·softplus(f), softplus(f) = f for f > 20 else
    log1p(exp(f)). Bounded: lb·σ(exp(A_log[h])·f). Computed in f's dtype."""
    a = torch.exp(a_log.to(f.dtype))[:, None]  # [H, 1]
    if lower_bound is None:
        # exp of the clamped f: the branch not taken must not overflow to inf·0 = nan in gradients
        # or in float16; the value of the other branch is discarded.
        soft = torch.where(f > SOFTPLUS_THRESHOLD, f,
                           torch.log1p(torch.exp(torch.clamp(f, max=SOFTPLUS_THRESHOLD))))
        return -a * soft
    return torch.tensor(lower_bound, dtype=f.dtype) * torch.sigmoid(a * f)


def kda_recurrent_naive(q, k, v, g, beta, state=None):
    """The oracle (§4.4) in float64. q, k, v, g [T, H, d] (q, k L2-normalised; d_k = d_v = d),
    beta [T, H], state [H, d_v, d_k] V-first or None (zeros). Returns (o [T, H, d_v], state), both
    float64. The kernel multiplies q by d_k^−1/2."""
    q, k, v, g, beta = (t.to(torch.float64) for t in (q, k, v, g, beta))
    num_tokens, num_heads, d_k = k.shape
    d_v = v.shape[-1]
    s = (torch.zeros(num_heads, d_v, d_k, dtype=torch.float64) if state is None
         else state.to(torch.float64).clone())
    scale = d_k ** -0.5
    out = torch.zeros(num_tokens, num_heads, d_v, dtype=torch.float64)
    for t in range(num_tokens):
        s = s * torch.exp(g[t])[:, None, :]                       # decay key channel d
        pred = torch.einsum("hvk,hk->hv", s, k[t])                # S'ᵀ k_t
        u = beta[t][:, None] * (v[t] - pred)                      # [H, d_v]
        s = s + u[:, :, None] * k[t][:, None, :]                  # + k_t u_tᵀ (V-first)
        out[t] = torch.einsum("hvk,hk->hv", s, q[t] * scale)
    return out, s


def _kda_chunk(q, k, v, g, beta, s0, scale):
    """One chunk of §4.7 for every head at once: q, k, v, g [n, H, d], beta [n, H], s0 [H, d_v, d_k].
    Returns (o [n, H, d_v], s_next)."""
    n = q.shape[0]
    gamma = torch.cumsum(g, dim=0)                                # Γ_r [n, H, d_k]
    lower = torch.ones(n, n, dtype=torch.bool).tril()             # c ≤ r
    # Γ_r − Γ_c as the sum of g over (c, r] rather than a difference of cumulative sums: with the
    # unbounded gate a channel can hold g ≈ −500 once and small values after it, and the
    # difference of two sums near −500 would lose ~500·2^−24 on a factor that survives.
    diff = torch.full((n, n) + g.shape[1:], -math.inf, dtype=g.dtype)  # [r, c, H, d_k]
    for c in range(n):
        diff[c, c] = 0.0
        diff[c + 1:, c] = torch.cumsum(g[c + 1:], dim=0)
    decay = torch.exp(diff)                                       # D(r, c), pairwise, ≤ 1
    kk = torch.einsum("rhd,chd,rchd->hrc", k, k, decay)           # Σ_d k_r k_c D(r,c)
    strict = torch.ones(n, n, dtype=torch.bool).tril(-1)
    ell = (beta.t()[:, :, None] * kk).masked_fill(~strict[None], 0.0)       # L [H, r, c]
    attn = (scale * torch.einsum("rhd,chd,rchd->hrc", q, k, decay)).masked_fill(~lower[None], 0.0)
    eg = torch.exp(gamma)                                         # exp(Γ_r) ≤ 1
    b = beta[:, :, None] * (v - torch.einsum("hvk,rhk->rhv", s0, eg * k))  # B_r [n, H, d_v]
    vn = torch.zeros_like(b)
    for r in range(n):  # forward substitution: (I + L) Vn = B
        vn[r] = b[r] - torch.einsum("hc,chv->hv", ell[:, r, :r], vn[:r]) if r > 0 else b[r]
    o = (torch.einsum("hvk,rhk->rhv", s0, scale * eg * q)
         + torch.einsum("hrc,chv->rhv", attn, vn))
    last = gamma[-1]                                              # Γ_C' [H, d_k]
    tail = decay[-1] * k                                          # exp(Γ_C' − Γ_c) ⊙ k_c
    s_next = s0 * torch.exp(last)[:, None, :] + torch.einsum("chv,chk->hvk", vn, tail)
    return o, s_next


def kda_chunked(q, k, v, g, beta, chunk_size=KDA_CHUNK, state=None, pos_begin=0):
    """§4.7 in the dtype of q (FP32 in the model): same contract as kda_recurrent_naive, the
    result in q's dtype. Chunks are aligned to absolute positions: token 0 sits at pos_begin, so
    the first chunk has chunk_size − pos_begin % chunk_size rows (or fewer)."""
    dtype = q.dtype
    k, v, g, beta = (t.to(dtype) for t in (k, v, g, beta))
    num_tokens, num_heads, d_k = k.shape
    d_v = v.shape[-1]
    s = (torch.zeros(num_heads, d_v, d_k, dtype=dtype) if state is None
         else state.to(dtype).clone())
    scale = torch.tensor(d_k ** -0.5, dtype=dtype)
    out = torch.zeros(num_tokens, num_heads, d_v, dtype=dtype)
    begin = 0
    while begin < num_tokens:
        end = min(num_tokens, begin + chunk_size - (pos_begin + begin) % chunk_size)
        out[begin:end], s = _kda_chunk(q[begin:end], k[begin:end], v[begin:end], g[begin:end],
                                       beta[begin:end], s, scale)
        begin = end
    return out, s


def short_conv_silu(x, weight):
    """x [T, C] (pre-conv rows, BF16-valued), weight [C, 1, W] or [C, W] -> SiLU(causal depthwise
    conv) [T, C] FP32, zero state before the sequence (§4.3). Tap W−1 multiplies the current row."""
    w = weight.reshape(weight.shape[0], -1).float()
    width = w.shape[1]
    xp = torch.cat([torch.zeros(width - 1, x.shape[1]), x.float()], dim=0)
    y = torch.zeros_like(x, dtype=torch.float32)
    for j in range(width):
        y = y + w[:, j][None, :] * xp[j:j + x.shape[0]]
    return F.silu(y)


def l2_normalize_heads(x, num_heads):
    """x [T, H·d] -> x_h / sqrt(Σ x_h² + 1e-6) per head, FP32, [T, H, d]."""
    x = x.float().reshape(x.shape[0], num_heads, -1)
    return x * torch.rsqrt(x.pow(2).sum(dim=-1, keepdim=True) + L2_NORM_EPS)


# ---------------------------------------------------------------- AttnRes (§5) and SiTU (§1.1)

def attn_res_mix(rows, proj, norm, eps):
    """rows: R tensors [T, d] FP32 (raw); proj [1, d] or [d]; norm [d]. Returns Σ_j p_j v_j [T, d]
    FP32 with p = softmax_j((cw·v_j)·(mean(v_j²) + eps)^−1/2), cw = norm ⊙ proj (no 1/sqrt(d))."""
    cw = norm.reshape(-1).float() * proj.reshape(-1).float()
    v = torch.stack([r.float() for r in rows])                    # [R, T, d]
    s = (v @ cw) * torch.rsqrt(v.pow(2).mean(dim=-1) + eps)       # [R, T]
    p = torch.softmax(s, dim=0)
    return (p[:, :, None] * v).sum(dim=0)


def situ(gate, up, beta, linear_beta=None):
    """SiTU activation product (§1.1): β·tanh(g/β)·σ(g) ⊙ u', u' = β_lin·tanh(u/β_lin), or u when
    β_lin is 0 / None. FP32."""
    a = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    u = linear_beta * torch.tanh(up / linear_beta) if linear_beta else up
    return a * u


def text_config(config):
    """(text config, tensor prefix): K3 nests the decoder under text_config, names under
    "language_model."."""
    if config.get("model_type") == "kimi_k3":
        return config["text_config"], "language_model."
    if config.get("model_type") in ("kimi_linear", "dayzero_hybrid"):  # hybrid: dayzero_ref.hybrid
        return config, ""
    raise ValueError(f"model_type {config.get('model_type')!r}: expected one of {KIMI_MODEL_TYPES}")


def _dequant_act(x):
    codes, scales = formats.act_quant(x)
    groups = formats.decode_e4m3(codes).reshape(*x.shape[:-1], -1, formats.ACT_QUANT_GROUP)
    return (groups * scales.unsqueeze(-1)).reshape(x.shape)


# ---------------------------------------------------------------- the model

class KimiReference(ReferenceBase):
    """A kimi_linear or kimi_k3 checkpoint folder, evaluated as a full prefill from position 0.

    kv_cache_dtype: "bf16" (default for Kimi models) keeps c_kv; "fp8" passes it through the
    act_quant round trip (only when kv_lora_rank % 128 == 0, as the engine). Attributes a test may
    change: kda_chunk_size, kda_path ("chunked" or "recurrent": the float64 oracle cast to FP32).
    """

    def __init__(self, model_dir, kv_cache_dtype="bf16"):
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: expected one of {KV_CACHE_DTYPES}")
        self.top_config = load_config(model_dir)
        self.config, self.prefix = text_config(self.top_config)
        c = self.config
        if kv_cache_dtype == "fp8" and c["kv_lora_rank"] % formats.ACT_QUANT_GROUP:
            raise ValueError(f"kv_cache_dtype fp8 needs kv_lora_rank % 128 == 0, got "
                             f"{c['kv_lora_rank']}")
        self.mxfp4_names = set()
        self.w = load_tensors(model_dir, c, self.mxfp4_names)
        self.kv_cache_dtype = kv_cache_dtype
        self.num_layers = c["num_hidden_layers"]
        self.eps = float(c.get("rms_norm_eps", 1e-5))
        la = c["linear_attn_config"]
        self.kda_heads, self.kda_dim = la["num_heads"], la["head_dim"]
        self.gate_lower_bound = la.get("gate_lower_bound")
        kda = {i - 1 for i in la.get("kda_layers", [])}       # 1-based in the config
        full = {i - 1 for i in la.get("full_attn_layers", [])}
        for i in range(self.num_layers):
            if (i in kda) == (i in full):
                raise ValueError(f"layer {i}: must be in exactly one of kda_layers / "
                                 "full_attn_layers (1-based)")
        self.kda_layers = kda
        self.is_k3_mla = bool(c.get("q_lora_rank"))
        self.kv_norm_eps = self.eps if self.is_k3_mla else KIMI_LINEAR_KV_NORM_EPS
        self.softmax_scale = float(np.float32((c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
                                              ** -0.5))
        self.attn_res_block = c.get("attn_res_block_size")
        self.activation = c.get("hidden_act", "silu")
        if self.activation not in ("silu", "situ"):
            raise ValueError(f"hidden_act {self.activation!r}: expected silu or situ")
        self.kda_chunk_size = KDA_CHUNK
        self.kda_path = "chunked"
        self.noise = None

    # ------------------------------------------------------------ helpers

    def _layer_prefix(self, layer_id):
        return f"{self.prefix}model.layers.{layer_id}."

    def _is_moe(self, layer_id):
        c = self.config
        return (c.get("num_experts") is not None and layer_id >= c["first_k_dense_replace"]
                and layer_id % c.get("moe_layer_freq", 1) == 0)

    def _gated_mlp(self, x, gate_name, up_name, down_name):
        """gate/up rounded, activation FP32, product rounded, down output FP32 (not rounded)."""
        g = self._bf16(self._linear(x, gate_name))
        u = self._bf16(self._linear(x, up_name))
        c = self.config
        if self.activation == "situ":
            a = situ(g, u, float(c["activation_situ_beta"]),
                     c.get("activation_situ_linear_beta") or None)
        else:
            a = F.silu(g) * u
        return self._linear(self._bf16(a), down_name)

    # ------------------------------------------------------------ KDA

    def _kda(self, layer_id, p, x, taps):
        c = self.config
        num_tokens, heads, dim = x.shape[0], self.kda_heads, self.kda_dim
        qkv = []
        for name in "qkv":
            pre = self._bf16(self._linear(x, f"{p}{name}_proj.weight"))
            qkv.append(self._bf16(short_conv_silu(pre, self.w[f"{p}{name}_conv1d.weight"])))
        q = l2_normalize_heads(qkv[0], heads)
        k = l2_normalize_heads(qkv[1], heads)
        v = qkv[2].reshape(num_tokens, heads, dim)
        f = self._bf16(self._linear(self._bf16(self._linear(x, p + "f_a_proj.weight")),
                                    p + "f_b_proj.weight"))
        f = (f + self.w[p + "dt_bias"][None, :]).reshape(num_tokens, heads, dim)
        a_log = self.w[p + "A_log"].reshape(-1)[:heads]
        g = kda_gate(f, a_log, self.gate_lower_bound)
        beta = torch.sigmoid(self._bf16(self._linear(x, p + "b_proj.weight")))
        if self.kda_path == "recurrent":
            o, _ = kda_recurrent_naive(q, k, v, g, beta)
            o = o.float()
        else:
            o, _ = kda_chunked(q, k, v, g, beta, self.kda_chunk_size)
        for name, value in (("kda_q", q), ("kda_k", k), ("kda_v", v), ("kda_g", g),
                            ("kda_beta", beta), ("kda_core", o)):
            self._tap(taps, layer_id, name, value.reshape(num_tokens, -1))
        if p + "g_proj.weight" in self.w:
            z = self._bf16(self._linear(x, p + "g_proj.weight"))
        else:
            z = self._bf16(self._linear(self._bf16(self._linear(x, p + "g_a_proj.weight")),
                                        p + "g_b_proj.weight"))
        normed = o * torch.rsqrt(o.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        y = normed * self.w[p + "o_norm.weight"] * torch.sigmoid(z.reshape(num_tokens, heads, dim))
        y = self._bf16(y.reshape(num_tokens, heads * dim))
        return self._bf16(self._linear(y, p + "o_proj.weight"))

    # ------------------------------------------------------------ MLA (NoPE, §2.5)

    def _mla(self, p, x, taps=None, layer_id=None):
        c = self.config
        num_tokens = x.shape[0]
        heads, d_n, d_r, d_v, r_kv = (c["num_attention_heads"], c["qk_nope_head_dim"],
                                      c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"])
        if self.is_k3_mla:
            c_q = self._rms_norm(self._bf16(self._linear(x, p + "q_a_proj.weight")),
                                 self.w[p + "q_a_layernorm.weight"])
            self._tap(taps, layer_id, "q_latent", c_q)
            q = self._bf16(self._linear(c_q, p + "q_b_proj.weight"))
        else:
            q = self._bf16(self._linear(x, p + "q_proj.weight"))
        q = q.reshape(num_tokens, heads, d_n + d_r)
        kv = self._bf16(self._linear(x, p + "kv_a_proj_with_mqa.weight"))
        c_kv = self._rms_norm(kv[:, :r_kv], self.w[p + "kv_a_layernorm.weight"], self.kv_norm_eps)
        if self.kv_cache_dtype == "fp8":
            c_kv = _dequant_act(c_kv)
        k_pe = kv[:, r_kv:]  # NoPE: never rotated
        kv_up = self._linear(c_kv, p + "kv_b_proj.weight").reshape(num_tokens, heads, d_n + d_v)
        k_nope, v = kv_up[..., :d_n], kv_up[..., d_n:]
        scores = (torch.einsum("thd,shd->hts", q[..., :d_n], k_nope)
                  + torch.einsum("thr,sr->hts", q[..., d_n:], k_pe)) * self.softmax_scale
        causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
        probs = torch.softmax(scores.masked_fill(~causal[None], -math.inf), dim=-1)
        o = torch.einsum("hts,shd->thd", probs, v).reshape(num_tokens, heads * d_v)
        if p + "g_proj.weight" in self.w:  # K3 output gate, before the rounding of o
            o = o * torch.sigmoid(self._bf16(self._linear(x, p + "g_proj.weight")))
        return self._bf16(self._linear(self._bf16(o), p + "o_proj.weight"))

    # ------------------------------------------------------------ FFN

    def _route(self, layer_id, scores, bias, taps, forced):
        c = self.config
        renorm = bool(c.get("moe_renormalize", True))
        scale = float(c.get("routed_scaling_factor", 1.0))
        key_ids, key_weights = (layer_id, "routing_ids"), (layer_id, "routing_weights")
        if forced and key_ids in forced:
            ids = torch.as_tensor(forced[key_ids]).to(torch.int64)
            weights = (torch.as_tensor(forced[key_weights]).float() if key_weights in forced else
                       routing_weights(scores, ids, renorm, scale, ROUTING_RENORM_EPS))
        else:
            ids, weights = route_grouped_sigmoid(
                scores, bias, int(c.get("num_expert_group", 1)), int(c.get("topk_group", 1)),
                c["num_experts_per_token"], renorm, scale, ROUTING_RENORM_EPS)
        self._tap(taps, layer_id, "routing_ids", ids)
        self._tap(taps, layer_id, "routing_weights", weights)
        return ids, weights

    def _moe(self, layer_id, p, x, taps, forced):
        c = self.config
        scores = torch.sigmoid(self._linear(x, p + "gate.weight"))
        self._tap(taps, layer_id, "router_scores", scores)
        ids, weights = self._route(layer_id, scores, self.w[p + "gate.e_score_correction_bias"],
                                   taps, forced)
        latent = p + "routed_expert_down_proj.weight" in self.w
        z = self._bf16(self._linear(x, p + "routed_expert_down_proj.weight")) if latent else x
        if latent:
            self._tap(taps, layer_id, "latent_in", z)
        routed = torch.zeros(x.shape[0], z.shape[1])
        for e in torch.unique(ids).tolist():
            rows, slots = torch.nonzero(ids == e, as_tuple=True)
            e_p = f"{p}experts.{e}."
            y = self._gated_mlp(z[rows], e_p + "w1.weight", e_p + "w3.weight", e_p + "w2.weight")
            routed.index_add_(0, rows, y * weights[rows, slots][:, None])
        if latent:
            if c.get("latent_moe_use_norm") and p + "routed_expert_norm.weight" in self.w:
                lat = self._rms_norm(routed, self.w[p + "routed_expert_norm.weight"])
            else:
                lat = self._bf16(routed)
            routed = self._linear(lat, p + "routed_expert_up_proj.weight")
        s = p + "shared_experts."
        shared = self._gated_mlp(x, s + "gate_proj.weight", s + "up_proj.weight",
                                 s + "down_proj.weight")
        return self._bf16(routed + shared)

    def _ffn(self, layer_id, p, x, taps, forced):
        if self._is_moe(layer_id):
            return self._moe(layer_id, p + "block_sparse_moe.", x, taps, forced)
        m = p + "mlp."
        return self._bf16(self._gated_mlp(x, m + "gate_proj.weight", m + "up_proj.weight",
                                          m + "down_proj.weight"))

    def _mixer(self, layer_id, x, taps):
        p = self._layer_prefix(layer_id) + "self_attn."
        if layer_id in self.kda_layers:
            return self._kda(layer_id, p, x, taps)
        return self._mla(p, x, taps, layer_id)

    # ------------------------------------------------------------ layers

    def _residual_layer(self, layer_id, x, taps, forced):
        p = self._layer_prefix(layer_id)
        a = self._rms_norm(x, self.w[p + "input_layernorm.weight"])
        self._tap(taps, layer_id, "attn_norm", a)
        attn = self._mixer(layer_id, a, taps)
        self._tap(taps, layer_id, "attn_out", attn)
        h = self._bf16(x + attn)
        f_in = self._rms_norm(h, self.w[p + "post_attention_layernorm.weight"])
        self._tap(taps, layer_id, "ffn_norm", f_in)
        f = self._ffn(layer_id, p, f_in, taps, forced)
        self._tap(taps, layer_id, "ffn_out", f)
        out = self._bf16(h + f)
        self._tap(taps, layer_id, "layer_out", out)
        return out

    def _attn_res_layer(self, layer_id, bank, prefix_sum, taps, forced):
        """§5: returns the running prefix P after the layer; `bank` grows in place."""
        p = self._layer_prefix(layer_id)
        h = attn_res_mix(bank + [prefix_sum], self.w[p + "self_attention_res_proj.weight"],
                         self.w[p + "self_attention_res_norm.weight"], self.eps)
        self._tap(taps, layer_id, "attn_mix", h)
        if layer_id % self.attn_res_block == 0:
            bank.append(prefix_sum)
            prefix_sum = torch.zeros_like(prefix_sum)
        a = self._rms_norm(h, self.w[p + "input_layernorm.weight"])
        self._tap(taps, layer_id, "attn_norm", a)
        attn = self._mixer(layer_id, a, taps)
        self._tap(taps, layer_id, "attn_out", attn)
        prefix_sum = prefix_sum + attn
        h = attn_res_mix(bank + [prefix_sum], self.w[p + "mlp_res_proj.weight"],
                         self.w[p + "mlp_res_norm.weight"], self.eps)
        self._tap(taps, layer_id, "ffn_mix", h)
        f_in = self._rms_norm(h, self.w[p + "post_attention_layernorm.weight"])
        self._tap(taps, layer_id, "ffn_norm", f_in)
        f = self._ffn(layer_id, p, f_in, taps, forced)
        self._tap(taps, layer_id, "ffn_out", f)
        prefix_sum = prefix_sum + f
        self._tap(taps, layer_id, "layer_out", prefix_sum)
        return prefix_sum

    # ------------------------------------------------------------ entry points

    def media_positions(self, token_ids):
        """Positions of the media placeholder id (<|media_pad|>, the top-level config's
        media_placeholder_token_id) in token_ids, in order."""
        pad = self.top_config.get("media_placeholder_token_id")
        if pad is None:
            raise ValueError("config.json has no media_placeholder_token_id")
        return [i for i, t in enumerate(token_ids) if int(t) == int(pad)]

    def _embed(self, ids, input_embeds):
        x = self.w[self.prefix + "model.embed_tokens.weight"][ids]
        if input_embeds is None:
            return x
        positions, rows = input_embeds
        positions = torch.as_tensor([int(p) for p in positions], dtype=torch.int64)
        rows = torch.as_tensor(rows, dtype=torch.float32)
        if tuple(rows.shape) != (positions.numel(), x.shape[1]):
            raise ValueError(f"input_embeds: rows {list(rows.shape)} for {positions.numel()} "
                             f"positions, hidden size {x.shape[1]}")
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= x.shape[0]
                                  or positions.unique().numel() != positions.numel()):
            raise ValueError(f"input_embeds: positions must be distinct and in [0, {x.shape[0]})")
        x[positions] = formats.round_to_bf16(rows)
        return x

    def final_hidden(self, token_ids, taps=None, forced=None, input_embeds=None):
        """The final-norm output [T, d] (BF16-valued)."""
        ids = self._check_ids(token_ids)
        if ids.numel() == 0:
            raise ValueError("empty token list")
        pm = self.prefix + "model."
        x = self._embed(ids, input_embeds)
        if self.attn_res_block:
            bank = []
            for layer_id in range(self.num_layers):
                x = self._attn_res_layer(layer_id, bank, x, taps, forced)
            x = attn_res_mix(bank + [x], self.w[pm + "output_attn_res_proj.weight"],
                             self.w[pm + "output_attn_res_norm.weight"], self.eps)
            self._tap(taps, GLOBAL_LAYER, "final_mix", x)
        else:
            for layer_id in range(self.num_layers):
                x = self._residual_layer(layer_id, x, taps, forced)
        final = self._rms_norm(x, self.w[pm + "norm.weight"])
        self._tap(taps, GLOBAL_LAYER, "final_norm", final)
        return final

    def forward(self, token_ids, taps=None, forced=None, input_embeds=None):
        """FP32 logits [T, V] of a prefill of token_ids from position 0 (input_embeds: see the
        module docstring)."""
        final = self.final_hidden(token_ids, taps, forced, input_embeds=input_embeds)
        logits = self._linear(final, self.prefix + "lm_head.weight")
        self._tap(taps, GLOBAL_LAYER, "logits", logits)
        return logits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--token-ids", type=parse_token_ids, required=True,
                        help="comma-separated token ids")
    parser.add_argument("--output", required=True, help="float32 [T, V] logits (.npy)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="bf16")
    args = parser.parse_args(argv)
    ref = KimiReference(args.model_dir, kv_cache_dtype=args.kv_cache_dtype)
    with torch.no_grad():
        np.save(args.output, ref.forward(args.token_ids).numpy().astype(np.float32))


if __name__ == "__main__":
    main()
