"""Prefill throughput of the demo model: dayzero against the PyTorch peer, in the same run.

    PYTHONPATH=python /usr/bin/python3 bench/peer_prefill_demo.py [--dayzero build/src/dayzero/cli/dayzero]
        [--windows 64] [--context 256] [--threads 2]

The peer is python/dayzero_ref/demo_model.DemoModel, the training model (Debian's torch 1.13, every
matmul BF16 x BF16 -> FP32 on oneDNN, the fastest path that torch build has; FP32 GEMM there is a
generic BLAS), loaded with the shipped weights (MXFP4 experts decoded exactly), in eval mode with
sparse attention, batches of 16 windows. dayzero runs `dayzero perplexity` over the same windows
(one window per prefill, as it serves). Both score the same held-out tokens; the script prints
tokens/s for each, the ratio, and both mean NLLs (they must agree: same model).
"""

import argparse
import json
import math
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dayzero_ref import demo_eval, demo_model
from dayzero_ref.bpe_train import ByteLevelBpe
from dayzero_ref.ref_common import load_config, load_tensors

kRepo = Path(__file__).resolve().parents[1]
kModel = kRepo / "models" / "demo"


def load_peer():
    model = demo_model.DemoModel(load_config(str(kModel)))
    tensors = load_tensors(str(kModel), model.config)
    state = model.state_dict()
    missing = [name for name in state if name not in tensors]
    if missing:
        raise SystemExit(f"checkpoint lacks {missing[:3]}")
    model.load_state_dict({name: tensors[name].float().reshape(state[name].shape) for name in state})
    return model.eval()


def token_windows(context, windows):
    tokenizer = ByteLevelBpe.load(kModel / "tokenizer.json")
    text = demo_eval.kExcerpt.read_text(encoding="utf-8")
    ids = tokenizer.encode(text, allow_special=False)
    # Repeat the excerpt to the requested number of windows: throughput does not depend on content.
    ids = (ids * math.ceil(context * windows / len(ids)))[:context * windows]
    return torch.tensor(ids).reshape(windows, context)


def run_peer(model, rows, batch):
    total, count = 0.0, 0
    with torch.no_grad():
        model(rows[:batch], "sparse")  # warm-up: oneDNN builds its primitives
        start = time.perf_counter()
        for b in range(0, len(rows), batch):
            chunk = rows[b:b + batch]
            logits = model(chunk, "sparse")
            total += float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                           chunk[:, 1:].reshape(-1), reduction="sum"))
            count += chunk[:, 1:].numel()
        seconds = time.perf_counter() - start
    return rows.numel() / seconds, total / count


def run_dayzero(binary, rows, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(" ".join(map(str, rows.reshape(-1).tolist())))
        f.flush()
        result = subprocess.run([binary, "perplexity", "--model", str(kModel), "--token-ids-file",
                                 f.name, "--context", str(rows.shape[1]), "--threads",
                                 str(threads), "--json"], capture_output=True, text=True, check=True)
    summary = json.loads(result.stdout)
    match = re.search(r"\(([0-9.]+) tokens/s\)", result.stderr)
    return float(match.group(1)), summary["mean_nll"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dayzero", default=str(kRepo / "build/src/dayzero/cli/dayzero"))
    parser.add_argument("--windows", type=int, default=64)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = token_windows(args.context, args.windows)
    engine_tps, engine_nll = run_dayzero(args.dayzero, rows, args.threads)
    peer_tps, peer_nll = run_peer(load_peer(), rows, args.batch)
    print(json.dumps({"windows": args.windows, "context": args.context, "threads": args.threads,
                      "dayzero_tokens_per_s": round(engine_tps, 1),
                      "pytorch_tokens_per_s": round(peer_tps, 1),
                      "ratio_dayzero_over_pytorch": round(engine_tps / peer_tps, 3),
                      "dayzero_mean_nll": round(engine_nll, 5), "pytorch_mean_nll": round(peer_nll, 5)}))


if __name__ == "__main__":
    main()
