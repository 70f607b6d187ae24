"""Trains dayzero's demo model (issue 7) on the CPU and exports it as a `dayzero_hybrid` checkpoint.

    cd python && /usr/bin/python3 -m dayzero_ref.train_demo --work ~/.cache/dayzero/demo-train \\
        --out ../models/demo [--steps 800] [--seed 0]

Deterministic from --seed: the initial weights come from torch.manual_seed(seed) and batch i is
drawn by a generator seeded with (seed, i), so a run interrupted and resumed (the work folder
keeps `state.pt`, written every --save-every steps) draws the same batches as one that never
stopped. Losses go to `WORK/log.jsonl`, one JSON object per step.

Phases (docs/demo_model.md), as fractions of --steps:
1. dense   [0, dense_frac): every MLA layer attends densely; the lightning indexer, reading
   detached inputs, is fitted to the attention distribution (summed over heads) by KL — the
   DeepSeek-V3.2 dense warm-up, here run while the model itself is trained from scratch;
2. sparse  [dense_frac, quant_frac): attention over the indexer's top-k (index_topk) positions, the
   indexer fitted to the attention over the selected positions;
3. mxfp4   [quant_frac, 1): as sparse, the routed experts through the exact MXFP4 round trip with a
   straight-through gradient (quantisation-aware fine-tune of what ships).

Data: the corpus of dayzero_ref.corpus, tokenized with models/demo/tokenizer.json (cached as
WORK/train_ids.npy); each document is <|bos|> text <|eos|>, documents concatenated; a batch is
--batch random windows of --seq + 1 tokens.
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from dayzero_ref import corpus, demo_model, safetensors_io
from dayzero_ref.bpe_train import ByteLevelBpe

kRepo = Path(__file__).resolve().parents[2]
kTokenizer = kRepo / "models" / "demo" / "tokenizer.json"
BOS, EOS = 0, 1


def tokenize_split(docs, tokenizer):
    ids = []
    for text in docs:
        ids.append(BOS)
        ids.extend(tokenizer.encode(text, allow_special=False))
        ids.append(EOS)
    return np.asarray(ids, dtype=np.int16)


def load_tokens(work, log):
    """(train ids, held-out ids) as int64 tensors, tokenized once and cached in `work`."""
    paths = {split: work / f"{split}_ids.npy" for split in ("train", "heldout")}
    if not all(p.exists() for p in paths.values()):
        docs, _ = corpus.load_corpus()
        train, held = corpus.split_corpus(docs)
        tokenizer = ByteLevelBpe.load(kTokenizer)
        for split, chosen in (("train", train), ("heldout", held)):
            t0 = time.time()
            ids = tokenize_split([d.text for d in chosen], tokenizer)
            np.save(paths[split], ids)
            log(f"tokenized {split}: {len(chosen)} documents, {len(ids)} tokens, "
                f"{time.time() - t0:.0f} s")
    return tuple(torch.from_numpy(np.load(paths[s]).astype(np.int64)) for s in ("train", "heldout"))


def batch_at(tokens, step, seed, batch, seq):
    g = torch.Generator()
    g.manual_seed(seed * 1_000_003 + step)
    starts = torch.randint(0, len(tokens) - seq - 1, (batch,), generator=g)
    rows = torch.stack([tokens[s:s + seq + 1] for s in starts.tolist()])
    return rows[:, :-1], rows[:, 1:]


def phase_of(step, args):
    if step < int(args.dense_frac * args.steps):
        return "dense"
    if step < int(args.quant_frac * args.steps):
        return "sparse"
    return "mxfp4"


def learning_rate(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def make_optimizer(model, args):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "embed_tokens" not in name else no_decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def rebalance(stats, rate):
    """Aux-loss-free balancing (DeepSeek-V3): raise the selection bias of under-loaded experts."""
    for moe, load in stats.get("loads", []):
        load = load.float()
        moe.gate.e_score_correction_bias += rate * torch.sign(load.mean() - load)


@torch.no_grad()
def held_out_nll(model, tokens, seq, mode, max_windows=None, batch=16):
    """Mean NLL (nats/token) over consecutive non-overlapping windows of seq + 1 tokens."""
    num = (len(tokens) - 1) // seq
    if max_windows:
        num = min(num, max_windows)
    total, count = 0.0, 0
    for b in range(0, num, batch):
        rows = torch.stack([tokens[i * seq:i * seq + seq + 1] for i in range(b, min(num, b + batch))])
        logits = model(rows[:, :-1], mode)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                               reduction="sum")
        total += float(loss)
        count += rows[:, 1:].numel()
    return total / count


def export(model, out, log):
    out.mkdir(parents=True, exist_ok=True)
    config = dict(model.config)
    with open(out / "config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    generation = {"bos_token_id": BOS, "eos_token_id": EOS, "do_sample": True,
                  "temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1}
    with open(out / "generation_config.json", "w", encoding="utf-8") as f:
        json.dump(generation, f, indent=2)
        f.write("\n")
    tensors = demo_model.export_tensors(model)
    safetensors_io.save_file(out / "model.safetensors", tensors, {"format": "pt"})
    log(f"exported {len(tensors)} tensors, {os.path.getsize(out / 'model.safetensors')} bytes "
        f"to {out}")


def add_training_args(parser, work, steps, lr, warmup, dense_frac, quant_frac, eval_windows):
    """The options this script and train_demo_mtp share, with each one's defaults."""
    parser.add_argument("--work", type=Path, default=work)
    parser.add_argument("--out", type=Path, default=None, help="export the checkpoint here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--warmup", type=int, default=warmup)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--indexer-weight", type=float, default=1.0)
    parser.add_argument("--balance-rate", type=float, default=1e-3)
    parser.add_argument("--dense-frac", type=float, default=dense_frac)
    parser.add_argument("--quant-frac", type=float, default=quant_frac)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--eval-windows", type=int, default=eval_windows)
    parser.add_argument("--threads", type=int, default=2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_training_args(parser, Path.home() / ".cache/dayzero/demo-train", steps=800, lr=2e-3,
                      warmup=40, dense_frac=0.5, quant_frac=0.85, eval_windows=32)
    parser.add_argument("--save-every", type=int, default=25)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    log_path = args.work / "log.jsonl"

    def log(message):
        print(message, flush=True)

    train_ids, held_ids = load_tokens(args.work, log)
    log(f"train {len(train_ids)} tokens, held-out {len(held_ids)} tokens")
    torch.manual_seed(args.seed)
    model = demo_model.DemoModel()
    optimizer = make_optimizer(model, args)
    state_path = args.work / "state.pt"
    start = 0
    if state_path.exists():
        state = torch.load(state_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        if state["args"]["seed"] != args.seed or state["args"]["steps"] != args.steps:
            raise SystemExit(f"{state_path} was written by a run with other --seed/--steps")
        log(f"resumed at step {start}")
    log(f"{sum(p.numel() for p in model.parameters())} parameters")
    t_last = time.time()
    for step in range(start, args.steps):
        phase = phase_of(step, args)
        model.set_fake_quant(phase == "mxfp4")
        mode = "dense" if phase == "dense" else "sparse"
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        inputs, targets = batch_at(train_ids, step, args.seed, args.batch, args.seq)
        stats = {}
        logits = model(inputs, mode, stats)
        lm_loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss = lm_loss + args.indexer_weight * stats["indexer_ce"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        with torch.no_grad():
            rebalance(stats, args.balance_rate)
        now = time.time()
        record = {"step": step + 1, "phase": phase, "lm_loss": round(float(lm_loss), 5),
                  "indexer_kl": round(stats["indexer_kl"], 5), "grad_norm": round(float(grad_norm), 4),
                  "lr": learning_rate(step, args), "seconds": round(now - t_last, 3)}
        t_last = now
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            model.eval()
            record["heldout_nll_" + mode] = round(held_out_nll(model, held_ids, args.seq, mode,
                                                               args.eval_windows), 5)
            model.train()
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        log(json.dumps(record))
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step + 1, "args": vars(args) | {"work": str(args.work),
                                                               "out": str(args.out)}},
                       state_path.with_suffix(".tmp"))
            os.replace(state_path.with_suffix(".tmp"), state_path)
    model.eval()
    model.set_fake_quant(True)
    final = {"step": args.steps, "final": True}
    for mode in ("sparse", "dense"):
        final["heldout_nll_" + mode] = round(held_out_nll(model, held_ids, args.seq, mode), 5)
        final["heldout_ppl_" + mode] = round(math.exp(final["heldout_nll_" + mode]), 3)
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(json.dumps(final) + "\n")
    log(json.dumps(final))
    if args.out:
        export(model, args.out, log)


if __name__ == "__main__":
    main()
