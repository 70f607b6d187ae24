"""The table of docs/performance.md from one run of bench/run_suite.sh.

    /usr/bin/python3 bench/suite_report.py bench-results > table.md

Every figure is printed with the fraction of the limit its own command measured in the same run
(each `dayzero bench` command measures DRAM bandwidth and the GEMM peaks before it starts), the
target of docs/performance.md / issue 8 where there is one, and the command that produced it.
"""

import json
import sys
from pathlib import Path


def load(out, name):
    path = out / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"


def verdict(value, target):
    if value is None or target is None:
        return ""
    return "met" if value >= target else f"**missed** ({value / target:.0%} of target)"


def main():
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "bench-results")
    rows = []  # (figure, value, fraction, target, verdict, command)

    def row(figure, value, fraction=None, target=None, command=""):
        check = fraction if fraction is not None else None
        rows.append((figure, value, fmt(fraction, 3) if fraction is not None else "",
                     "" if target is None else f"≥ {target:g}", verdict(check, target), command))

    limits = load(out, "limits")
    limits1 = load(out, "limits_1thread")
    print(f"Commit {(out / 'commit.txt').read_text().strip() if (out / 'commit.txt').exists() else '?'}; "
          f"load at start: {(out / 'uptime_start.txt').read_text().strip()}; "
          f"at end: {(out / 'uptime_end.txt').read_text().strip() if (out / 'uptime_end.txt').exists() else '?'}\n")
    if limits:
        print("| limit | figure | kernel |\n|---|---|---|")
        print(f"| DRAM read, {limits['num_threads']} threads | {limits['dram_read_gbps']:.1f} GB/s | |")
        print(f"| DRAM read, 1 thread | {limits['dram_read_gbps_1thread']:.1f} GB/s | |")
        print(f"| FP32 GEMM, {limits['num_threads']} threads | {limits['gemm_f32_gflops']:.0f} GFLOP/s | {limits['gemm_f32_impl']} |")
        print(f"| BF16 GEMM, {limits['num_threads']} threads | {limits['gemm_bf16_gflops']:.0f} GFLOP/s | {limits['gemm_bf16_impl']} |")
        if limits1:
            print(f"| FP32 / BF16 GEMM, 1 thread | {limits1['gemm_f32_gflops']:.0f} / {limits1['gemm_bf16_gflops']:.0f} GFLOP/s | |")
        print("\n(`dayzero bench limits --json`, `--threads 1`)\n")

    gemv_targets = {"linear.fp8.gemv.t1": 0.8, "linear.mxfp4.gemv.t1": 0.8}
    for name, cmd in (("ops", "dayzero bench ops"), ("ops_1thread", "dayzero bench ops --threads 1 --filter linear")):
        ops = load(out, name)
        if not ops:
            continue
        lim = ops["limits"]
        for case in ops["cases"]:
            kind = case["limit_kind"]
            rate = (f"{case['gbps']:.1f} GB/s" if kind == "dram" else f"{case['gflops']:.0f} GFLOP/s")
            target = gemv_targets.get(case["name"])
            if case["name"] == "linear.bf16.t1024":
                target = 0.7  # prefill GEMMs ≥ 70 % of the best GEMM peak
            row(f"{case['name']} ({case['shape']}), {ops['threads']} thr", f"{case['ms']:.3f} ms, {rate}",
                case["fraction"], target, f"`{cmd}` (of {kind}: {case['limit']:.1f})")
        for ratio in ops.get("ratios", []):
            target = ratio.get("target")
            rows.append((f"{ratio['name']}, {ops['threads']} thr", f"{ratio['value']:.2f}×", "",
                         "" if target is None else f"≥ {target:g}×",
                         verdict(ratio["value"], target), f"`{cmd}`"))

    for config in ("deepseek-v2-lite-shape", "deepseek-v2-lite-shape-dsa", "kimi-linear-shape",
                   "dense_bw", "moe_bw"):
        dec = load(out, f"decode_batch_{config}")
        if dec:
            cmd = f"`dayzero bench decode --config bench/configs/{config}.json --batch 1,4,16,64 --context 1K`"
            for r in dec["rows"]:
                b = r["batch"]
                if b == 1:
                    row(f"{config}: decode B=1, ctx {r['context']}, {dec['threads']} thr",
                        f"{r['ms_per_step']:.1f} ms/step, {r['tokens_per_second']:.2f} tok/s, "
                        f"{r['bytes_per_step'] / 2**20:.0f} MiB/step, {r['gbps']:.1f} GB/s",
                        r["dram_fraction"], 0.8, cmd + " (of DRAM)")
                else:
                    row(f"{config}: decode B={b}, ctx {r['context']}: achieved / ideal speedup",
                        f"{r['tokens_per_second']:.2f} tok/s, speedup {r['speedup']:.2f} of ideal "
                        f"{r['ideal_speedup']:.2f} ({r['distinct_experts_per_layer']:.1f} experts/layer)",
                        r["achieved_over_ideal"], 0.8, cmd)
        ctx = load(out, f"decode_context_{config}")
        if ctx:
            cmd = f"`dayzero bench decode --config bench/configs/{config}.json --batch 1 --context 1K,8K,32K,128K`"
            for r in ctx["rows"]:
                row(f"{config}: decode B=1, ctx {r['context']}",
                    f"{r['ms_per_step']:.1f} ms/step, {r['tokens_per_second']:.2f} tok/s "
                    f"({r['vs_first_context']:.2f} of ctx {ctx['rows'][0]['context']})",
                    r["dram_fraction"], None, cmd + " (fraction: of DRAM)")
    dense = load(out, "decode_context_deepseek-v2-lite-shape")
    sparse = load(out, "decode_context_deepseek-v2-lite-shape-dsa")
    if dense and sparse:
        d = {r["context"]: r for r in dense["rows"]}
        for r in sparse["rows"]:
            if r["context"] in d:
                speedup = d[r["context"]]["ms_per_step"] / r["ms_per_step"]
                target = 5 if r["context"] >= 128 * 1024 else None
                rows.append((f"DSA vs dense decode per token, whole model, ctx {r['context']}",
                             f"{speedup:.2f}×", "", "" if target is None else "≥ 5×",
                             verdict(speedup, target), "the two context sweeps above"))

    for config in ("deepseek-v2-lite-shape", "dense_bw"):
        pre = load(out, f"prefill_{config}")
        if pre:
            for r in pre["rows"]:
                row(f"{config}: prefill {r['tokens']} tokens (chunk {r['chunk']}), {pre['threads']} thr",
                    f"{r['tokens_per_second']:.0f} tok/s, {r['gflops']:.0f} GFLOP/s",
                    r["gemm_fraction"], 0.7,
                    f"`dayzero bench prefill --config bench/configs/{config}.json --tokens 512,2048` (of best GEMM peak {pre['gemm_peak_gflops']:.0f})")

    for name in ("peer_2threads", "peer_1thread"):
        peer = load(out, name)
        if not peer:
            continue
        cmd = f"`bench/peer_demo.py --threads {peer['threads']}`"
        if "prefill" in peer:
            p = peer["prefill"]
            rows.append((f"demo model prefill, dayzero / PyTorch, {peer['threads']} thr",
                         f"{p['dayzero_tokens_per_s']:.0f} / {p['pytorch_tokens_per_s']:.0f} tok/s = "
                         f"{p['ratio_dayzero_over_pytorch']:.2f}×", "", "", "", cmd))
        d = peer["decode"]
        rows.append((f"demo model decode, dayzero / PyTorch ({d['pytorch_path']}), {peer['threads']} thr",
                     f"{d['dayzero_tokens_per_s']:.0f} / {d['pytorch_tokens_per_s']:.1f} tok/s = "
                     f"{d['ratio_dayzero_over_pytorch']:.2f}×", "", "", "", cmd))

    print("| figure | value | fraction of limit | target | | command |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")


if __name__ == "__main__":
    main()
