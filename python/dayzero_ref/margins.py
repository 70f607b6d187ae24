"""Margin check for test prompts (docs/models.md §8.1): are the discrete decisions decisive?

    /usr/bin/python3 -m dayzero_ref.margins MODEL_DIR --token-ids 1,2,3 [--trials 10] [--rel 8e-3]
        [--kv-cache-dtype fp8|bf16|both] [--no-mtp]
    /usr/bin/python3 -m dayzero_ref.margins MODEL_DIR --test-prompts     # every prompt of test_prompts
    /usr/bin/python3 -m dayzero_ref.margins MODEL_DIR --search           # find new ones (minutes)

Runs the reference once unperturbed and `trials` times with relative Gaussian noise of sigma `rel`
applied at every BF16 rounding point (the default 8e-3 is about seven times the RMS relative error of
BF16 rounding itself, 2^-9/sqrt(3); 4e-3 let through a prompt that failed 3 of 20 trials), and
reports whether any indexer selection (as a set per token), expert choice (as a set per token) or
argmax of the logits (main model and MTP head) changes. A prompt whose decisions change is not
decisive: two correct implementations could disagree on it, so it must not be a test prompt.
Kimi checkpoints (kimi_linear, kimi_k3; model_type from config.json) are checked the same way with
dayzero_ref.kimi (kv cache bf16; decisions: expert choice and argmax), their prompts in
dayzero_ref.test_prompts_kimi. Also prints the unperturbed margins: the score gap at each selection boundary (relative to the
row's top score), the routing gaps (groups and experts, in biased-score units) and the top-1/top-2
logit gap.
"""

import argparse
import math
import sys

import torch

from dayzero_ref import deepseek_v32, kimi
from dayzero_ref.ref_common import load_config

DEFAULT_REL = 8e-3
DEFAULT_TRIALS = 10


def is_kimi(model_dir):
    return load_config(model_dir).get("model_type") in kimi.KIMI_MODEL_TYPES


def make_reference(model_dir, kv_cache_dtype):
    if is_kimi(model_dir):
        return kimi.KimiReference(model_dir, kv_cache_dtype=kv_cache_dtype)
    return deepseek_v32.DeepseekV32Reference(model_dir, kv_cache_dtype=kv_cache_dtype)


def _run(ref, token_ids, with_mtp):
    taps = {}
    with torch.no_grad():
        if with_mtp and len(token_ids) > 1 and hasattr(ref, "mtp_logits"):
            ref.mtp_logits(token_ids, taps=taps)
        else:
            ref.forward(token_ids, taps=taps)
    return taps


def decisions(taps, num_layers):
    """(kind, layer) -> tuple of per-row frozensets / ints."""
    out = {}
    for (layer, name), value in taps.items():
        if name == "index_selection":
            out[("index_selection", layer)] = tuple(
                frozenset(int(v) for v in row if v >= 0) for row in value.to(torch.int64))
        elif name == "routing_ids":
            out[("routing", layer)] = tuple(frozenset(int(v) for v in row)
                                            for row in value.to(torch.int64))
        elif name == "logits":
            kind = "argmax" if layer == deepseek_v32.GLOBAL_LAYER else "mtp_argmax"
            out[(kind, layer)] = tuple(int(v) for v in value.argmax(dim=-1))
    return out


def kimi_margins(ref, taps):
    """Unperturbed gaps of a Kimi model: routing (biased-score gap at the top-k boundary) and the
    top-1/top-2 logit gap, smallest over rows and layers."""
    top_k = ref.config["num_experts_per_token"]
    expert_gap, argmax_gap = math.inf, math.inf
    for (layer, name), value in taps.items():
        if name == "router_scores":
            bias = ref.w[ref._layer_prefix(layer) + "block_sparse_moe.gate.e_score_correction_bias"]
            ranked = torch.sort(value + bias[None, :], dim=-1, descending=True).values
            expert_gap = min(expert_gap, float((ranked[:, top_k - 1] - ranked[:, top_k]).min()))
        elif name == "logits":
            top2 = torch.topk(value, 2, dim=-1).values
            argmax_gap = min(argmax_gap, float((top2[:, 0] - top2[:, 1]).min()))
    return {"expert_gap": expert_gap, "argmax_gap": argmax_gap}


def margins(ref, taps):
    """Unperturbed gaps at every discrete decision (smallest over rows and layers)."""
    if isinstance(ref, kimi.KimiReference):
        return kimi_margins(ref, taps)
    c = ref.config
    k_index = ref.index_topk
    index_gap, zero_ties = math.inf, 0
    group_gap, expert_gap, argmax_gap = math.inf, math.inf, math.inf
    for (layer, name), value in taps.items():
        if name == "index_scores":
            for t in range(k_index, value.shape[0]):  # rows with t + 1 > K: a real choice
                row = torch.sort(value[t, :t + 1], descending=True).values
                if row[k_index] <= 0 and row[k_index - 1] <= 0:
                    zero_ties += 1  # a ReLU floor: exact zeros, ordered by position
                    continue
                index_gap = min(index_gap, float((row[k_index - 1] - row[k_index]) / row[0]))
        elif name == "router_scores":
            p = f"model.layers.{layer}.mlp."
            biased = value + ref.w[p + "gate.e_score_correction_bias"][None, :]
            n_group, topk_group, top_k = c["n_group"], c["topk_group"], c["num_experts_per_tok"]
            grouped = biased.reshape(biased.shape[0], n_group, -1)
            group_scores = torch.sort(grouped, dim=-1, descending=True).values[..., :2].sum(-1)
            if topk_group < n_group:
                gs = torch.sort(group_scores, dim=-1, descending=True).values
                group_gap = min(group_gap, float((gs[:, topk_group - 1] - gs[:, topk_group]).min()))
            kept = torch.sort(group_scores, dim=-1, descending=True).indices[:, :topk_group]
            keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
            masked = biased.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), -math.inf)
            ranked = torch.sort(masked, dim=-1, descending=True).values
            expert_gap = min(expert_gap, float((ranked[:, top_k - 1] - ranked[:, top_k]).min()))
        elif name == "logits":
            top2 = torch.topk(value, 2, dim=-1).values
            argmax_gap = min(argmax_gap, float((top2[:, 0] - top2[:, 1]).min()))
    return {"index_rel_gap": index_gap, "index_zero_ties": zero_ties, "group_gap": group_gap,
            "expert_gap": expert_gap, "argmax_gap": argmax_gap}


def check(ref, token_ids, trials=DEFAULT_TRIALS, rel=DEFAULT_REL, seed=0, with_mtp=True):
    """{'passed', 'changes': [(trial, kind, layer, row)], 'margins', 'num_decisions'} for one
    reference (its kv_cache_dtype as set)."""
    ref.noise = None
    base_taps = _run(ref, token_ids, with_mtp)
    base = decisions(base_taps, ref.num_layers)
    changes = []
    try:
        for trial in range(trials):
            gen = torch.Generator()
            gen.manual_seed(seed * 1000003 + trial)
            ref.noise = (rel, gen)
            now = decisions(_run(ref, token_ids, with_mtp), ref.num_layers)
            for key, rows in base.items():
                for row, (a, b) in enumerate(zip(rows, now[key])):
                    if a != b:
                        changes.append((trial, key[0], key[1], row))
    finally:
        ref.noise = None
    return {"passed": not changes, "changes": changes, "margins": margins(ref, base_taps),
            "num_decisions": sum(len(rows) for rows in base.values())}


def check_model_dir(model_dir, token_ids, kv_cache_dtypes=None, **kwargs):
    """kv_cache_dtype -> check() report (default dtypes: fp8 and bf16, Kimi bf16)."""
    if kv_cache_dtypes is None:
        kv_cache_dtypes = ("bf16",) if is_kimi(model_dir) else ("fp8", "bf16")
    return {dtype: check(make_reference(model_dir, dtype), token_ids, **kwargs)
            for dtype in kv_cache_dtypes}


def format_report(label, report):
    m = report["margins"]
    status = "PASS" if report["passed"] else f"FAIL ({len(report['changes'])} changed decisions)"
    if "index_rel_gap" in m:
        gaps = (f"index rel gap {m['index_rel_gap']:.3g} ({m['index_zero_ties']} ReLU-floor ties), "
                f"group gap {m['group_gap']:.3g}, ")
    else:
        gaps = ""
    lines = [f"{label}: {status}; {report['num_decisions']} decisions; margins: {gaps}"
             f"expert gap {m['expert_gap']:.3g}, argmax gap {m['argmax_gap']:.3g}"]
    for trial, kind, layer, row in report["changes"][:10]:
        lines.append(f"  trial {trial}: {kind} layer {layer} row {row} changed")
    return "\n".join(lines)



def _print_search(search, what):
    """Runs search(length) -> (ids or None, detail) for every test length and prints a PROMPTS dict
    to paste into a test_prompts module; exit status 0 when every length found one."""
    found = {}
    for length in TEST_LENGTHS:
        ids, detail = search(length)
        print(f"# length {length}: {what} {detail}" if ids else f"# length {length}: none found")
        if ids:
            found[length] = ids
    print("PROMPTS = {")
    for length, ids in found.items():
        print(f"    {length}: {ids},")
    print("}")
    return 0 if len(found) == len(TEST_LENGTHS) else 1


def _requested_prompts(args, parser, prompts_module):
    """length -> ids: the stored test prompts (--test-prompts) or the one given (--token-ids)."""
    if args.test_prompts:
        return dict(prompts_module.PROMPTS)
    if args.token_ids:
        return {len(args.token_ids): args.token_ids}
    parser.error("give --token-ids or --test-prompts")
    return {}

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--token-ids", type=deepseek_v32.parse_token_ids)
    parser.add_argument("--test-prompts", action="store_true",
                        help="check every prompt of dayzero_ref.test_prompts")
    parser.add_argument("--trials", type=int, default=DEFAULT_TRIALS)
    parser.add_argument("--rel", type=float, default=DEFAULT_REL)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kv-cache-dtype", choices=("fp8", "bf16", "both"), default="both",
                        help="both: fp8 and bf16 (Kimi: bf16 only, kv_lora_rank 64 has no FP8 tile)")
    parser.add_argument("--no-mtp", action="store_true")
    parser.add_argument("--search", action="store_true",
                        help="search a passing prompt for every length of TEST_LENGTHS and print "
                             "them as a PROMPTS dict (for dayzero_ref/test_prompts.py)")
    args = parser.parse_args(argv)
    if is_kimi(args.model_dir):
        return _main_kimi(args, parser)
    if args.search:
        refs = [deepseek_v32.DeepseekV32Reference(args.model_dir, kv_cache_dtype=d)
                for d in ("fp8", "bf16")]
        return _print_search(lambda length: search_prompt(refs, length, trials=args.trials,
                                                          rel=args.rel)[:2], "marked cap")
    from dayzero_ref import test_prompts  # pylint: disable=import-outside-toplevel
    prompts = _requested_prompts(args, parser, test_prompts)
    dtypes = ("fp8", "bf16") if args.kv_cache_dtype == "both" else (args.kv_cache_dtype,)
    refs = {d: deepseek_v32.DeepseekV32Reference(args.model_dir, kv_cache_dtype=d) for d in dtypes}
    ok = True
    for length, ids in prompts.items():
        for dtype, ref in refs.items():
            report = check(ref, ids, args.trials, args.rel, args.seed, not args.no_mtp)
            ok &= report["passed"]
            print(format_report(f"length {length:3d} kv {dtype}", report))
    return 0 if ok else 1



# ---------------------------------------------------------------- prompt search

TEST_LENGTHS = (1, 5, 15, 16, 17, 33, 64, 65, 100)
MARKED_CAPS = (None, 32, 24, 20, 16, 12)


def candidate_prompt(marked, length, attempt, cap):
    """[0 (BOS)] + random ids in [2, V) drawn from a generator seeded by (length, attempt); with
    `cap`, at most `cap` of them carry the indexer marker (`marked`: set of marked ids), so fewer
    marked keys compete on recency."""
    vocab = len(marked)
    gen = torch.Generator()
    gen.manual_seed(length * 7919 + attempt)
    ids, num_marked = [0], int(marked[0])
    while len(ids) < length:
        t = int(torch.randint(2, vocab, (1,), generator=gen))
        if cap is not None and marked[t] and num_marked >= cap:
            continue
        num_marked += int(marked[t])
        ids.append(t)
    return ids


def search_prompt(refs, length, attempts_per_cap=3, trials=DEFAULT_TRIALS, rel=DEFAULT_REL):
    """The first candidate prompt of `length` that passes check() for every reference in `refs`
    (one per kv_cache_dtype), trying the marker caps in MARKED_CAPS order; (ids, cap, reports)."""
    from dayzero_ref import decisive_v32
    emb = next(iter(refs)).w["model.embed_tokens.weight"]
    marked = [bool(emb[i, decisive_v32.MARKER_COORD] > 0) for i in range(emb.shape[0])]
    for cap in MARKED_CAPS:
        for attempt in range(attempts_per_cap):
            ids = candidate_prompt(marked, length, attempt, cap)
            reports = [check(ref, ids, trials, rel) for ref in refs]
            if all(r["passed"] for r in reports):
                return ids, cap, reports
    return None, None, None


# ---------------------------------------------------------------- Kimi

def kimi_candidate_prompt(length, attempt, num_regular_ids=512):
    """Random regular ids in [0, num_regular_ids) (no special token: the Kimi tokenizer numbers its
    specials from the number of ranks on), from a generator seeded by (length, attempt)."""
    gen = torch.Generator()
    gen.manual_seed(length * 7919 + attempt + 1_000_003)
    return [int(t) for t in torch.randint(0, num_regular_ids, (length,), generator=gen)]


def search_kimi_prompt(refs, length, attempts=20, trials=DEFAULT_TRIALS, rel=DEFAULT_REL):
    """The first candidate prompt of `length` that passes check() for every reference in `refs`
    (e.g. the kimi_linear and kimi_k3 tiny models); (ids, attempt) or (None, None)."""
    for attempt in range(attempts):
        ids = kimi_candidate_prompt(length, attempt)
        if all(check(ref, ids, trials, rel)["passed"] for ref in refs):
            return ids, attempt
    return None, None


def _main_kimi(args, parser):
    if args.kv_cache_dtype == "fp8":
        parser.error("Kimi tiny models: --kv-cache-dtype bf16 only")
    ref = kimi.KimiReference(args.model_dir, kv_cache_dtype="bf16")
    if args.search:
        return _print_search(lambda length: search_kimi_prompt([ref], length, trials=args.trials,
                                                               rel=args.rel), "attempt")
    from dayzero_ref import test_prompts_kimi  # pylint: disable=import-outside-toplevel
    prompts = _requested_prompts(args, parser, test_prompts_kimi)
    ok = True
    for length, ids in prompts.items():
        report = check(ref, ids, args.trials, args.rel, args.seed, with_mtp=False)
        ok &= report["passed"]
        print(format_report(f"length {length:3d} kv bf16", report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
