"""The trainable PyTorch form of dayzero's demo model (issue 7): a `dayzero_hybrid` decoder with KDA
layers, DeepSeek-V3.2 MLA layers with the DSA lightning indexer, attention residuals (AttnRes) and a
latent MoE whose routed experts ship in MXFP4. Parameter names are the checkpoint's tensor names,
so `export_tensors` is a rename-free walk of the state dict.

This is the *training* model: FP32, batched [B, T], differentiable, with the fast forms (chunked
KDA over all chunks at once, dense attention with masks). The numerics reference the engine is
checked against is python/dayzero_ref/hybrid.py, which reads the exported checkpoint; the two
agree up to the BF16 roundings the reference applies (docs/demo_model.md).

Training-only pieces:
- the indexer reads detached inputs (its loss never moves the model, as in DeepSeek-V3.2) and is
  fitted by `indexer_loss`: cross-entropy of its distribution against the MLA attention
  distribution summed over heads (KL up to a constant), over every causal position during the
  dense warm-up and over the selected positions during sparse training;
- routed experts are load-balanced without an auxiliary loss: the selection-only bias moves by
  `balance_rate` against each expert's load after every step (DeepSeek-V3);
- `fake_quant_experts` runs the routed experts through the exact MXFP4 round trip with a
  straight-through gradient for the final fine-tune.
"""

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from dayzero_ref import formats
from dayzero_ref.make_tiny import mxfp4_experts_config

DEMO_CONFIG = {
    "architectures": ["DayzeroHybridForCausalLM"],
    "model_type": "dayzero_hybrid",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 128,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 64,
    "qk_rope_head_dim": 32,
    "v_head_dim": 64,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "max_position_embeddings": 4096,
    "index_n_heads": 4,
    "index_head_dim": 128,
    "index_topk": 64,
    "linear_attn_config": {"kda_layers": [1, 2, 4, 5], "full_attn_layers": [3, 6], "num_heads": 4,
                           "head_dim": 64, "short_conv_kernel_size": 4, "gate_lower_bound": -5.0},
    "num_experts": 8,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "moe_intermediate_size": 256,
    "routed_expert_hidden_size": 128,
    "latent_moe_use_norm": True,
    "moe_router_activation_func": "sigmoid",
    "moe_renormalize": True,
    "routed_scaling_factor": 1.0,
    "use_grouped_topk": False,
    "num_expert_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "moe_layer_freq": 1,
    "hidden_act": "silu",
    "attn_res_block_size": 2,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "torch_dtype": "bfloat16",
    "quantization_config": mxfp4_experts_config(),
}

KDA_CHUNK = 16
L2_NORM_EPS = 1e-6
INDEXER_LN_EPS = 1e-6
MASKED = -1e9  # finite: masked logits must give 0·(−1e9) = 0, not 0·(−inf) = nan, in the losses


def config_copy(overrides=None):
    c = copy.deepcopy(DEMO_CONFIG)
    for key, value in (overrides or {}).items():
        c[key] = value
    return c


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps))


def bmm(a, b):
    """a @ b with BF16 operands and an FP32 result: Debian's torch runs FP32 matmuls on its generic
    BLAS (~5 GFLOP/s here) but BF16 ones on oneDNN (AMX, ~100× faster)."""
    return torch.matmul(a.to(torch.bfloat16), b.to(torch.bfloat16)).float()


class Linear(nn.Linear):
    """nn.Linear without bias computed as BF16 × BF16 → FP32 (weights stay FP32 for the optimizer)."""

    def __init__(self, n_in, n_out):
        super().__init__(n_in, n_out, bias=False)

    def forward(self, x):
        return F.linear(x.to(torch.bfloat16), self.weight.to(torch.bfloat16)).float()


def linear(n_in, n_out):
    layer = Linear(n_in, n_out)
    nn.init.normal_(layer.weight, std=n_in ** -0.5)
    return layer


def rope_inv_freq(dim, theta):
    return torch.tensor([1.0 / theta ** (2 * i / dim) for i in range(dim // 2)], dtype=torch.float32)


def apply_rope(x, cos, sin, interleaved):
    """x [B, T, ..., d_r]; cos/sin [T, d_r/2] broadcast over batch and the middle axes."""
    shape = (1, x.shape[1]) + (1,) * (x.dim() - 3) + (cos.shape[-1],)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    if interleaved:
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


# ---------------------------------------------------------------- KDA

def kda_chunked_batched(q, k, v, g, beta, chunk=KDA_CHUNK):
    """Chunked KDA (docs/models.md §4.7) for training: q, k, v, g [B, T, H, d] (q, k L2-normalised, g
    the log decay, bounded below so that a chunk's decay stays within e^±(C/2·|lb|)), beta
    [B, T, H]; T % chunk == 0; zero initial state. Returns o [B, T, H, d] FP32.

    Inside a chunk the pairwise decay exp(Γ_r − Γ_c) is factored through the chunk's middle row,
    q̃_r = q_r·exp(Γ_r − Γ_m), k̃_c = k_c·exp(Γ_m − Γ_c), so the intra-chunk products are plain
    BF16 matmuls over all chunks at once; with |g| ≤ 5 and C = 16 the factors stay within e^±40.
    Only the state update runs chunk by chunk."""
    bsz, num_tokens, heads, dim = q.shape
    n = num_tokens // chunk
    scale = dim ** -0.5

    def chunks(t):  # [B, T, H, ...] -> [B, H, N, C, ...]
        t = t.reshape(bsz, n, chunk, heads, *t.shape[3:])
        return t.permute(0, 3, 1, 2, *range(4, t.dim()))

    q, k, v, g = chunks(q), chunks(k), chunks(v), chunks(g)
    beta = chunks(beta)                                            # [B, H, N, C]
    gamma = torch.cumsum(g, dim=3)                                 # [B, H, N, C, d]
    mid = gamma[:, :, :, chunk // 2:chunk // 2 + 1]
    q_t = q * torch.exp(gamma - mid)
    k_t = k * torch.exp(mid - gamma)
    k_r = k * torch.exp(gamma - mid)                               # k_r on the query side of L
    lower = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    strict = torch.ones(chunk, chunk, dtype=torch.bool).tril(-1)
    kk = bmm(k_r, k_t.transpose(-1, -2))                           # [B, H, N, r, c]
    ell = (beta[..., None] * kk).masked_fill(~strict, 0.0)
    attn = (scale * bmm(q_t, k_t.transpose(-1, -2))).masked_fill(~lower, 0.0)
    system = torch.eye(chunk) + ell                                # (I + L), unit lower triangular
    eg = torch.exp(gamma)
    u = torch.linalg.solve_triangular(system, beta[..., None] * v, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, beta[..., None] * eg * k, upper=False,
                                      unitriangular=True)
    tail = torch.exp(gamma[:, :, :, -1:, :] - gamma) * k           # exp(Γ_last − Γ_c) ⊙ k_c
    last = torch.exp(gamma[:, :, :, -1, :])                        # [B, H, N, d_k]
    qs = scale * eg * q
    state = q.new_zeros(bsz, heads, dim, dim)                      # [B, H, d_v, d_k]
    outs = []
    for i in range(n):
        vn = u[:, :, i] - bmm(w[:, :, i], state.transpose(-1, -2))
        outs.append(bmm(qs[:, :, i], state.transpose(-1, -2)) + bmm(attn[:, :, i], vn))
        state = state * last[:, :, i, None, :] + bmm(vn.transpose(-1, -2), tail[:, :, i])
    o = torch.stack(outs, dim=2)                                   # [B, H, N, C, d]
    return o.permute(0, 2, 3, 1, 4).reshape(bsz, num_tokens, heads, dim)


class Kda(nn.Module):
    def __init__(self, c):
        super().__init__()
        la = c["linear_attn_config"]
        d, self.heads, self.dim = c["hidden_size"], la["num_heads"], la["head_dim"]
        width, conv = self.heads * self.dim, la["short_conv_kernel_size"]
        self.lower_bound = float(la["gate_lower_bound"])
        self.eps = c["rms_norm_eps"]
        for name in "qkv":
            setattr(self, f"{name}_proj", linear(d, width))
            layer = nn.Conv1d(width, width, conv, groups=width, bias=False, padding=conv - 1)
            nn.init.normal_(layer.weight, std=conv ** -0.5)
            setattr(self, f"{name}_conv1d", layer)
        self.f_a_proj = linear(d, self.dim)
        self.f_b_proj = linear(self.dim, width)
        self.b_proj = linear(d, self.heads)
        # Bounded gate: A_log is stored padded to head_dim; the first num_heads entries are used.
        a_log = torch.zeros(self.dim)
        a_log[:self.heads] = torch.linspace(0.0, math.log(4.0), self.heads)
        self.A_log = nn.Parameter(a_log)
        self.dt_bias = nn.Parameter(torch.empty(width).uniform_(-2.0, 2.0))
        self.g_a_proj = linear(d, self.dim)
        self.g_b_proj = linear(self.dim, width)
        self.o_norm = RMSNorm(self.dim, self.eps)
        self.o_proj = linear(width, d)

    def _conv(self, name, x):
        pre = getattr(self, f"{name}_proj")(x).transpose(1, 2)     # [B, C, T]
        y = getattr(self, f"{name}_conv1d")(pre)[..., :x.shape[1]]  # causal: drop the right pad
        return F.silu(y.transpose(1, 2))

    def forward(self, x):
        bsz, num_tokens, _ = x.shape
        shape = (bsz, num_tokens, self.heads, self.dim)
        q = self._conv("q", x).reshape(shape)
        k = self._conv("k", x).reshape(shape)
        v = self._conv("v", x).reshape(shape)
        q = q * torch.rsqrt(q.pow(2).sum(-1, keepdim=True) + L2_NORM_EPS)
        k = k * torch.rsqrt(k.pow(2).sum(-1, keepdim=True) + L2_NORM_EPS)
        f = (self.f_b_proj(self.f_a_proj(x)) + self.dt_bias).reshape(shape)
        a = torch.exp(self.A_log[:self.heads])[:, None]
        g = self.lower_bound * torch.sigmoid(a * f)
        beta = torch.sigmoid(self.b_proj(x))
        o = kda_chunked_batched(q, k, v, g, beta)
        z = self.g_b_proj(self.g_a_proj(x)).reshape(shape)
        y = self.o_norm(o) * torch.sigmoid(z)
        return self.o_proj(y.reshape(bsz, num_tokens, -1))


# ---------------------------------------------------------------- MLA + DSA indexer

class Indexer(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, rq = c["hidden_size"], c["q_lora_rank"]
        self.heads, self.dim, self.rope = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"]
        self.wq_b = linear(rq, self.heads * self.dim)
        self.wk = linear(d, self.dim)
        self.k_norm = nn.LayerNorm(self.dim, eps=INDEXER_LN_EPS)
        self.weights_proj = linear(d, self.heads)

    def forward(self, x, c_q, cos, sin):
        """Index scores I [B, T, S] (no mask) from detached inputs (docs/models.md §3.2): rotate-half
        RoPE on the first d_r dims of q and k; the engine's Hadamard and FP8 round trip change
        nothing but rounding and are left out here."""
        bsz, num_tokens, _ = x.shape
        x, c_q = x.detach(), c_q.detach()
        q = self.wq_b(c_q).reshape(bsz, num_tokens, self.heads, self.dim)
        q = torch.cat([apply_rope(q[..., :self.rope], cos, sin, False), q[..., self.rope:]], -1)
        k = self.k_norm(self.wk(x))
        k = torch.cat([apply_rope(k[..., :self.rope], cos, sin, False), k[..., self.rope:]], -1)
        w = self.weights_proj(x) * (self.heads ** -0.5 * self.dim ** -0.5)  # [B, T, n_I]
        dots = torch.relu(bmm(q.flatten(1, 2), k.transpose(1, 2)))   # [B, T·n_I, S]
        return (dots.reshape(bsz, num_tokens, self.heads, -1) * w[..., None]).sum(2)


class Mla(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, self.heads = c["hidden_size"], c["num_attention_heads"]
        self.rq, self.rkv = c["q_lora_rank"], c["kv_lora_rank"]
        self.dn, self.dr, self.dv = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.topk = c["index_topk"]
        eps = c["rms_norm_eps"]
        self.q_a_proj = linear(d, self.rq)
        self.q_a_layernorm = RMSNorm(self.rq, eps)
        self.q_b_proj = linear(self.rq, self.heads * (self.dn + self.dr))
        self.kv_a_proj_with_mqa = linear(d, self.rkv + self.dr)
        self.kv_a_layernorm = RMSNorm(self.rkv, eps)
        self.kv_b_proj = linear(self.rkv, self.heads * (self.dn + self.dv))
        self.o_proj = linear(self.heads * self.dv, d)
        self.indexer = Indexer(c)
        self.scale = (self.dn + self.dr) ** -0.5

    def forward(self, x, cos, sin, mode, stats):
        """mode: "dense" (causal attention, indexer fitted to it) or "sparse" (attention over the
        indexer's top-k, the fit restricted to those positions)."""
        bsz, num_tokens, _ = x.shape
        c_q = self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_b_proj(c_q).reshape(bsz, num_tokens, self.heads, self.dn + self.dr)
        q_pe = apply_rope(q[..., self.dn:], cos, sin, True)
        kv = self.kv_a_proj_with_mqa(x)
        c_kv = self.kv_a_layernorm(kv[..., :self.rkv])
        k_pe = apply_rope(kv[..., self.rkv:], cos, sin, True)     # [B, T, d_r], shared by heads
        up = self.kv_b_proj(c_kv).reshape(bsz, num_tokens, self.heads, self.dn + self.dv)
        k_nope, v = up[..., :self.dn], up[..., self.dn:]
        scores = (bmm(q[..., :self.dn].transpose(1, 2), k_nope.permute(0, 2, 3, 1))
                  + bmm(q_pe.transpose(1, 2), k_pe.transpose(1, 2)[:, None])) * self.scale
        causal = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
        index = self.indexer(x, c_q, cos, sin)                     # [B, T, S]
        allowed = causal.expand(bsz, num_tokens, num_tokens)
        if mode == "sparse" and self.topk < num_tokens:
            top = index.masked_fill(~causal, -math.inf).topk(self.topk, dim=-1).indices
            chosen = torch.zeros_like(allowed).scatter_(-1, top, True)
            allowed = allowed & chosen
        probs = torch.softmax(scores.masked_fill(~allowed[:, None], -math.inf), dim=-1)
        o = bmm(probs, v.transpose(1, 2)).transpose(1, 2).reshape(bsz, num_tokens, -1)
        target = probs.detach().sum(dim=1)
        target = target / target.sum(dim=-1, keepdim=True)        # [B, T, S]
        log_q = torch.log_softmax(index.masked_fill(~allowed, MASKED), dim=-1)
        ce = -(target * log_q).sum(-1).mean()
        entropy = -(target * torch.log(target.clamp_min(1e-30))).sum(-1).mean()
        stats["indexer_ce"] = stats.get("indexer_ce", 0.0) + ce
        stats["indexer_kl"] = stats.get("indexer_kl", 0.0) + float(ce.detach() - entropy)
        return self.o_proj(o)


# ---------------------------------------------------------------- FFN

class GatedMlp(nn.Module):
    def __init__(self, d, inter, names=("gate_proj", "up_proj", "down_proj")):
        super().__init__()
        self.names = names
        setattr(self, names[0], linear(d, inter))
        setattr(self, names[1], linear(d, inter))
        setattr(self, names[2], linear(inter, d))

    def forward(self, x, fake_quant=False):
        gate, up, down = (getattr(self, n) for n in self.names)
        if fake_quant:
            h = F.silu(bmm(x, mxfp4_ste(gate.weight).t())) * bmm(x, mxfp4_ste(up.weight).t())
            return bmm(h, mxfp4_ste(down.weight).t())
        return down(F.silu(gate(x)) * up(x))


def mxfp4_ste(w):
    """The exact MXFP4 round trip of the exported weight, with a straight-through gradient."""
    with torch.no_grad():
        packed, scale = formats.quantize_mxfp4_compressed_tensors(w)
        q = formats.dequantize_mxfp4_compressed_tensors(packed, scale)
    return w + (q - w).detach()


class Gate(nn.Module):
    def __init__(self, d, num_experts):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(num_experts, d) * d ** -0.5)
        self.register_buffer("e_score_correction_bias", torch.zeros(num_experts))


class LatentMoe(nn.Module):
    def __init__(self, c):
        super().__init__()
        d, lat, mi = c["hidden_size"], c["routed_expert_hidden_size"], c["moe_intermediate_size"]
        self.num_experts, self.top_k = c["num_experts"], c["num_experts_per_token"]
        self.gate = Gate(d, self.num_experts)
        self.routed_expert_down_proj = linear(d, lat)
        self.routed_expert_norm = RMSNorm(lat, c["rms_norm_eps"])
        self.routed_expert_up_proj = linear(lat, d)
        self.experts = nn.ModuleList(GatedMlp(lat, mi, ("w1", "w3", "w2"))
                                     for _ in range(self.num_experts))
        self.shared_experts = GatedMlp(d, mi * c["num_shared_experts"])
        self.fake_quant = False

    def forward(self, x, stats):
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(bmm(x, self.gate.weight.t()))
        ids = (scores.detach() + self.gate.e_score_correction_bias).topk(self.top_k, dim=-1).indices
        picked = scores.gather(1, ids)
        weights = picked / (picked.sum(-1, keepdim=True) + 1e-20)
        z = self.routed_expert_down_proj(x)
        routed = torch.zeros_like(z)
        load = torch.bincount(ids.reshape(-1), minlength=self.num_experts)
        for e in range(self.num_experts):
            rows, slots = torch.nonzero(ids == e, as_tuple=True)
            if rows.numel() == 0:
                continue
            # Rows padded to a multiple of 256: oneDNN builds a primitive per GEMM shape, and
            # unpadded expert batches would present a new shape (and a JIT compile) every step.
            num = rows.numel()
            z_e = F.pad(z[rows], (0, 0, 0, -num % 256))
            y = self.experts[e](z_e, self.fake_quant)[:num]
            routed = routed.index_add(0, rows, y * weights[rows, slots][:, None])
        stats.setdefault("loads", []).append((self, load))
        out = self.routed_expert_up_proj(self.routed_expert_norm(routed)) + self.shared_experts(x)
        return out.reshape(shape)


# ---------------------------------------------------------------- layers and model

class Layer(nn.Module):
    def __init__(self, c, layer_id, is_kda):
        super().__init__()
        d, eps = c["hidden_size"], c["rms_norm_eps"]
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.self_attn = Kda(c) if is_kda else Mla(c)
        self.is_kda = is_kda
        if layer_id < c["first_k_dense_replace"]:
            self.mlp = GatedMlp(d, c["intermediate_size"])
        else:
            self.block_sparse_moe = LatentMoe(c)
        # AttnRes queries (docs/models.md §5): p = softmax_j((cw·v_j)·rms(v_j)^−1), cw = norm ⊙ proj;
        # a zero proj starts as the plain mean of the rows.
        self.self_attention_res_proj = Linear(d, 1)
        self.self_attention_res_norm = RMSNorm(d, eps)
        self.mlp_res_proj = Linear(d, 1)
        self.mlp_res_norm = RMSNorm(d, eps)
        nn.init.zeros_(self.self_attention_res_proj.weight)
        nn.init.zeros_(self.mlp_res_proj.weight)

    def ffn(self, x, stats):
        if hasattr(self, "mlp"):
            return self.mlp(x)
        return self.block_sparse_moe(x, stats)


class DemoModel(nn.Module):
    def __init__(self, c=None):
        super().__init__()
        c = c or config_copy()
        self.config = c
        d, eps = c["hidden_size"], c["rms_norm_eps"]
        kda = {i - 1 for i in c["linear_attn_config"]["kda_layers"]}
        self.block = c["attn_res_block_size"]
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(c["vocab_size"], d)
        nn.init.normal_(self.model.embed_tokens.weight, std=1.0)
        self.model.layers = nn.ModuleList(Layer(c, i, i in kda) for i in range(c["num_hidden_layers"]))
        self.model.output_attn_res_proj = Linear(d, 1)
        nn.init.zeros_(self.model.output_attn_res_proj.weight)
        self.model.output_attn_res_norm = RMSNorm(d, eps)
        self.model.norm = RMSNorm(d, eps)
        self.lm_head = linear(d, c["vocab_size"])
        self.eps = eps
        self.inv_freq = rope_inv_freq(c["qk_rope_head_dim"], c["rope_theta"])

    def _mix(self, proj, norm, rows):
        cw = norm.weight * proj.weight[0]
        v = torch.stack(rows)
        s = (v @ cw) * torch.rsqrt(v.pow(2).mean(-1) + self.eps)
        return (torch.softmax(s, dim=0)[..., None] * v).sum(0)

    def rope(self, num_tokens):
        """(cos, sin) [T, d_r/2] of positions 0..T−1."""
        angle = torch.arange(num_tokens, dtype=torch.float32)[:, None] * self.inv_freq[None, :]
        return torch.cos(angle), torch.sin(angle)

    def forward(self, ids, mode="dense", stats=None):
        """ids [B, T] -> logits [B, T, V]; `stats` collects indexer losses and expert loads."""
        return self.lm_head(self.final_hidden(ids, mode, stats))

    def final_hidden(self, ids, mode="dense", stats=None):
        """ids [B, T] -> the model.norm output [B, T, d] (what lm_head and the MTP head read)."""
        stats = {} if stats is None else stats
        cos, sin = self.rope(ids.shape[1])
        p = self.model.embed_tokens(ids)
        bank = []
        for i, layer in enumerate(self.model.layers):
            h = self._mix(layer.self_attention_res_proj, layer.self_attention_res_norm, bank + [p])
            if i % self.block == 0:
                bank.append(p)
                p = torch.zeros_like(p)
            a = layer.input_layernorm(h)
            attn = layer.self_attn(a) if layer.is_kda else layer.self_attn(a, cos, sin, mode, stats)
            p = p + attn
            h = self._mix(layer.mlp_res_proj, layer.mlp_res_norm, bank + [p])
            p = p + layer.ffn(layer.post_attention_layernorm(h), stats)
        x = self._mix(self.model.output_attn_res_proj, self.model.output_attn_res_norm, bank + [p])
        return self.model.norm(x)

    def moe_blocks(self):
        return [layer.block_sparse_moe for layer in self.model.layers
                if hasattr(layer, "block_sparse_moe")]

    def set_fake_quant(self, on):
        for moe in self.moe_blocks():
            moe.fake_quant = on


class MtpLayer(nn.Module):
    """The demo's MTP layer (model/mtp_layer.h in the engine, docs/demo_model.md): row t predicts
    token t + 2 from the trunk's final-norm h_t and token t + 1, z = eh_proj([enorm(Emb(x_{t+1})) ;
    hnorm(h_t)]) through an MLA + DSA + latent-MoE layer with the plain residual, then
    shared_head.norm and the trunk's lm_head (embedding and head are the trunk's, frozen).
    Parameter names are the checkpoint's under model.layers.<num_hidden_layers>."""

    def __init__(self, c):
        super().__init__()
        d, eps = c["hidden_size"], c["rms_norm_eps"]
        self.enorm = RMSNorm(d, eps)
        self.hnorm = RMSNorm(d, eps)
        self.eh_proj = linear(2 * d, d)
        self.input_layernorm = RMSNorm(d, eps)
        self.post_attention_layernorm = RMSNorm(d, eps)
        self.self_attn = Mla(c)
        self.block_sparse_moe = LatentMoe(c)
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(d, eps)

    def forward(self, trunk, hidden, next_ids, mode="sparse", stats=None):
        """hidden [B, T, d] the trunk's final-norm rows, next_ids [B, T] the tokens x_{t+1} ->
        logits [B, T, V] predicting x_{t+2}."""
        stats = {} if stats is None else stats
        cos, sin = trunk.rope(next_ids.shape[1])
        e = trunk.model.embed_tokens(next_ids)
        z = self.eh_proj(torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1))
        z = z + self.self_attn(self.input_layernorm(z), cos, sin, mode, stats)
        z = z + self.block_sparse_moe(self.post_attention_layernorm(z), stats)
        return trunk.lm_head(self.shared_head.norm(z))


def export_tensors(model, prefix=""):
    """Checkpoint tensors (name -> torch tensor or (packed, scale) for MXFP4 experts): BF16 weights,
    F32 for what the layout keeps in F32 (A_log, dt_bias, conv, o_norm, indexer LayerNorm, router
    bias), MXFP4 compressed-tensors for routed experts. `prefix` goes before every name."""
    state = model.state_dict()
    tensors = {}
    for name in state:
        w = state[name].detach().float()
        if ".experts." in name:
            base = name[:-len(".weight")]
            packed, scale = formats.quantize_mxfp4_compressed_tensors(w)
            tensors[prefix + base + ".weight_packed"] = packed.to(torch.uint8)
            tensors[prefix + base + ".weight_scale"] = scale.to(torch.uint8)
        elif (name.endswith(("A_log", "dt_bias", "e_score_correction_bias", "o_norm.weight"))
              or "_conv1d." in name or "indexer.k_norm." in name):
            tensors[prefix + name] = w.contiguous()
        else:
            tensors[prefix + name] = w.to(torch.bfloat16).contiguous()
    return tensors
