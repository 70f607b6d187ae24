#!/usr/bin/python3
"""Speculative decoding on the demo model (docs/performance.md "Speculative decoding"): decode
tokens/s with and without drafts (n-gram prompt lookup or the model's MTP head), greedy, at batch 1
(`dayzero generate --timing`, one prompt at a time) and with 16 sequences at once (`generate
--prompts-file`), and the acceptance per draft position. Repetitive prompts (a repeated sentence, a
list, a passage to quote) are where prompt lookup pays; the natural one shows what it costs when
drafts are rare. The MTP head drafts on any text.

    bench/speculative_demo.py [--dayzero build/src/dayzero/cli/dayzero] [--tokens 256]
        [--method ngram|mtp] [--k N] [--lookup-max N] [--repeats N] [--batch-sweep]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = {
    "repeated sentence": "The quick brown fox jumps over the lazy dog. " * 3,
    "list": "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
    "quote": ("The committee met on Tuesday to discuss the new budget for the city library. "
              "The mayor said that the library will open a new branch in the north of the city "
              "next year.\nQuote the text above.\nThe committee met on Tuesday"),
    "natural": "Once upon a time there was a little girl who lived in a village near the forest.",
}
GREEDY = ("--temperature", "0", "--repetition-penalty", "1", "--top-p", "1")


def spec_config(args, disable_by_batch_size=None):
    config = {"method": args.method, "num_speculative_tokens": args.k}
    if args.method == "ngram":
        config.update(prompt_lookup_min=1, prompt_lookup_max=args.lookup_max)
    if disable_by_batch_size is not None:
        config["disable_by_batch_size"] = disable_by_batch_size
    return json.dumps(config)


def run(args, *flags):
    proc = subprocess.run([args.dayzero, *flags], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"dayzero {' '.join(flags)} failed:\n{proc.stderr}")
    return proc


def batch1(args, prompt, spec):
    flags = ["generate", "--prompt", prompt, "--max-tokens", str(args.tokens), "--ignore-eos",
             "--timing", "--threads", str(args.threads), *GREEDY]
    if spec:
        flags += ["--speculative-config", spec]
    proc = run(args, *flags)
    t = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")][0]
    return t["decode_tokens"] / t["decode_s"], t.get("speculative"), t["tokens"]


def median_run(runs):
    """The run of median tokens/s (its tokens and statistics are every run's: greedy)."""
    return sorted(runs, key=lambda run: run[0])[len(runs) // 2]


def batch16(args, spec, num_sequences=16):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i in range(num_sequences):
            prompt = list(PROMPTS.values())[i % len(PROMPTS)]
            f.write(json.dumps({"prompt": prompt + " " * (i // len(PROMPTS))}) + "\n")
        path = f.name
    flags = ["generate", "--prompts-file", path, "--max-tokens", str(args.tokens // 2),
             "--threads", str(args.threads), "--max-num-seqs", str(num_sequences), *GREEDY]
    if spec:
        flags += ["--speculative-config", spec]
    proc = run(args, *flags)
    os.unlink(path)
    summary = proc.stderr.strip().splitlines()[-1]
    rate = float(re.search(r"\(([\d.]+) tokens/s\)", summary).group(1))
    return rate, summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dayzero", default=os.path.join(ROOT, "build/src/dayzero/cli/dayzero"))
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--method", choices=("ngram", "mtp"), default="ngram")
    parser.add_argument("--k", type=int, default=3, help="num_speculative_tokens (mtp: 1 or 2)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs of each measurement, alternating with and without drafts (medians)")
    parser.add_argument("--lookup-max", type=int, default=3, help="prompt_lookup_max")
    parser.add_argument("--batch-sweep", action="store_true",
                        help="only: plain vs drafting at 1, 2, 4, 8 and 16 sequences at once "
                             "(where the disable_by_batch_size default comes from)")
    args = parser.parse_args()
    spec = spec_config(args)
    if args.batch_sweep:
        always = spec_config(args, 64)
        print("| sequences | plain tok/s | drafting tok/s | ratio | accepted |")
        print("|---|---|---|---|---|")
        for n in (1, 2, 4, 8, 16):
            plain, _ = batch16(args, None, n)
            fast, summary = batch16(args, always, n)
            accepted = re.search(r"(\d+) draft tokens, (\d+) accepted", summary)
            rate = int(accepted.group(2)) / max(1, int(accepted.group(1)))
            print(f"| {n} | {plain:.0f} | {fast:.0f} | {fast / plain:.2f} | {rate:.2f} |")
        return
    what = (f"n-gram k={args.k} prompt_lookup 1..{args.lookup_max}" if args.method == "ngram"
            else f"MTP head k={args.k}")
    print(f"demo model, greedy, {args.threads} threads, {what}")
    print("| prompt | plain tok/s | speculative tok/s | ratio | accepted / drafted | "
          "accepted by position | same tokens |")
    print("|---|---|---|---|---|---|---|")
    for name, prompt in PROMPTS.items():
        batch1(args, prompt, None)  # warm-up: page cache, oneDNN primitives
        # Alternating runs, the median of each: one run of 256 tokens takes ~0.1 s, where a
        # neighbour on a shared machine moves a single figure by 10 % or more.
        plains, fasts = [], []
        for _ in range(args.repeats):
            plains.append(batch1(args, prompt, None))
            fasts.append(batch1(args, prompt, spec))
        plain, _, plain_tokens = median_run(plains)
        fast, stats, fast_tokens = median_run(fasts)
        rate = stats["accepted_tokens"] / max(1, stats["draft_tokens"])
        print(f"| {name} | {plain:.0f} | {fast:.0f} | {fast / plain:.2f} | "
              f"{stats['accepted_tokens']} / {stats['draft_tokens']} ({rate:.2f}) | "
              f"{'/'.join(map(str, stats['accepted_per_position']))} | "
              f"{plain_tokens == fast_tokens} |")
    configs = (("default backoff (no drafts above 8 running)", spec),
               ("drafting at 16 (disable_by_batch_size 16)", spec_config(args, 16)))
    runs = {what: [] for what in ["plain"] + [what for what, _ in configs]}
    for _ in range(args.repeats):  # alternating, medians (as at batch 1)
        runs["plain"].append(batch16(args, None))
        for what, config in configs:
            runs[what].append(batch16(args, config))
    plain, _ = median_run(runs["plain"])
    print(f"\n16 sequences at once ({args.tokens // 2} tokens each, prefill included): plain "
          f"{plain:.0f} tok/s")
    for what, _ in configs:
        fast, summary = median_run(runs[what])
        print(f"  speculative, {what}: {fast:.0f} tok/s, ratio {fast / plain:.2f}; "
              f"{summary.split('; ')[-1]}")

if __name__ == "__main__":
    main()
