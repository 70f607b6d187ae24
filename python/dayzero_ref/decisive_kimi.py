"""Decisive weights for the kimi_linear and kimi_k3 tiny checkpoints (docs/models.md §8.1).

The discrete decisions of these models are expert routing (every MoE layer) and the argmax of the
logits. `shape_weights` rewrites make_tiny's plain draws (same names, dtypes and shapes) so that each
has a margin far above BF16 rounding, while every block still contributes measurably:

- Embedding: coordinate 0 holds +BIAS_VALUE for every token (the constant direction the AttnRes
  pseudo-queries read); coordinates 1..16 hold ±CODE_VALUE (the token's 16 routing bits); the rest
  stay N(0, 1). Every d-wide RMSNorm weight (layer norms, AttnRes norms, final norm) is 1 on these
  17 coordinates, so the structure reaches each block unchanged.
- Sublayer outputs are small (every o_proj ×ATTN_OUT_SCALE, the dense down_proj ×MLP_OUT_SCALE, the
  experts' output ×EXPERT_OUT_SCALE: w2 for Kimi-Linear, routed_expert_up_proj for K3 because the
  latent RMSNorm would undo a scale on w2, and the shared down_proj), and their row 0 is zero: the
  residual stream (Kimi-Linear) or the embedding row of the AttnRes bank (K3) keeps the token's
  structure, and no sublayer output has a component along the constant direction.
- Router (every MoE layer): expert e reads one code coordinate (a per-layer choice without repeats
  and a sign) with gain ROUTER_GAIN, so |logit| ≈ 10 and σ is 0 or 1 to within 1e-4; the correction
  biases are evenly spaced, (rank − (E − 1)/2)/(E + 1/2), all within (−1/2, 1/2): experts with the
  bit set are ranked by bias above the others, and every biased-score gap at the top-k boundary is at
  least 1/(E + 1/2) (0.12 for E = 8, 0.06 for E = 16) against a wobble of about 1e-5.
- AttnRes (K3): every pseudo-query (self_attention_res_proj, mlp_res_proj, output_attn_res_proj)
  gets RES_QUERY on coordinate 0 (its random part stays), so the embedding row scores about
  RES_QUERY·BIAS_VALUE/rms(emb) ≈ 2 above the others and keeps most of the weight, while the
  sublayer rows still get a measurable share.
- KDA gates stay spread as §8 says (A_log over [0, ln 16], dt_bias over [−3, 3]); for the bounded
  K3 gate the last head's dt_bias is drawn from [K3_FAST_DT_LOW, 3], so its g sits at −5 (σ saturated)
  on almost every channel: the fast-decaying extreme of the bounded gate is exercised.
- lm_head: random plus LM_HEAD_GAIN × a permuted copy of the embedding's free coordinates, so the
  argmax at each position is a fixed successor of the current token with a margin of several logit
  units. The successor of a regular id (< number of BPE ranks) is again a regular id, so greedy
  generation from a regular prompt never emits a special token.
- Vision (K3, `shape_projector`): the projector's last linear makes every image token look like
  one regular token with noise: its rows for coordinate 0 and the code coordinates are constants
  (+, and a fixed sign per code), which times the GELU output's sum (positive, about 72 ± 10 at
  the tiny sizes) give the token structure with a wide margin; the free rows are that token's
  embedding over the same sum plus noise of relative size IMAGE_NOISE. The post-norm removes the
  sum's scale. Image positions then route and take their argmax as decisively as text ones, while
  their embeddings still differ from image to image and from patch to patch.
"""

import torch

BIAS_COORD = 0
BIAS_VALUE = 4.0
CODE_COORDS = tuple(range(1, 17))
CODE_VALUE = 3.0
NUM_STRUCTURED = 17

ATTN_OUT_SCALE = 0.15
MLP_OUT_SCALE = 0.15
EXPERT_OUT_SCALE = 0.1

ROUTER_GAIN = 5.0
ROUTER_NOISE = 0.3
RES_QUERY = 0.75
K3_FAST_DT_LOW = 2.0
LM_HEAD_GAIN = 16.0
IMAGE_TOKEN = 300  # the regular token an image token resembles
IMAGE_NOISE = 0.3
GELU_SUM = 72.0  # E[Σ gelu(z)] over 256 channels of z ~ N(0, 1): 256 · 0.282


def _gen(seed, salt):
    g = torch.Generator()
    g.manual_seed((seed * 0x9E3779B1 + salt * 0x85EBCA77 + 54321) & 0x7FFFFFFFFFFFFFFF)
    return g


def router_biases(num_experts, generator):
    """Evenly spaced correction biases in (−1/2, 1/2), in a random order over the experts."""
    ranks = torch.randperm(num_experts, generator=generator).float()
    return (ranks - (num_experts - 1) / 2) / (num_experts + 0.5)


def shape_weights(c, w, seed, prefix, num_regular_ids):
    """Rewrites the logical FP32 weights `w` (name -> tensor) of a kimi_linear / kimi_k3 tiny model
    in place. c: the text config; prefix: "" or "language_model."; num_regular_ids: BPE ranks."""
    d = c["hidden_size"]
    if d < 2 * NUM_STRUCTURED or c["num_experts"] > len(CODE_COORDS):
        raise ValueError("decisive kimi weights need hidden >= 34 and at most 16 routed experts")
    pm = prefix + "model."
    emb = w[pm + "embed_tokens.weight"]
    emb[:, BIAS_COORD] = BIAS_VALUE
    emb[:, 1:NUM_STRUCTURED] = CODE_VALUE * torch.where(emb[:, 1:NUM_STRUCTURED] >= 0, 1.0, -1.0)

    for name, t in w.items():  # every d-wide RMSNorm passes the structure unchanged
        if t.shape == (d,) and name.endswith("norm.weight"):
            t[:NUM_STRUCTURED] = 1.0
        if name.endswith("res_proj.weight"):
            t[0, BIAS_COORD] = RES_QUERY

    free = emb[:num_regular_ids, NUM_STRUCTURED:]
    successor = torch.randperm(num_regular_ids, generator=_gen(seed, 1))
    head = w[prefix + "lm_head.weight"]
    head[successor, NUM_STRUCTURED:] += LM_HEAD_GAIN * free / free.shape[1]

    bounded = "gate_lower_bound" in c["linear_attn_config"]
    heads, head_dim = c["linear_attn_config"]["num_heads"], c["linear_attn_config"]["head_dim"]
    for i in range(c["num_hidden_layers"] + c.get("num_nextn_predict_layers", 0)):
        p = f"{pm}layers.{i}."
        _scale_rows(w[p + "self_attn.o_proj.weight"], ATTN_OUT_SCALE)
        if bounded and p + "self_attn.dt_bias" in w:
            fast = torch.rand(head_dim, generator=_gen(seed, 200 + i))
            w[p + "self_attn.dt_bias"][(heads - 1) * head_dim:heads * head_dim] = (
                K3_FAST_DT_LOW + (3.0 - K3_FAST_DT_LOW) * fast)
        if p + "mlp.down_proj.weight" in w:
            _scale_rows(w[p + "mlp.down_proj.weight"], MLP_OUT_SCALE)
        if p + "block_sparse_moe.gate.weight" in w:
            _shape_moe(c, w, p + "block_sparse_moe.", seed, i)


def _scale_rows(t, scale):
    t *= scale
    t[BIAS_COORD] = 0.0


def _shape_moe(c, w, p, seed, layer):
    gate = w[p + "gate.weight"]
    num_experts = gate.shape[0]
    g = _gen(seed, 100 + layer)
    coords = torch.randperm(len(CODE_COORDS), generator=g)[:num_experts]
    signs = torch.where(torch.rand(num_experts, generator=g) < 0.5, -1.0, 1.0)
    gate *= ROUTER_NOISE
    for e in range(num_experts):
        gate[e, CODE_COORDS[int(coords[e])]] += ROUTER_GAIN * float(signs[e])
    w[p + "gate.e_score_correction_bias"] = router_biases(num_experts, g)
    if p + "routed_expert_up_proj.weight" in w:  # latent: the norm would undo a scale on w2
        _scale_rows(w[p + "routed_expert_up_proj.weight"], EXPERT_OUT_SCALE)
    else:
        for e in range(num_experts):
            _scale_rows(w[f"{p}experts.{e}.w2.weight"], EXPERT_OUT_SCALE)
    _scale_rows(w[p + "shared_experts.down_proj.weight"], EXPERT_OUT_SCALE)


def shape_projector(text_config, w, seed, prefix):
    """Rewrites mm_projector.proj.2 and post_norm (after shape_weights, which set the embedding)."""
    emb = w[prefix + "model.embed_tokens.weight"]
    proj = w["mm_projector.proj.2.weight"]
    rows, cols = proj.shape
    g = _gen(seed, 0x56495349)
    target = emb[IMAGE_TOKEN].clone()
    proj.copy_(target[:, None].expand(rows, cols) / GELU_SUM)
    noise = torch.randn((rows, cols), generator=g) * (IMAGE_NOISE / (cols * 0.425) ** 0.5)
    proj[NUM_STRUCTURED:] += noise[NUM_STRUCTURED:]
    w["mm_projector.post_norm.weight"].fill_(1.0)
