"""Prefill and decode throughput of the demo model: dayzero against the PyTorch peer, in one run.

    PYTHONPATH=python /usr/bin/python3 bench/peer_demo.py [--dayzero build/src/dayzero/cli/dayzero]
        [--threads 2] [--windows 32] [--context 256] [--batch 16]
        [--prompts 4] [--prompt-tokens 64] [--decode-tokens 64] [--json]

Both sides use the same thread count (dayzero --threads, torch.set_num_threads), the same model
(models/demo: 10 M parameters, KDA + MLA/DSA + latent MoE with MXFP4 experts) and the same tokens.

Prefill: `dayzero perplexity` over `windows` consecutive windows of `context` held-out tokens (one
window per prefill, as it serves) against python/dayzero_ref/demo_model.DemoModel in sparse mode
over the same windows in batches of `batch` (every matmul BF16 × BF16 → FP32 on oneDNN, the fastest
path Debian's torch 1.13 has; its FP32 GEMM is a generic BLAS). Both score the same tokens: the
mean NLLs must agree.

Decode: `prompts` prompts of `prompt-tokens` held-out tokens (different offsets), each followed by
`decode-tokens` greedy tokens, EOS ignored. dayzero: one `dayzero generate --ignore-eos --timing`
per prompt, the decode steps timed inside the process (the first step apart: it builds the
one-token oneDNN primitives). PyTorch: dayzero_ref/demo_decode.DemoDecoder (KDA recurrent and
short-conv state, MLA latent and indexer key caches, MoE for the one token), after one untimed
warm-up prompt; both GEMV paths are measured (BF16 weights on oneDNN, FP32 weights on the generic
BLAS) and the faster is the peer, named in the output. (A 256 × 768 GEMV alone takes ~50 µs in
BF16 and ~110 µs in FP32 on one thread, but the BF16 path adds casts and attention products whose
shape changes every step; on the shared machine either won in different runs. The peer is eager
PyTorch, whose per-operator overhead dominates a model this small.) Decode tokens/s = decode
steps / their time (each step: one token through the model plus the greedy pick). Rates are given
per wall second and, for the one-thread comparison on a loaded machine, per CPU second of the
process.

The ratio is dayzero / PyTorch (> 1: dayzero faster). The load average is printed beside the
figures: other processes on the machine slow both sides, unevenly.
"""

import argparse
import json
import math
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dayzero_ref import demo_decode, demo_eval
from dayzero_ref.bpe_train import ByteLevelBpe

kRepo = Path(__file__).resolve().parents[1]
kModel = kRepo / "models" / "demo"


def held_out_ids(tokenizer, count):
    """`count` token ids of the held-out excerpt, repeated as needed (throughput does not depend
    on content)."""
    text = demo_eval.kExcerpt.read_text(encoding="utf-8")
    ids = tokenizer.encode(text, allow_special=False)
    return (ids * math.ceil(count / len(ids)))[:count]


def decode_prompts(tokenizer, num_prompts, num_tokens):
    """Prompt texts cut at word starts of the excerpt, each encoding to exactly `num_tokens` ids
    (dayzero encodes the same text with the same tokenizer.json; generate checks the count)."""
    text = demo_eval.kExcerpt.read_text(encoding="utf-8")
    starts = [m.start() for m in re.finditer(r"(?<=\s)\S", text)]
    prompts = []
    stride = max(1, len(starts) // max(num_prompts, 1))
    for p in range(num_prompts):
        begin = starts[(p * stride) % len(starts)]
        ids = tokenizer.encode(text[begin:], allow_special=False)[:num_tokens]
        if len(ids) < num_tokens:
            raise SystemExit(f"the excerpt is too short for {num_tokens}-token prompts")
        prompt = tokenizer.decode(ids)
        if tokenizer.encode(prompt, allow_special=False) != ids:
            raise SystemExit(f"prompt {p} does not round-trip through the tokenizer")
        prompts.append((prompt, ids))
    return prompts


# ---------------------------------------------------------------- prefill

def peer_prefill(model, rows, batch):
    total, count = 0.0, 0
    with torch.no_grad():
        model(rows[:batch], "sparse")  # warm-up: oneDNN builds its primitives
        start, start_cpu = time.perf_counter(), time.process_time()
        for b in range(0, len(rows), batch):
            chunk = rows[b:b + batch]
            logits = model(chunk, "sparse")
            total += float(F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                           chunk[:, 1:].reshape(-1), reduction="sum"))
            count += chunk[:, 1:].numel()
        seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return {"tokens_per_s": rows.numel() / seconds, "tokens_per_cpu_s": rows.numel() / cpu,
            "mean_nll": total / count}


def dayzero_prefill(binary, rows, threads):
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        f.write(" ".join(map(str, rows.reshape(-1).tolist())))
        f.flush()
        result = subprocess.run([binary, "perplexity", "--model", str(kModel), "--token-ids-file",
                                 f.name, "--context", str(rows.shape[1]), "--threads",
                                 str(threads), "--json"], capture_output=True, text=True, check=True)
    summary = json.loads(result.stdout)
    match = re.search(r"\(([0-9.]+) tokens/s\)", result.stderr)
    if match is None:
        raise SystemExit(f"no tokens/s in dayzero perplexity's log:\n{result.stderr}")
    return {"tokens_per_s": float(match.group(1)), "mean_nll": summary["mean_nll"]}


# ---------------------------------------------------------------- decode

def dayzero_decode(binary, prompts, decode_tokens, threads):
    steps = seconds = cpu = 0.0
    tokens = []
    for text, ids in prompts:
        result = subprocess.run([binary, "generate", "--model", str(kModel), "--prompt", text,
                                 "--max-tokens", str(decode_tokens), "--temperature", "0",
                                 "--ignore-eos", "--timing", "--threads", str(threads)],
                                capture_output=True, text=True, check=True)
        timing = [json.loads(line) for line in result.stderr.splitlines()
                  if line.startswith("{")]
        if len(timing) != 1:
            raise SystemExit(f"dayzero generate --timing printed no JSON line:\n{result.stderr}")
        t = timing[0]
        if t["prompt_tokens"] != len(ids):
            raise SystemExit(f"dayzero encoded the prompt to {t['prompt_tokens']} tokens, the "
                             f"peer to {len(ids)}")
        steps += t["decode_steps"] - 1
        seconds += t["decode_s"] - t["decode_first_step_s"]
        cpu += t["decode_cpu_s"] - t["decode_first_step_cpu_s"]
        tokens.append(t["tokens"])
    return {"tokens_per_s": steps / seconds, "tokens_per_cpu_s": steps / cpu,
            "steps": int(steps)}, tokens


def peer_decode(decoder, prompts, decode_tokens):
    demo_decode.greedy(decoder, prompts[0][1], decode_tokens)  # warm-up (oneDNN primitives)
    steps = seconds = cpu = 0.0
    tokens = []
    for _, ids in prompts:
        out, wall, cpu_s, n = demo_decode.greedy(decoder, ids, decode_tokens)
        steps, seconds, cpu = steps + n, seconds + wall, cpu + cpu_s
        tokens.append(out)
    return {"tokens_per_s": steps / seconds, "tokens_per_cpu_s": steps / cpu,
            "steps": int(steps)}, tokens


def common_prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dayzero", default=str(kRepo / "build/src/dayzero/cli/dayzero"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--windows", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16, help="peer prefill batch (windows)")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--json", action="store_true", help="print one JSON summary only")
    args = parser.parse_args()
    if args.decode_tokens < 3:
        parser.error("--decode-tokens must be at least 3")
    torch.set_num_threads(args.threads)
    tokenizer = ByteLevelBpe.load(kModel / "tokenizer.json")
    model = demo_decode.load_demo_model(kModel)
    load_before = os.getloadavg()[0]
    result = {"threads": args.threads, "model": "models/demo"}

    if not args.skip_prefill:
        rows = torch.tensor(held_out_ids(tokenizer, args.context * args.windows)).reshape(
            args.windows, args.context)
        engine = dayzero_prefill(args.dayzero, rows, args.threads)
        peer = peer_prefill(model, rows, args.batch)
        result["prefill"] = {
            "windows": args.windows, "context": args.context, "peer_batch": args.batch,
            "dayzero_tokens_per_s": round(engine["tokens_per_s"], 1),
            "pytorch_tokens_per_s": round(peer["tokens_per_s"], 1),
            "ratio_dayzero_over_pytorch": round(engine["tokens_per_s"] / peer["tokens_per_s"], 3),
            "dayzero_mean_nll": round(engine["mean_nll"], 5),
            "pytorch_mean_nll": round(peer["mean_nll"], 5)}

    prompts = decode_prompts(tokenizer, args.prompts, args.prompt_tokens)
    engine, engine_tokens = dayzero_decode(args.dayzero, prompts, args.decode_tokens, args.threads)
    paths = {}
    for matmul in ("bf16", "fp32"):
        paths[matmul] = peer_decode(demo_decode.DemoDecoder(model, matmul), prompts,
                                    args.decode_tokens)
    # The faster path is the peer: by CPU time with one thread (steadier on a shared machine),
    # by wall time otherwise (idle OpenMP threads spin, so CPU time overstates the work).
    rate = "tokens_per_cpu_s" if args.threads == 1 else "tokens_per_s"
    best = max(paths, key=lambda m: paths[m][0][rate])
    peer, peer_tokens = paths[best]
    agree = [common_prefix(a, b) for a, b in zip(engine_tokens, peer_tokens)]
    result["decode"] = {
        "prompts": args.prompts, "prompt_tokens": args.prompt_tokens,
        "decode_tokens": args.decode_tokens, "timed_steps": engine["steps"],
        "dayzero_tokens_per_s": round(engine["tokens_per_s"], 1),
        "pytorch_tokens_per_s": round(peer["tokens_per_s"], 1),
        "pytorch_path": best,
        "pytorch_tokens_per_s_by_path": {m: round(p[0]["tokens_per_s"], 1)
                                         for m, p in paths.items()},
        "ratio_dayzero_over_pytorch": round(engine["tokens_per_s"] / peer["tokens_per_s"], 3),
        "dayzero_tokens_per_cpu_s": round(engine["tokens_per_cpu_s"], 1),
        "pytorch_tokens_per_cpu_s": round(peer["tokens_per_cpu_s"], 1),
        "ratio_per_cpu_s": round(engine["tokens_per_cpu_s"] / peer["tokens_per_cpu_s"], 3),
        "greedy_tokens_agreeing_before_first_difference": agree}
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]

    if args.json:
        print(json.dumps(result))
        return
    print(f"demo model, {args.threads} thread(s); load average {result['load_average']}")
    if "prefill" in result:
        p = result["prefill"]
        print(f"prefill ({p['windows']} x {p['context']} tokens): dayzero "
              f"{p['dayzero_tokens_per_s']} tok/s, PyTorch {p['pytorch_tokens_per_s']} tok/s "
              f"(batch {p['peer_batch']}) -> {p['ratio_dayzero_over_pytorch']}x; mean NLL "
              f"{p['dayzero_mean_nll']} vs {p['pytorch_mean_nll']}")
    d = result["decode"]
    print(f"decode ({d['prompts']} prompts x {d['prompt_tokens']} tokens, {d['decode_tokens']} "
          f"generated): dayzero {d['dayzero_tokens_per_s']} tok/s, PyTorch "
          f"{d['pytorch_tokens_per_s']} tok/s ({d['pytorch_path']}; by path "
          f"{d['pytorch_tokens_per_s_by_path']}) -> {d['ratio_dayzero_over_pytorch']}x")
    print(f"decode per CPU second: dayzero {d['dayzero_tokens_per_cpu_s']}, PyTorch "
          f"{d['pytorch_tokens_per_cpu_s']} -> {d['ratio_per_cpu_s']}x")
    print(f"greedy tokens equal before the first difference, per prompt: {agree}")


if __name__ == "__main__":
    main()
