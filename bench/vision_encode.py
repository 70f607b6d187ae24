#!/usr/bin/python3
"""Image encoding on Kimi-K3's vision tower (docs/vision.md, docs/performance.md "Vision
encoding"): time to preprocess and encode one image, per image token and per patch, as a fraction
of the machine's BF16 GEMM rate, and the time to first token of an image + text request, at
448 × 448 and 1792 × 1792 (and any --sizes).

The tower has K3's published shape (D 1024, 27 blocks, 12 heads of 128, MLP 4096, position table
64 × 64, projector 4096 → 4096 → 7168 width of the text side here: the tiny K3 text model, whose
prefill is negligible beside the tower) with random BF16 weights, and K3's published processor
limits (in_patch_limit 65536, 512 patches a side); the checkpoint (~0.8 GB) is written once into
--model-dir.

    bench/vision_encode.py [--dayzero build/src/dayzero/cli/dayzero] [--model-dir /tmp/dz-k3-vision]
        [--sizes 448,1792] [--repeats 3] [--threads 2] [--bf16-gflops 900]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

K3_VISION = {"patch_size": 14, "vt_hidden_size": 1024, "vt_num_hidden_layers": 27,
             "vt_num_attention_heads": 12, "qkv_hidden_size": 1536, "vt_intermediate_size": 4096,
             "init_pos_emb_height": 64, "init_pos_emb_width": 64, "init_pos_emb_time": 4,
             "pos_emb_type": "divided_fixed", "pos_emb_interpolation_mode": "bilinear",
             "norm_type": "rmsnorm", "attn_bias": False, "linear_bias": False,
             "patch_embed_proj_bias": False, "activation_func": "gelu_pytorch_tanh",
             "merge_kernel_size": [2, 2], "merge_type": "sd2_tpool",
             "mm_projector_type": "patchmergerv2", "mm_hidden_size": 1024,
             "text_hidden_size": 128, "projector_ln_eps": 1e-5}
K3_PROCESSOR = {"media_proc_cfg": {
    "patch_size": 14, "merge_kernel_size": 2, "in_patch_limit": 65536,
    "patch_limit_on_one_side": 512, "fixed_output_tokens": None,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "transparent_bg_config": {"pattern": "chessboard", "chessboard_square_size": 8,
                              "chessboard_square_on_top_left": True,
                              "chessboard_white_value": 255, "chessboard_gray_value": 180},
    "transparent_bg_fill_stage": "after_resize"}}


def make_model(model_dir):
    if os.path.exists(os.path.join(model_dir, "preprocessor_config.json")):
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            if json.load(f).get("vision_config") == K3_VISION:
                return
    from dayzero_ref import make_tiny  # pylint: disable=import-outside-toplevel
    print(f"writing a K3-shaped vision tower into {model_dir} ...", file=sys.stderr)
    make_tiny.make_tiny("kimi_k3", model_dir, seed=0, shard_bytes=1 << 31, decisive=False,
                        overrides={"vision_config": K3_VISION})
    with open(os.path.join(model_dir, "preprocessor_config.json"), "w", encoding="utf-8") as f:
        json.dump(K3_PROCESSOR, f, indent=2)


def tower_gflop(num_patches):
    """Multiply-adds × 2 of the tower and projector for one image of num_patches patches."""
    v = K3_VISION
    d, q, i = v["vt_hidden_size"], v["qkv_hidden_size"], v["vt_intermediate_size"]
    per_patch = 3 * 14 * 14 * d + v["vt_num_hidden_layers"] * (3 * q * d + d * q + 2 * i * d)
    attention = v["vt_num_hidden_layers"] * 2 * num_patches * num_patches * q  # q·kᵀ and p·v
    projector = num_patches // 4 * (16 * d * d + 4 * d * v["text_hidden_size"])
    return 2 * (per_patch * num_patches + attention + projector) / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dayzero", default=os.path.join(ROOT, "build/src/dayzero/cli/dayzero"))
    parser.add_argument("--model-dir", default=os.path.join(tempfile.gettempdir(), "dz-k3-vision"))
    parser.add_argument("--sizes", default="448,1792")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bf16-gflops", type=float, default=900.0,
                        help="the machine's BF16 GEMM rate (dayzero bench's limits) for the fraction")
    args = parser.parse_args()
    make_model(args.model_dir)
    from PIL import Image  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    print(f"K3 vision tower (random weights), {args.threads} threads, medians of {args.repeats}")
    print("| image | patches | tokens | preprocess s | encode s | ms / token | GFLOP | "
          "GFLOP/s | of BF16 rate | TTFT s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            path = os.path.join(tmp, f"{size}.png")
            Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
            runs = []
            for _ in range(args.repeats):
                proc = subprocess.run(
                    [args.dayzero, "generate", "--model", args.model_dir, "--image", path,
                     "--prompt", "Describe the picture.", "--max-tokens", "1", "--timing",
                     "--max-model-len", "20000",
                     "--threads", str(args.threads)], capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    sys.exit(f"dayzero generate failed:\n{proc.stderr}")
                runs.append([json.loads(line) for line in proc.stderr.splitlines()
                             if line.startswith("{")][0])
            runs.sort(key=lambda t: t["vision"]["encode_s"])
            t = runs[len(runs) // 2]
            tokens = t["vision"]["image_tokens"]
            patches = 4 * tokens
            gflop = tower_gflop(patches)
            encode = t["vision"]["encode_s"]
            print(f"| {size}x{size} | {patches} | {tokens} | {t['vision']['preprocess_s']:.3f} | "
                  f"{encode:.2f} | {1e3 * encode / tokens:.2f} | {gflop:.0f} | {gflop / encode:.0f} | "
                  f"{gflop / encode / args.bf16_gflops:.0%} | {t['prefill_s']:.2f} |")


if __name__ == "__main__":
    main()
