"""FP32 PyTorch reference of `dayzero_hybrid` (docs/recipe_dayzero_hybrid.md): the Kimi text
decoder of dayzero_ref.kimi (KDA, SwiGLU/SiTU FFNs, MoE or latent MoE, AttnRes) whose MLA layers
(linear_attn_config.full_attn_layers) are DeepSeek-V3.2 MLA with RoPE and the DSA lightning indexer.

    /usr/bin/python3 -m dayzero_ref.hybrid MODEL_DIR --token-ids 1,2,3 --output logits.npy \
        [--kv-cache-dtype bf16|fp8] [--dense-attention] [--mtp-output mtp.npy]

writes float32 logits [T, V] of a full-sequence prefill from position 0. Numerics: everything but
the MLA layers exactly as dayzero_ref.kimi (the Kimi policy of issue 4). MLA layers, as the engine's
MlaBlock + DsaIndexer:

- c_q = round(RMSNorm(round(q_a_proj(x)); q_a_layernorm, rms_norm_eps)), q = round(q_b_proj(c_q));
  kv = round(kv_a_proj_with_mqa(x)); c_kv = round(RMSNorm(kv[:r_kv]; rms_norm_eps)), with
  kv_cache_dtype "fp8" through the act_quant round trip.
- RoPE on q[..., d_n:] and kv[r_kv:], interleaved pairs (DeepSeek MLA), plain frequencies
  fl32(rope_theta^(−2i/d_r)) at angle fl32(p·f_i), rotated values rounded BF16 (no YaRN).
- k_nope / v = W_UK c_kv, W_UV c_kv in FP32, not rounded (as kimi.py: the engine keeps them FP32 so
  its prefill and absorbed forms agree; deepseek_v32.py rounds them, within its tolerance).
- The indexer is deepseek_v32.indexer_select (docs/models.md §3.2–3.3: rotate-half RoPE unless
  indexer_rope_interleave, Hadamard, FP8 act_quant, top-k with ties to the lower position);
  attention is dense scores with −inf outside the selection (plus causality), softmax FP32 with
  softmax_scale = (d_n + d_r)^−1/2; per-head output (times σ(round(g_proj(x))) with
  mla_use_output_gate) rounded BF16, then round(o_proj).

`dense_attention` (attribute, default False; `--dense-attention`): MLA layers attend to the whole
causal prefix and the selection is ignored (the indexer still runs and taps).

Taps: those of dayzero_ref.kimi plus, on MLA layers, q_latent [T, r_q], index_scores [T, T] and
index_selection [T, K]. `forced` also takes (layer_id, "index_selection") -> int [T, K'].
"""

import argparse
import math

import numpy as np
import torch

from dayzero_ref import deepseek_v32, kimi
from dayzero_ref.ref_common import GLOBAL_LAYER, parse_token_ids

MODEL_TYPE = "dayzero_hybrid"
LAYER_TAPS = kimi.LAYER_TAPS + ("index_scores", "index_selection")
KV_CACHE_DTYPES = kimi.KV_CACHE_DTYPES


class HybridReference(kimi.KimiReference):
    """A dayzero_hybrid checkpoint folder, evaluated as a full prefill from position 0.

    Attributes a test may change: those of KimiReference, plus dense_attention (True: MLA layers
    attend densely), index_topk and indexer_rope_interleave."""

    def __init__(self, model_dir, kv_cache_dtype="bf16"):
        super().__init__(model_dir, kv_cache_dtype=kv_cache_dtype)
        c = self.config
        if c.get("model_type") != MODEL_TYPE:
            raise ValueError(f"model_type {c.get('model_type')!r}: expected {MODEL_TYPE!r}")
        if c.get("mla_use_nope"):
            raise ValueError("mla_use_nope must be absent or false for dayzero_hybrid")
        if not c.get("q_lora_rank"):
            raise ValueError("dayzero_hybrid needs q_lora_rank (the indexer reads c_q)")
        if c.get("rope_scaling"):
            raise ValueError("dayzero_hybrid: rope_scaling must be null (plain RoPE)")
        self.inv_freq, self.rope_magnitude = deepseek_v32.rope_frequencies(c)
        self.index_topk = c["index_topk"]
        self.indexer_rope_interleave = bool(c.get("indexer_rope_interleave", False))
        self.dense_attention = False
        self.kv_norm_eps = self.eps
        self._forced = None

    def _mla(self, p, x, taps=None, layer_id=None, forced=None):
        c = self.config
        num_tokens = x.shape[0]
        heads, d_n, d_r, d_v, r_kv = (c["num_attention_heads"], c["qk_nope_head_dim"],
                                      c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"])
        positions = torch.arange(num_tokens)
        c_q = self._rms_norm(self._bf16(self._linear(x, p + "q_a_proj.weight")),
                             self.w[p + "q_a_layernorm.weight"])
        self._tap(taps, layer_id, "q_latent", c_q)
        q = self._bf16(self._linear(c_q, p + "q_b_proj.weight")).reshape(num_tokens, heads,
                                                                        d_n + d_r)
        q_pe = self._bf16(deepseek_v32.apply_rope(q[..., d_n:], positions, self.inv_freq,
                                                  self.rope_magnitude, True))
        kv = self._bf16(self._linear(x, p + "kv_a_proj_with_mqa.weight"))
        c_kv = self._rms_norm(kv[:, :r_kv], self.w[p + "kv_a_layernorm.weight"], self.kv_norm_eps)
        if self.kv_cache_dtype == "fp8":
            c_kv = kimi._dequant_act(c_kv)
        k_pe = self._bf16(deepseek_v32.apply_rope(kv[:, r_kv:], positions, self.inv_freq,
                                                  self.rope_magnitude, True))
        selection = deepseek_v32.indexer_select(
            self, layer_id, p + "indexer.", x, c_q, positions, taps, forced, c["index_n_heads"],
            c["index_head_dim"], d_r, self.index_topk, self.indexer_rope_interleave)
        kv_up = self._linear(c_kv, p + "kv_b_proj.weight").reshape(num_tokens, heads, d_n + d_v)
        k_nope, v = kv_up[..., :d_n], kv_up[..., d_n:]
        scores = (torch.einsum("thd,shd->hts", q[..., :d_n], k_nope)
                  + torch.einsum("thr,sr->hts", q_pe, k_pe)) * self.softmax_scale
        allowed = torch.ones(num_tokens, num_tokens, dtype=torch.bool).tril()
        if not self.dense_attention:
            allowed = allowed & deepseek_v32.selection_mask(selection, num_tokens)
        probs = torch.softmax(scores.masked_fill(~allowed[None], -math.inf), dim=-1)
        o = torch.einsum("hts,shd->thd", probs, v).reshape(num_tokens, heads * d_v)
        if p + "g_proj.weight" in self.w:  # output gate, before the rounding of o
            o = o * torch.sigmoid(self._bf16(self._linear(x, p + "g_proj.weight")))
        return self._bf16(self._linear(self._bf16(o), p + "o_proj.weight"))

    def _mixer(self, layer_id, x, taps):
        p = self._layer_prefix(layer_id) + "self_attn."
        if layer_id in self.kda_layers:
            return self._kda(layer_id, p, x, taps)
        return self._mla(p, x, taps, layer_id, self._forced)

    def final_hidden(self, token_ids, taps=None, forced=None, input_embeds=None):
        # KimiReference does not pass `forced` to the mixer; keep it for the indexer.
        self._forced = forced
        try:
            return super().final_hidden(token_ids, taps, forced, input_embeds)
        finally:
            self._forced = None

    def mtp_logits(self, token_ids, next_token=None, taps=None, forced=None):
        """MTP logits [n, V], as deepseek_v32.mtp_logits: row t predicts token t + 2 from the
        final-norm h_t and token t + 1, z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]) at
        position t through layer L = num_hidden_layers (MLA + indexer, the FFN of index L, plain
        residual), then shared_head. The inputs x_{t+1} are token_ids[1:] and `next_token` if
        given, so n = T − 1 or T."""
        m = self.num_layers
        if self.config.get("num_nextn_predict_layers", 0) < 1:
            raise ValueError("checkpoint has no MTP layer (num_nextn_predict_layers = 0)")
        final = self.final_hidden(token_ids, taps, forced)
        if taps is not None:  # the main logits too, so one call taps every decision
            self._tap(taps, GLOBAL_LAYER, "logits", self._linear(final, "lm_head.weight"))
        inputs = [int(t) for t in token_ids[1:]] + ([] if next_token is None else [int(next_token)])
        p = self._layer_prefix(m)
        head = p + "shared_head.head.weight"
        if not inputs:
            return torch.zeros(0, self.w[head].shape[0])
        ids = self._check_ids(inputs)
        n = ids.numel()
        e = self.w[p + "embed_tokens.weight"][ids]
        z = torch.cat([self._rms_norm(e, self.w[p + "enorm.weight"]),
                       self._rms_norm(final[:n], self.w[p + "hnorm.weight"])], dim=-1)
        z = self._bf16(self._linear(z, p + "eh_proj.weight"))
        self._tap(taps, m, "mtp_input", z)
        self._forced = forced
        try:
            z = self._residual_layer(m, z, taps, forced)
        finally:
            self._forced = None
        out = self._rms_norm(z, self.w[p + "shared_head.norm.weight"])
        self._tap(taps, m, "final_norm", out)
        logits = self._linear(out, head)
        self._tap(taps, m, "logits", logits)
        return logits


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--token-ids", type=parse_token_ids, required=True,
                        help="comma-separated token ids")
    parser.add_argument("--output", required=True, help="float32 [T, V] logits (.npy)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="bf16")
    parser.add_argument("--dense-attention", action="store_true",
                        help="MLA layers attend densely (the indexer's selection is ignored)")
    parser.add_argument("--mtp-output", help="also write the MTP head's float32 [T-1, V] logits")
    args = parser.parse_args(argv)
    ref = HybridReference(args.model_dir, kv_cache_dtype=args.kv_cache_dtype)
    ref.dense_attention = args.dense_attention
    with torch.no_grad():
        np.save(args.output, ref.forward(args.token_ids).numpy().astype(np.float32))
        if args.mtp_output:
            np.save(args.mtp_output, ref.mtp_logits(args.token_ids).numpy().astype(np.float32))


if __name__ == "__main__":
    main()
