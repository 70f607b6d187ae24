"""Every tap of the reference on one prompt, as .npy files for `dayzero verify`.

python -m dayzero_ref.verify_dump MODEL_DIR OUT_DIR [--token-ids 1,2,3] [--kv-cache-dtype fp8|bf16]
    [--image PATH ...]

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

--image (kimi_k3 only, repeatable, in prompt order): each file goes through the K3 preprocessing
and vision.VisionReference; its taps are written as L-2.{name}.npy (vision.py lists them).
--token-ids must hold exactly Σ num_tokens media_placeholder_token_id ids (each image's
<|media_pad|> expanded); the image embeddings replace their embedding rows, in order.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

from dayzero_ref import (deepseek_v32, hybrid, kimi, test_prompts, test_prompts_hybrid,
                         test_prompts_kimi, vision)
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


def image_embeddings(model_dir, token_ids, image_paths, taps):
    """(media positions, embeddings [n, d]) of the images for the prompt; the vision taps go
    into `taps`."""
    config = load_config(model_dir)
    if config.get("model_type") != "kimi_k3":
        raise ValueError(f"--image needs a kimi_k3 checkpoint (this one is "
                         f"{config.get('model_type')!r})")
    cfg = vision.load_processor_config(model_dir)
    images = []
    for path in image_paths:
        with open(path, "rb") as f:
            data = f.read()
        try:
            images.append(vision.preprocess(data, cfg))
        except (OSError, ValueError) as e:  # PIL's UnidentifiedImageError is an OSError
            raise ValueError(f"--image {path}: {e}") from e
    pad = config["media_placeholder_token_id"]
    positions = [i for i, t in enumerate(token_ids) if int(t) == int(pad)]
    want = sum(im.num_tokens for im in images)
    if len(positions) != want:
        raise ValueError(f"--token-ids holds {len(positions)} media placeholder ids ({pad}), the "
                         f"images need {want} ({' + '.join(str(im.num_tokens) for im in images)})")
    return positions, vision.VisionReference(model_dir).encode(images, taps)


def image_placeholders(model_dir, image_paths):
    """The placeholder ids of the images, in order (the default prompt's prefix with --image)."""
    cfg = vision.load_processor_config(model_dir)
    pad = load_config(model_dir)["media_placeholder_token_id"]
    ids = []
    for path in image_paths:
        with open(path, "rb") as f:
            ids += [pad] * vision.preprocess(f.read(), cfg).num_tokens
    return ids


def dump(model_dir, out_dir, token_ids, kv_cache_dtype=None, image_paths=None,
         mxfp4_activations="bf16"):
    """kv_cache_dtype None: the model's default (deepseek_v32 fp8, Kimi bf16). image_paths:
    kimi_k3 only, see the module docstring."""
    taps = {}
    input_embeds = None
    if image_paths:
        with torch.no_grad():
            input_embeds = image_embeddings(model_dir, token_ids, image_paths, taps)
    if is_hybrid(model_dir):
        ref = hybrid.HybridReference(model_dir, kv_cache_dtype=kv_cache_dtype or "bf16")
    elif is_kimi(model_dir):
        ref = kimi.KimiReference(model_dir, kv_cache_dtype=kv_cache_dtype or "bf16")
    else:
        ref = deepseek_v32.DeepseekV32Reference(model_dir, kv_cache_dtype=kv_cache_dtype or "fp8")
    ref.mxfp4_activations = mxfp4_activations
    with torch.no_grad():
        if input_embeds is None:
            ref.forward(token_ids, taps=taps)
        else:
            ref.forward(token_ids, taps=taps, input_embeds=input_embeds)
    os.makedirs(out_dir, exist_ok=True)
    for (layer_id, name), tensor in sorted(taps.items()):
        np.save(os.path.join(out_dir, tap_file_name(layer_id, name)),
                np.asarray(tensor).astype(np.float32))
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
    parser.add_argument("--mxfp4-activations", choices=("bf16", "mxint8"), default="bf16",
                        help="what the MXFP4 weights multiply (as the engine's flag)")
    parser.add_argument("--image", action="append", default=[], metavar="PATH",
                        help="an image file (kimi_k3 only; repeatable, in prompt order)")
    args = parser.parse_args(argv)
    try:
        token_ids = args.token_ids or default_prompt(args.model_dir)
        if args.image and not args.token_ids:  # each image's placeholders, then the prompt
            token_ids = image_placeholders(args.model_dir, args.image) + list(token_ids)
        dump(args.model_dir, args.out_dir, token_ids, args.kv_cache_dtype, args.image,
             args.mxfp4_activations)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
