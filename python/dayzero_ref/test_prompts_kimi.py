"""Default Kimi test prompts (docs/models.md §8 lengths), chosen to pass the margin check.

Token-id lists for the decisive tiny checkpoints `make_tiny kimi_linear DIR --seed CHECKPOINT_SEED`
and `make_tiny kimi_k3 DIR --seed CHECKPOINT_SEED`: the same prompts serve both models. Each passes
`python -m dayzero_ref.margins DIR --test-prompts` on both (10 trials of relative Gaussian noise of
sigma 8e-3 at every BF16 rounding point, kv cache bf16): no expert choice or argmax changes. They are
dayzero_ref.margins.kimi_candidate_prompt(length, 0): uniformly random regular ids in [0, 512) (no
special ids: the Kimi tokenizer numbers its 256 specials from 512 on, so no BOS either). Valid only for
this seed and the weight design of decisive_kimi.py: re-run `--search` (and replace these) if either
changes.
"""

CHECKPOINT_SEED = 0

PROMPTS = {
    1: [330],
    5: [465, 396, 441, 21, 48],
    15: [89, 375, 407, 409, 166, 99, 402, 170, 285, 414, 17, 3, 104, 459, 363],
    16: [204, 440, 70, 403, 296, 399, 335, 263, 508, 308, 247, 6, 375, 140, 277, 400],
    17: [505, 118, 64, 40, 440, 440, 486, 118, 50, 67, 502, 266, 28, 250, 6, 83, 8],
    33: [241, 56, 269, 128, 351, 289, 403, 472, 134, 493, 127, 335, 207, 192, 266, 337, 135, 210,
        462, 254, 99, 481, 479, 344, 120, 336, 450, 190, 113, 71, 362, 225, 408],
    64: [316, 441, 415, 363, 397, 192, 2, 405, 274, 387, 152, 395, 195, 378, 434, 395, 61, 156, 299,
        423, 36, 272, 73, 113, 430, 359, 182, 314, 184, 93, 474, 483, 171, 225, 306, 22, 67, 391,
        371, 402, 233, 40, 482, 490, 124, 202, 76, 289, 336, 0, 68, 46, 356, 436, 291, 440, 433,
        462, 202, 160, 180, 69, 202, 260],
    65: [277, 352, 86, 344, 180, 343, 474, 67, 57, 437, 126, 441, 53, 391, 83, 201, 396, 204, 147,
        302, 85, 358, 242, 150, 32, 119, 487, 61, 74, 154, 392, 310, 323, 248, 171, 410, 64, 149,
        317, 353, 465, 83, 36, 342, 153, 208, 203, 459, 214, 61, 69, 117, 16, 118, 164, 90, 402,
        491, 239, 342, 438, 27, 399, 185, 344],
    100: [60, 308, 13, 259, 10, 89, 271, 10, 276, 499, 195, 413, 401, 110, 431, 97, 450, 420, 410,
        125, 426, 427, 147, 192, 310, 403, 139, 31, 273, 182, 194, 196, 246, 33, 409, 101, 81, 102,
        353, 186, 110, 476, 38, 374, 372, 19, 37, 239, 307, 357, 6, 214, 193, 23, 432, 389, 341, 95,
        100, 156, 23, 148, 229, 384, 347, 247, 170, 412, 214, 139, 442, 373, 36, 208, 93, 322, 509,
        386, 137, 251, 301, 110, 36, 250, 45, 267, 64, 125, 134, 312, 43, 487, 74, 21, 2, 24, 448,
        215, 306, 9],
}
