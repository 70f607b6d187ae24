"""Every tap of the deepseek_v32 reference on one prompt, as .npy files for `dayzero verify`.

python -m dayzero_ref.verify_dump MODEL_DIR OUT_DIR [--token-ids 1,2,3] [--kv-cache-dtype fp8|bf16]

Writes OUT_DIR/L{layer}.{name}.npy (float32; the globals of layer −1 as Lg.{name}.npy) for every
tap of DeepseekV32Reference.forward (deepseek_v32.py lists them, with the reference-only
routing_ids / routing_weights that the engine's operator check forces), and OUT_DIR/token_ids.json.
Without --token-ids the prompt is the decisive 65-token one of test_prompts (longer than the tiny
checkpoint's index_topk, so the indexer really selects); for another checkpoint pass your own ids.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

from dayzero_ref import deepseek_v32, test_prompts

DEFAULT_PROMPT_LENGTH = 65


def tap_file_name(layer_id, name):
    layer = "Lg" if layer_id == deepseek_v32.GLOBAL_LAYER else f"L{layer_id}"
    return f"{layer}.{name}.npy"


def dump(model_dir, out_dir, token_ids, kv_cache_dtype):
    ref = deepseek_v32.DeepseekV32Reference(model_dir, kv_cache_dtype=kv_cache_dtype)
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
    parser.add_argument("--kv-cache-dtype", choices=deepseek_v32.KV_CACHE_DTYPES, default="fp8")
    args = parser.parse_args(argv)
    token_ids = args.token_ids or test_prompts.PROMPTS[DEFAULT_PROMPT_LENGTH]
    try:
        dump(args.model_dir, args.out_dir, token_ids, args.kv_cache_dtype)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
