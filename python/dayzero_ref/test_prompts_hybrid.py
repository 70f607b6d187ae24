"""Test prompts for the decisive dayzero_hybrid tiny checkpoint
(`make_tiny dayzero_hybrid DIR --seed CHECKPOINT_SEED`), chosen to pass the margin check.

Each passes dayzero_ref.margins.check with dayzero_ref.hybrid.HybridReference (10 trials of relative
Gaussian noise of sigma 8e-3 at every BF16 rounding point; kv cache bf16, and fp8 for 40): no indexer
selection, expert choice or argmax changes. They are dayzero_ref.margins.candidate_prompt(marked,
length, 0, cap=8) over the 512 regular ids, `marked` = embedding coordinate 17 > 0
(decisive_hybrid.MARKER_COORD): at most index_topk = 8 marked tokens, so every row selects all its
visible marked keys and then the earliest unmarked ones (exact-zero scores ordered by position) —
sparse (for 40 tokens the logits move by ~0.8 against dense attention) and decisive. Valid only for
this seed and the weight design of decisive_hybrid.py.
"""

CHECKPOINT_SEED = 0

PROMPTS = {
    12: [0, 3, 43, 179, 368, 447, 419, 203, 258, 408, 370, 275],
    40: [0, 69, 92, 299, 322, 489, 2, 170, 504, 290, 89, 481, 446, 348, 478, 419, 110, 205, 236,
         164, 38, 405, 374, 481, 3, 428, 6, 205, 411, 22, 5, 360, 306, 219, 98, 72, 313, 510, 165,
         130],
}
