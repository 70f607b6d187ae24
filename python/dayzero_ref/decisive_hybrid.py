"""Decisive weights for the dayzero_hybrid tiny checkpoint (docs/models.md §8.1).

Its discrete decisions are expert routing, the argmax of the logits (both as Kimi) and the DSA
indexer's selection on the MLA layers (as DeepSeek-V3.2). `shape_weights` composes the two designs:

- decisive_kimi.shape_weights: constant coordinate 0, 16 code coordinates 1..16, code-reading
  routers with spread biases, small sublayer outputs, AttnRes pseudo-queries on coordinate 0,
  bigram-like lm_head.
- Coordinate 17 becomes the indexer marker (±CODE_VALUE, the sign of the draw, set before the lm_head
  is built so the head reads it like any free coordinate); every d-wide RMSNorm weight is 1 there.
- Every MLA layer's indexer gets decisive_v32.shape_indexer with the rotate-half pairs
  ROPE_PAIRS = (3, 4): with d_r = 16 and rope_theta 10⁴ their frequencies are 10^−1.5 ≈ 0.032 and
  10^−2 = 0.01, so g(Δ) = (cos 0.032Δ + cos 0.01Δ)/2 is strictly decreasing for Δ ≤ 99, as the
  YaRN pairs of the deepseek_v32 design. A query selects its most recent marked keys, then the
  earliest unmarked ones.
- The MTP layer (layer num_hidden_layers) is shaped like the main layers, and as decisive_v32's:
  its embed_tokens / shared_head.head are copies of the shaped main ones, and eh_proj passes the
  embedding of x_{t+1} nearly unchanged (identity plus small noise, the h_t half scaled down), so
  its argmax is the successor of x_{t+1}, the main model's own next choice: greedy drafts agree.
"""

import torch

from dayzero_ref import decisive_kimi, decisive_v32

MARKER_COORD = decisive_v32.MARKER_COORD  # 17, the first coordinate decisive_kimi leaves free
ROPE_PAIRS = (3, 4)


def shape_weights(c, w, seed, num_regular_ids):
    """Rewrites the logical FP32 weights `w` of a dayzero_hybrid tiny model in place (flat config,
    no tensor prefix). num_regular_ids: BPE ranks."""
    d = c["hidden_size"]
    if c["qk_rope_head_dim"] // 2 <= max(ROPE_PAIRS) or c.get("indexer_rope_interleave"):
        raise ValueError("decisive dayzero_hybrid weights need qk_rope_head_dim > 8 and the "
                         "rotate-half indexer")
    assert MARKER_COORD == decisive_kimi.NUM_STRUCTURED
    emb = w["model.embed_tokens.weight"]
    emb[:, MARKER_COORD] = decisive_kimi.CODE_VALUE * torch.where(emb[:, MARKER_COORD] >= 0,
                                                                  1.0, -1.0)
    decisive_kimi.shape_weights(c, w, seed, "", num_regular_ids)
    for name, t in w.items():
        if t.shape == (d,) and name.endswith("norm.weight") and "indexer" not in name:
            t[MARKER_COORD] = 1.0
    kda = {i - 1 for i in c["linear_attn_config"]["kda_layers"]}
    num_main = c["num_hidden_layers"]
    for i in range(num_main + c.get("num_nextn_predict_layers", 0)):
        if i not in kda:
            decisive_v32.shape_indexer(c, w, f"model.layers.{i}.self_attn.", ROPE_PAIRS)
        if i >= num_main:
            p = f"model.layers.{i}."
            w[p + "embed_tokens.weight"] = emb.clone()
            w[p + "shared_head.head.weight"] = w["lm_head.weight"].clone()
            eh = w[p + "eh_proj.weight"]
            eh[:, :d] = decisive_v32.EH_NOISE_E * eh[:, :d] + torch.eye(d)
            eh[:, d:] *= decisive_v32.EH_NOISE_H
