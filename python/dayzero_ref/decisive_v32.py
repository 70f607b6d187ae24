"""Decisive weights for the deepseek_v32 tiny checkpoint (docs/models.md §8.1).

On random weights, indexer top-k, expert routing and argmax are decided by gaps smaller than
legitimate rounding differences, so two correct implementations disagree. `shape_weights` rewrites
the plain draws of make_tiny (same names, dtypes and shapes) so that every discrete decision has a
margin well above BF16/FP8 rounding, while every block still contributes measurably:

- Embedding: coordinate 0 holds +BIAS_VALUE for every token (a constant direction the indexer and
  the query latent read); coordinates 1..16 hold ±CODE_VALUE (the token's 16 routing bits) and
  coordinate 17 ±CODE_VALUE (the token's indexer "marker"); the rest stay N(0, 1). Every d-wide
  RMSNorm weight is 1 on these 18 coordinates, so the structure reaches each block unchanged.
- Sublayer outputs are small (o_proj ×ATTN_OUT_SCALE, dense down_proj ×MLP_OUT_SCALE, expert and
  shared down_proj ×EXPERT_OUT_SCALE): the residual stream stays close to the token's embedding, so
  the structure survives the layers, yet a wrong block still moves the logits by several percent.
- Router (every MoE layer, MTP included): expert e reads one code coordinate (a per-layer
  permutation and sign) with gain ROUTER_GAIN, so |logit| ≈ 12 and σ is 0 or 1 to within 1e-5;
  the correction biases are the 16 marks of an optimal Golomb ruler, (m − 88.5)/177.5: all pair
  sums differ, so group scores (top-2 sums) and expert ranks are separated by ≥ 1/177.5 ≈ 0.0056
  (and "one bit more" never ties with a bias difference: ≥ 0.5/177.5), far above the 1e-5 wobble.
- Indexer (every layer): through the constant coordinate, every query carries one designed vector
  and every key (via the LayerNorm bias, LayerNorm weight tiny) another, so that
  q·k(s) ≈ P·g(t − s) + M·marker(s) − O with g(Δ) = (cos Δf₁₂ + cos Δf₁₃)/2 on the rotate-half
  pairs 12 and 13 (YaRN frequencies 0.027 and 0.018: g is strictly decreasing over Δ ≤ 99), head
  weights all positive (weights_proj reads the constant coordinate). Marked keys score
  (M − O + P·g) > 0, ranked by recency; unmarked keys are negative before the ReLU, score exactly
  0 and are ordered by position. So a query selects its most recent marked keys, then the earliest
  unmarked ones: content-dependent, sparse, and decisive (the selection is certain whenever at
  most K marked keys are visible; beyond that it rests on the recency steps of g). With the MLA
  (interleaved) layout in the indexer, coordinates 12 and 13 rotate at other frequencies and the
  selection changes: the §3.5 erratum is visible.
- MTP: eh_proj ≈ [I + small, small] so the head sees Emb(x_{t+1}) plus a measurable share of h_t;
  its embed_tokens and shared_head.head are copies of the main ones, as in the real checkpoint.
- lm_head: random plus LM_HEAD_GAIN × a permuted copy of the embedding's free coordinates, so the
  argmax at each position is a fixed successor of the current token with a margin of several logit
  units (MTP: of the next token).
"""

import torch

BIAS_COORD = 0
BIAS_VALUE = 4.0
CODE_COORDS = tuple(range(1, 17))
MARKER_COORD = 17
CODE_VALUE = 3.0
NUM_STRUCTURED = 18

ATTN_OUT_SCALE = 0.15
MLP_OUT_SCALE = 0.15
EXPERT_OUT_SCALE = 0.1

ROUTER_GAIN = 5.0
ROUTER_NOISE = 0.3
# An optimal 16-mark Golomb ruler (length 177): all pairwise differences distinct.
GOLOMB_16 = (0, 1, 4, 11, 26, 32, 56, 68, 76, 115, 117, 134, 150, 163, 168, 177)
BIAS_DENOMINATOR = 177.5

Q_LATENT_GAIN = 3.5        # q_a_proj row 0 reads the constant coordinate
Q_LATENT_NOMINAL = 8.0     # the resulting c_q[0], roughly
INDEX_ROPE_PAIRS = (11, 12)
INDEX_Q_ROPE = 1.0         # a_q
INDEX_K_ROPE = 1.0         # a_k: P = 2·a_q·a_k
INDEX_Q_OFFSET = -1.0      # q nope[0]
INDEX_K_OFFSET = 1.0       # k nope[0] (LayerNorm bias): O = 1.0
INDEX_Q_MARKER = 1.0       # q nope[1]
# wk row nope[1] reads the marker coordinate so strongly that the LayerNorm output there saturates
# at ±sqrt(d_I − 1) ≈ ±11.3 whatever the rest of the row; k_norm weight there: marker term M ≈ 3.
INDEX_K_MARKER_GAIN = 30.0
INDEX_K_MARKER_WEIGHT = 3.0 / 11.2
INDEX_K_NORM_WEIGHT = 0.002  # elsewhere: keys nearly constant apart from the marker
INDEX_Q_NOISE = 0.03
INDEX_W_GAIN = 1.0
INDEX_W_NOISE = 0.1

EH_NOISE_E = 0.1
EH_NOISE_H = 0.5
LM_HEAD_GAIN = 16.0


def _check_golomb():
    diffs = [b - a for i, a in enumerate(GOLOMB_16) for b in GOLOMB_16[i + 1:]]
    assert len(diffs) == len(set(diffs)), "GOLOMB_16 is not a Golomb ruler"


_check_golomb()


def _gen(seed, salt):
    g = torch.Generator()
    g.manual_seed((seed * 0x9E3779B1 + salt * 0x85EBCA77 + 12345) & 0x7FFFFFFFFFFFFFFF)
    return g


def shape_weights(c, w, seed):
    """Rewrites the logical FP32 weights `w` (name -> tensor, from make_tiny's draws) in place."""
    d, v = c["hidden_size"], c["vocab_size"]
    if d < 2 * NUM_STRUCTURED or c["n_routed_experts"] != len(GOLOMB_16):
        raise ValueError("decisive deepseek_v32 weights need hidden >= 36 and 16 routed experts")
    num_layers = c["num_hidden_layers"] + c["num_nextn_predict_layers"]

    emb = w["model.embed_tokens.weight"]
    emb[:, BIAS_COORD] = BIAS_VALUE
    emb[:, 1:NUM_STRUCTURED] = CODE_VALUE * torch.where(emb[:, 1:NUM_STRUCTURED] >= 0, 1.0, -1.0)

    for name, t in w.items():  # every d-wide RMSNorm passes the structure unchanged
        if t.shape == (d,) and name.endswith("norm.weight") and "indexer" not in name:
            t[:NUM_STRUCTURED] = 1.0

    free = emb[:, NUM_STRUCTURED:]
    successor = torch.randperm(v, generator=_gen(seed, 1))
    head = w["lm_head.weight"]
    head[successor, NUM_STRUCTURED:] += LM_HEAD_GAIN * free / free.shape[1]

    for i in range(num_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.o_proj.weight"] *= ATTN_OUT_SCALE
        shape_indexer(c, w, p + "self_attn.")
        if p + "mlp.gate.weight" in w:
            _shape_moe(c, w, p + "mlp.", seed, i)
        else:
            w[p + "mlp.down_proj.weight"] *= MLP_OUT_SCALE
        if i >= c["num_hidden_layers"]:
            w[p + "embed_tokens.weight"] = emb.clone()
            w[p + "shared_head.head.weight"] = head.clone()
            eh = w[p + "eh_proj.weight"]
            eh[:, :d] = EH_NOISE_E * eh[:, :d] + torch.eye(d)
            eh[:, d:] *= EH_NOISE_H


def _shape_moe(c, w, p, seed, layer):
    gate = w[p + "gate.weight"]
    num_experts = gate.shape[0]
    g = _gen(seed, 100 + layer)
    coords = torch.randperm(len(CODE_COORDS), generator=g)
    signs = torch.where(torch.rand(num_experts, generator=g) < 0.5, -1.0, 1.0)
    gate *= ROUTER_NOISE
    for e in range(num_experts):
        gate[e, CODE_COORDS[int(coords[e])]] += ROUTER_GAIN * float(signs[e])
    marks = torch.tensor(GOLOMB_16, dtype=torch.float32)[torch.randperm(num_experts, generator=g)]
    w[p + "gate.e_score_correction_bias"] = (marks - 88.5) / BIAS_DENOMINATOR
    for e in range(num_experts):
        w[f"{p}experts.{e}.down_proj.weight"] *= EXPERT_OUT_SCALE
    w[p + "shared_experts.down_proj.weight"] *= EXPERT_OUT_SCALE


def shape_indexer(c, w, p, rope_pairs=INDEX_ROPE_PAIRS):
    """The indexer design above for the layer under prefix p ("...self_attn."), reading the
    constant coordinate BIAS_COORD and the marker MARKER_COORD; rope_pairs: the rotate-half pairs
    carrying g (slow frequencies of the model's RoPE). dayzero_ref.decisive_hybrid reuses it."""
    n_heads, head_dim, d_r = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"]
    w[p + "q_a_proj.weight"][0, BIAS_COORD] += Q_LATENT_GAIN
    w[p + "q_a_layernorm.weight"][0] = 1.0

    q_design = torch.zeros(head_dim)
    for j in rope_pairs:  # first half of a rotate-half pair; the partner j + d_r/2 stays 0
        q_design[j] = INDEX_Q_ROPE
    q_design[d_r] = INDEX_Q_OFFSET
    q_design[d_r + 1] = INDEX_Q_MARKER
    wq_b = w[p + "indexer.wq_b.weight"]  # [n_I·d_I, r_q]
    wq_b *= INDEX_Q_NOISE
    wq_b[:, 0] += q_design.repeat(n_heads) / Q_LATENT_NOMINAL

    w[p + "indexer.wk.weight"][d_r + 1, MARKER_COORD] += INDEX_K_MARKER_GAIN
    k_weight = torch.full((head_dim,), INDEX_K_NORM_WEIGHT)
    k_weight[d_r + 1] = INDEX_K_MARKER_WEIGHT
    k_bias = w[p + "indexer.k_norm.bias"] * INDEX_K_NORM_WEIGHT
    for j in rope_pairs:
        k_bias[j] = INDEX_K_ROPE
        k_bias[j + d_r // 2] = 0.0
    k_bias[d_r] = INDEX_K_OFFSET
    k_bias[d_r + 1] = 0.0
    w[p + "indexer.k_norm.weight"] = k_weight
    w[p + "indexer.k_norm.bias"] = k_bias

    wp = w[p + "indexer.weights_proj.weight"]
    wp *= INDEX_W_NOISE
    wp[:, BIAS_COORD] += INDEX_W_GAIN

