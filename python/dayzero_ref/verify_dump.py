"""Every tap of the reference on one prompt, as .npy files for `dayzero verify`.

python -m dayzero_ref.verify_dump MODEL_DIR OUT_DIR [--token-ids 1,2,3] [--kv-cache-dtype fp8|bf16]

The reference follows config.json's model_type: deepseek_v32 → DeepseekV32Reference (kv cache
default fp8), kimi_linear / kimi_k3 → kimi.KimiReference, dayzero_hybrid → hybrid.HybridReference
(kv cache default bf16).
Writes OUT_DIR/L{layer}.{name}.npy (float32; the globals of layer −1 as Lg.{name}.npy) for every
tap of the reference's forward (deepseek_v32.py and kimi.py list them, with the reference-only
routing_ids / routing_weights that the engine's operator check forces), and OUT_DIR/token_ids.json.
Without --token-ids the prompt is the decisive 65-token one of test_prompts (deepseek_v32: longer
than the tiny checkpoint's index_topk, so the indexer really selects) or of test_prompts_kimi (Kimi:
more than four KDA chunks of 16, the last one partial); dayzero_hybrid: the 40-token prompt of
test_prompts_hybrid (past index_topk 8). For another checkpoint pass your own ids.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

from dayzero_ref import (deepseek_v32, hybrid, kimi, test_prompts, test_prompts_hybrid,
                         test_prompts_kimi)
from dayzero_ref.ref_common import load_config

DEFAULT_PROMPT_LENGTH = 65


def tap_file_name(layer_id, name):
    layer = "Lg" if layer_id == deepseek_v32.GLOBAL_LAYER else f"L{layer_id}"
    return f"{layer}.{name}.npy"


def is_kimi(model_dir):
    return load_config(model_dir).get("model_type") in kimi.KIMI_MODEL_TYPES


def is_hybrid(model_dir):
    return load_config(model_dir).get("model_type") == hybrid.MODEL_TYPE


def default_prompt(model_dir):
    if is_hybrid(model_dir):
        return test_prompts_hybrid.PROMPTS[40]
    prompts = test_prompts_kimi.PROMPTS if is_kimi(model_dir) else test_prompts.PROMPTS
    return prompts[DEFAULT_PROMPT_LENGTH]


def dump(model_dir, out_dir, token_ids, kv_cache_dtype=None):
    """kv_cache_dtype None: the model's default (deepseek_v32 fp8, Kimi bf16)."""
    if is_hybrid(model_dir):
        ref = hybrid.HybridReference(model_dir, kv_cache_dtype=kv_cache_dtype or "bf16")
    elif is_kimi(model_dir):
        ref = kimi.KimiReference(model_dir, kv_cache_dtype=kv_cache_dtype or "bf16")
    else:
        ref = deepseek_v32.DeepseekV32Reference(model_dir, kv_cache_dtype=kv_cache_dtype or "fp8")
    taps = {}
    with torch.no_grad():
        ref.forward(token_ids, taps=taps)
    os.makedirs(out_dir, exist_ok=True)
    for (layer_id, name), tensor in sorted(taps.items()):
        np.save(os.path.join(out_dir, tap_file_name(layer_id, name)),
                tensor.numpy().astype(np.float32))
    with open(os.path.join(out_dir, "token_ids.json"), "w", encoding="utf-8") as f:
        json.dump([int(t) for t in token_ids], f)
    return taps


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--token-ids", type=deepseek_v32.parse_token_ids,
                        help="comma-separated token ids (default: the decisive "
                             f"{DEFAULT_PROMPT_LENGTH}-token test prompt)")
    parser.add_argument("--kv-cache-dtype", choices=deepseek_v32.KV_CACHE_DTYPES, default=None,
                        help="default: fp8 for deepseek_v32, bf16 for Kimi models")
    args = parser.parse_args(argv)
    try:
        token_ids = args.token_ids or default_prompt(args.model_dir)
        dump(args.model_dir, args.out_dir, token_ids, args.kv_cache_dtype)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
