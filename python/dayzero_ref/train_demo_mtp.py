"""Trains the demo model's MTP head (issue 21) on its frozen trunk and adds it to the checkpoint.

    cd python && /usr/bin/python3 -m dayzero_ref.train_demo_mtp --model ../models/demo \\
        --work ~/.cache/dayzero/demo-mtp [--steps 400] [--seed 0] [--out ../models/demo]

The trunk is the checkpoint in --model (routed experts decoded exactly from MXFP4), frozen and run
as the engine runs it (sparse attention over the indexer's top-k). The head (demo_model.MtpLayer:
enorm/hnorm/eh_proj, an MLA + DSA + latent-MoE layer with the plain residual, shared_head.norm, the
trunk's embedding and lm_head) learns what speculative decoding needs: the trunk's own choice one
position on. Row t's target is the trunk's next-token distribution at t + 1 given the true
x_{t+1}, softmax(logits_{t+1}), and the loss is the cross-entropy against it (the KL up to the
trunk's entropy): self-distillation, so greedy drafts agree with what the trunk would pick rather
than with the corpus. The layer starts as a copy of the trunk's last MLA layer.

Phases, as fractions of --steps: dense [0, dense_frac) (the MLA attends densely, its indexer is
fitted to that attention: the DeepSeek-V3.2 warm-up), then sparse (attention over the indexer's
top-k); from quant_frac the routed experts go through the exact MXFP4 round trip (straight-through
gradient). Deterministic from --seed (batch i from a generator seeded with (seed, i), as
train_demo). Each step logs the loss and `agree`, the fraction of rows whose argmax equals the
trunk's: the greedy acceptance rate of a first draft. --eval-every steps also log it on held-out
windows.

Export (--out): the checkpoint folder again, every existing tensor byte for byte, plus the MTP
layer under model.layers.<num_hidden_layers>. (BF16; routed experts MXFP4; embed_tokens and
shared_head.head copies of the trunk's, as DeepSeek publishes them), and config.json with
num_nextn_predict_layers 1.
"""

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from dayzero_ref import demo_model, ref_common, safetensors_io, train_demo


def load_trunk(model_dir):
    """(DemoModel with the checkpoint's weights, frozen; its config)."""
    config = ref_common.load_config(model_dir)
    trunk_config = dict(config)
    trunk_config.pop("num_nextn_predict_layers", None)
    trunk = demo_model.DemoModel(trunk_config)
    weights = ref_common.load_tensors(model_dir, config)
    state = trunk.state_dict()
    missing = [name for name in state if name not in weights]
    if missing:
        raise SystemExit(f"{model_dir}: no tensor {missing[0]} (and {len(missing) - 1} more)")
    trunk.load_state_dict({name: weights[name] for name in state})
    trunk.eval()
    trunk.requires_grad_(False)
    return trunk, config


def last_mla_layer(trunk):
    layers = [layer for layer in trunk.model.layers if not layer.is_kda]
    return layers[-1]


def init_from_trunk(mtp, trunk):
    """The MTP layer's attention, FFN and norms start as the trunk's last MLA layer's; eh_proj as
    the mean of its two inputs plus a little noise (the embedding of x_{t+1} alone already gives a
    bigram guess at x_{t+2})."""
    source = last_mla_layer(trunk)
    for name in ("input_layernorm", "post_attention_layernorm", "self_attn", "block_sparse_moe"):
        getattr(mtp, name).load_state_dict(getattr(source, name).state_dict())
    mtp.shared_head.norm.load_state_dict(trunk.model.norm.state_dict())
    with torch.no_grad():
        w = mtp.eh_proj.weight                                      # [d, 2d]
        d = w.shape[0]
        w.normal_(0.0, 0.02)
        w[:, :d] += 0.5 * torch.eye(d)
        w[:, d:] += 0.5 * torch.eye(d)


def mtp_step(trunk, mtp, ids, mode, stats):
    """(soft cross-entropy, agreement) of the MTP head on ids [B, T + 1]."""
    with torch.no_grad():
        hidden = trunk.final_hidden(ids[:, :-1], "sparse")         # [B, T, d]
        target = torch.softmax(trunk.lm_head(hidden[:, 1:]), dim=-1)  # trunk's pick for x_{t+2}
    logits = mtp(trunk, hidden[:, :-1], ids[:, 1:-1], mode, stats)
    loss = -(target * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
    agree = (logits.argmax(-1) == target.argmax(-1)).float().mean()
    return loss, float(agree)


@torch.no_grad()
def held_out_agreement(trunk, mtp, tokens, seq, windows):
    total, count = 0.0, 0
    for i in range(windows):
        ids = tokens[i * (seq + 1):(i + 1) * (seq + 1)][None]
        _, agree = mtp_step(trunk, mtp, ids, "sparse", {})
        total += agree
        count += 1
    return total / max(count, 1)


def export(model_dir, out, config, mtp, log):
    """Every tensor of model_dir's checkpoint unchanged plus the MTP layer's; config with
    num_nextn_predict_layers 1."""
    src = Path(model_dir) / "model.safetensors"
    metadata = safetensors_io.load_metadata(src)
    tensors = dict(safetensors_io.load_file(src))
    prefix = f"model.layers.{config['num_hidden_layers']}."
    tensors = {name: t for name, t in tensors.items() if not name.startswith(prefix)}
    tensors.update(demo_model.export_tensors(mtp, prefix))
    tensors[prefix + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
    tensors[prefix + "shared_head.head.weight"] = tensors["lm_head.weight"]
    config = dict(config)
    config["num_nextn_predict_layers"] = 1
    ignore = config["quantization_config"]["ignore"]
    for pattern in (r"re:.*eh_proj$", r"re:.*shared_head\.head$"):
        if pattern not in ignore:
            ignore.append(pattern)
    out.mkdir(parents=True, exist_ok=True)
    safetensors_io.save_file(out / "model.safetensors", tensors, metadata)
    with open(out / "config.json", "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    log(f"exported {len(tensors)} tensors to {out}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=train_demo.kRepo / "models" / "demo")
    train_demo.add_training_args(parser, Path.home() / ".cache/dayzero/demo-mtp", steps=400,
                                 lr=1e-3, warmup=20, dense_frac=0.25, quant_frac=0.75,
                                 eval_windows=16)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.work.mkdir(parents=True, exist_ok=True)
    log_path = args.work / "log.jsonl"

    def log(message):
        print(message, flush=True)

    train_ids, held_ids = train_demo.load_tokens(args.work, log)
    trunk, config = load_trunk(args.model)
    torch.manual_seed(args.seed)
    mtp = demo_model.MtpLayer(trunk.config)
    init_from_trunk(mtp, trunk)
    optimizer = train_demo.make_optimizer(mtp, args)
    log(f"MTP layer: {sum(p.numel() for p in mtp.parameters())} parameters; trunk frozen")
    t_last = time.time()
    for step in range(args.steps):
        mode = "dense" if step < int(args.dense_frac * args.steps) else "sparse"
        mtp.block_sparse_moe.fake_quant = step >= int(args.quant_frac * args.steps)
        for group in optimizer.param_groups:
            group["lr"] = train_demo.learning_rate(step, args)
        inputs, targets = train_demo.batch_at(train_ids, step, args.seed, args.batch, args.seq)
        ids = torch.cat([inputs, targets[:, -1:]], dim=1)          # [B, seq + 1]
        stats = {}
        loss, agree = mtp_step(trunk, mtp, ids, mode, stats)
        total = loss + args.indexer_weight * stats["indexer_ce"]
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(mtp.parameters(), args.clip)
        optimizer.step()
        with torch.no_grad():
            train_demo.rebalance(stats, args.balance_rate)
        now = time.time()
        record = {"step": step + 1, "mode": mode, "loss": round(float(loss), 5),
                  "agree": round(agree, 4), "indexer_kl": round(stats["indexer_kl"], 5),
                  "grad_norm": round(float(grad_norm), 4), "seconds": round(now - t_last, 3)}
        t_last = now
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            mtp.eval()
            record["heldout_agree"] = round(
                held_out_agreement(trunk, mtp, held_ids, args.seq, args.eval_windows), 4)
            mtp.train()
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        log(json.dumps(record))
    mtp.block_sparse_moe.fake_quant = True
    if args.out:
        export(args.model, args.out, config, mtp, log)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
