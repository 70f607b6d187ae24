"""The table of one bench/peer_llamacpp.sh run: llama.cpp and dayzero on the same shape, side by side.

    /usr/bin/python3 bench/peer_report.py OUTDIR [--json OUTDIR/table.json] > table.md

Reads the raw outputs the script saved in OUTDIR (run.json: the sweep it ran; llama-bench `-o json`;
llama-batched-bench JSONL, or its markdown table where the version has no --output-format; dayzero's
`--json`; `dayzero bench limits --json` at the start and at the end) and prints one markdown table:
what | llama.cpp | dayzero | ratio (dayzero / llama.cpp, > 1: dayzero faster) | dayzero's fraction of
its limit, measured by the same dayzero command (DRAM read bandwidth for decode, the best GEMM peak
for prefill: docs/performance.md "How to report a speed") | notes. --json writes the same rows for
scripts. A figure that is missing from OUTDIR prints as "—", is named on stderr, and the exit status
is 1.
"""

import argparse
import json
import re
import sys
from pathlib import Path


def fmt(x, digits=2):
    return "—" if x is None else f"{x:.{digits}f}"


class Run:
    """OUTDIR's raw outputs, read on demand; what is missing is collected in `missing`."""

    def __init__(self, out):
        self.out = out
        self.missing = []
        self.params = self.json("run") or {}

    def text(self, name):
        path = self.out / name
        if not path.exists():
            self.missing.append(name)
            return None
        return path.read_text()

    def json(self, name):
        text = self.text(f"{name}.out" if name != "run" else "run.json")
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError as error:
            self.missing.append(f"{name}.out (not JSON: {error})")
            return None

    def llama_bench(self, name, n_prompt, n_gen, n_depth):
        """avg_ts of the llama-bench test (n_prompt, n_gen, n_depth) in NAME.out, and the test."""
        for test in self.json(name) or []:
            if (test["n_prompt"], test["n_gen"], test["n_depth"]) == (n_prompt, n_gen, n_depth):
                return test["avg_ts"], test
        self.missing.append(f"{name}.out: llama-bench test p{n_prompt} n{n_gen} d{n_depth}")
        return None, None

    def batched(self):
        """{pl: speed_tg} from llama-batched-bench: JSONL lines, else the rows of its markdown
        table (| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |)."""
        result = {}
        for name in ("llama_batched_bench.out", "llama_batched_bench.log"):
            path = self.out / name
            for line in path.read_text().splitlines() if path.exists() else []:
                line = line.strip()
                if line.startswith("{") and '"speed_tg"' in line:
                    row = json.loads(line)
                    result[row["pl"]] = row["speed_tg"]
                elif re.match(r"^\|\s*\d", line):
                    cells = [c.strip() for c in line.strip("|").split("|")]
                    result[int(cells[2])] = float(cells[7])
            if result:
                return result
        self.missing.append("llama_batched_bench.out: no S_TG rows")
        return result

    def dayzero_row(self, name, **match):
        data = self.json(name)
        for row in (data or {}).get("rows", []):
            if all(row.get(k) == v for k, v in match.items()):
                return row
        if data is not None:
            self.missing.append(f"{name}.out: no row {match}")
        return None


def rows_of(run):
    """The table: dicts with what, llama_cpp, dayzero (tokens/s), ratio, fraction, fraction_of,
    notes."""
    p = run.params
    threads = p.get("threads", 2)
    rows = []

    def add(what, llama, dayzero, fraction=None, fraction_of="", notes=""):
        ratio = dayzero / llama if llama and dayzero is not None else None
        rows.append({"what": what, "llama_cpp": llama, "dayzero": dayzero, "ratio": ratio,
                     "fraction": fraction, "fraction_of": fraction_of, "notes": notes})

    def decode(what, llama, row):
        add(what, llama, row and row["tokens_per_second"], row and row.get("dram_fraction"),
            "DRAM" if row else "")

    short_gen, short_ctx = p.get("short_gen", 128), p.get("short_context", 64)
    mid, long = p.get("mid_context", 1024), p.get("long_context", 4096)
    short_llama, _ = run.llama_bench("llama_bench", 0, short_gen, 0)
    decode(f"decode B=1, context 0–{short_gen} (llama-bench tg{short_gen}; dayzero context "
           f"{short_ctx}), {threads} thr", short_llama,
           run.dayzero_row("dayzero_decode_contexts", batch=1, context=short_ctx))
    decode(f"decode B=1, context {mid}, {threads} thr",
           run.llama_bench("llama_bench_depth", 0, 32, mid)[0],
           run.dayzero_row("dayzero_decode_contexts", batch=1, context=mid))
    decode(f"decode B=1, context {mid}, 1 thr",
           run.llama_bench("llama_bench_depth_1thread", 0, 32, mid)[0],
           run.dayzero_row("dayzero_decode_1thread", batch=1, context=mid))

    batched = run.batched()
    base = batched.get(1)
    for batch in p.get("batches", [1, 4, 16, 64]):
        row = run.dayzero_row("dayzero_decode_batch", batch=batch, context=mid)
        llama = batched.get(batch)
        if llama is None and batched:
            run.missing.append(f"llama_batched_bench.out: no B={batch} row")
        notes = ""
        if batch > 1 and row:
            llama_speedup = f"{llama / base:.2f}×" if llama and base else "—"
            notes = (f"speedup over B=1: llama.cpp {llama_speedup}, dayzero {row['speedup']:.2f}× "
                     f"of ideal {fmt(row.get('ideal_speedup'))}× (achieved/ideal "
                     f"{fmt(row.get('achieved_over_ideal'))}, "
                     f"{row['distinct_experts_per_layer']:.1f} experts/layer)")
        add(f"decode B={batch}, context {mid}, {threads} thr (llama-batched-bench S_TG)", llama,
            row and row["tokens_per_second"], row and row.get("dram_fraction"),
            "DRAM" if row else "", notes)

    for tokens in p.get("prompts", [512, 2048]):
        row = run.dayzero_row("dayzero_prefill", tokens=tokens)
        add(f"prefill {tokens} tokens, {threads} thr", run.llama_bench("llama_bench", tokens, 0, 0)[0],
            row and row["tokens_per_second"], row and row.get("gemm_fraction"),
            "best GEMM peak" if row else "",
            f"dayzero chunk {row['chunk']}, {fmt(row.get('gflops'), 0)} GFLOP/s" if row else "")

    long_llama, _ = run.llama_bench("llama_bench_depth", 0, 32, long)
    long_row = run.dayzero_row("dayzero_decode_contexts", batch=1, context=long)
    short_row = run.dayzero_row("dayzero_decode_contexts", batch=1, context=short_ctx)
    notes = ""
    if long_llama and short_llama and long_row and short_row:
        notes = (f"of the context-0 speed: llama.cpp {long_llama / short_llama:.2f}, dayzero "
                 f"{long_row['tokens_per_second'] / short_row['tokens_per_second']:.2f}")
    add(f"decode B=1, context {long}, {threads} thr", long_llama,
        long_row and long_row["tokens_per_second"], long_row and long_row.get("dram_fraction"),
        "DRAM" if long_row else "", notes)

    if p.get("mxint8"):  # bench/peer_llamacpp.sh --mxint8: the same rows, 8-bit activations
        for batch in p.get("batches", [1, 4, 16, 64]):
            row = run.dayzero_row("dayzero_mxint8_decode_batch", batch=batch, context=mid)
            llama = batched.get(batch)
            notes = (f"speedup over B=1: {row['speedup']:.2f}× of ideal "
                     f"{fmt(row.get('ideal_speedup'))}× (achieved/ideal "
                     f"{fmt(row.get('achieved_over_ideal'))})" if batch > 1 and row else "")
            add(f"decode B={batch}, context {mid}, {threads} thr, dayzero with MXINT8 activations",
                llama, row and row["tokens_per_second"], row and row.get("dram_fraction"),
                "DRAM" if row else "", notes)
        for tokens in p.get("prompts", [512, 2048]):
            row = run.dayzero_row("dayzero_mxint8_prefill", tokens=tokens)
            add(f"prefill {tokens} tokens, {threads} thr, dayzero with MXINT8 activations",
                run.llama_bench("llama_bench", tokens, 0, 0)[0],
                row and row["tokens_per_second"], row and row.get("gemm_fraction"),
                "best GEMM peak" if row else "",
                f"{fmt(row.get('gflops'), 0)} GFLOP/s" if row else "")

    dsa = run.json("dayzero_decode_dsa")
    dsa_rows = [r for r in (dsa or {}).get("rows", []) if r["batch"] == 1]
    for r in dsa_rows:
        add(f"DSA variant (dayzero only): decode B=1, context {r['context']}, {threads} thr", None,
            r["tokens_per_second"], r.get("dram_fraction"), "DRAM",
            f"{r['ms_per_step']:.1f} ms/step, {r['bytes_per_step'] / 2**20:.0f} MiB/step"
            if "bytes_per_step" in r else "")
    if len(dsa_rows) >= 2:
        first, last = dsa_rows[0], dsa_rows[-1]
        rows.append({"what": f"DSA variant: decode speed at context {last['context']} / at "
                             f"{first['context']}", "llama_cpp": None, "dayzero": None,
                     "ratio": last["tokens_per_second"] / first["tokens_per_second"],
                     "fraction": None, "fraction_of": "",
                     "notes": "dayzero only: the peer GGUF is deepseek2, dense MLA"})
    elif dsa is not None:
        run.missing.append("dayzero_decode_dsa.out: fewer than two B=1 contexts")
    return rows


def limits_of(run):
    """{"start"/"end": {"threads": .., "1thread": ..}} from `dayzero bench limits --json`."""
    out = {}
    for when in ("start", "end"):
        out[when] = {"threads": run.json(f"limits_{when}"), "1thread": run.json(f"limits_{when}_1thread")}
    return out


def print_limits(limits, threads):
    print("| limit | start | end |\n|---|---|---|")

    def line(what, key, which, unit, digits):
        values = [(limits[w][which] or {}).get(key) for w in ("start", "end")]
        print(f"| {what} | " + " | ".join(f"{fmt(v, digits)} {unit}" for v in values) + " |")

    line(f"DRAM read, {threads} threads", "dram_read_gbps", "threads", "GB/s", 1)
    line("DRAM read, 1 thread", "dram_read_gbps_1thread", "threads", "GB/s", 1)
    line(f"FP32 GEMM, {threads} threads", "gemm_f32_gflops", "threads", "GFLOP/s", 0)
    line(f"BF16 GEMM, {threads} threads", "gemm_bf16_gflops", "threads", "GFLOP/s", 0)
    line("FP32 GEMM, 1 thread", "gemm_f32_gflops", "1thread", "GFLOP/s", 0)
    line("BF16 GEMM, 1 thread", "gemm_bf16_gflops", "1thread", "GFLOP/s", 0)
    start = limits["start"]["threads"] or {}
    print(f"\n(`dayzero bench limits --json`, `--threads 1`, before and after the run; GEMM kernels "
          f"{start.get('gemm_f32_impl', '?')} / {start.get('gemm_bf16_impl', '?')})\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the --out directory of bench/peer_llamacpp.sh")
    parser.add_argument("--json", type=Path, help="also write the rows and limits here")
    args = parser.parse_args()
    if not args.out.is_dir():
        raise SystemExit(f"peer_report.py: {args.out}: no such directory")
    run = Run(args.out)
    threads = run.params.get("threads", 2)

    def first_line(name):
        path = args.out / name
        return path.read_text().strip() if path.exists() else "?"

    _, bench_test = run.llama_bench("llama_bench", 0, run.params.get("short_gen", 128), 0)
    meta = {"commit": first_line("commit.txt"),
            "llama_cpp_build": (f"{bench_test['build_commit']} ({bench_test['build_number']})"
                                if bench_test else "?"),
            "cpu": bench_test["cpu_info"] if bench_test else "?",
            "load_start": first_line("uptime_start.txt"), "load_end": first_line("uptime_end.txt"),
            "quick": bool(run.params.get("quick")), "threads": threads,
            "llama_cpp_cache": (f"K {bench_test['type_k']}, V {bench_test['type_v']}, flash_attn "
                                f"{bench_test['flash_attn']}" if bench_test else "?"),
            "gguf": run.params.get("gguf")}
    print(f"dayzero {meta['commit']} vs llama.cpp {meta['llama_cpp_build']} on {meta['cpu']}, "
          f"{threads} threads")
    print(f"load at start: {meta['load_start']}; at end: {meta['load_end']}")
    if meta["quick"]:
        print("\n**--quick run: short sweeps, one repetition — a smoke test, not the comparison.**")
    print()
    limits = limits_of(run)
    print_limits(limits, threads)
    rows = rows_of(run)
    print("| what | llama.cpp tok/s | dayzero tok/s | ratio (dayzero / llama.cpp) "
          "| dayzero, fraction of limit | notes |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        fraction = f"{fmt(r['fraction'], 3)} of {r['fraction_of']}" if r["fraction"] is not None else ""
        print(f"| {r['what']} | {fmt(r['llama_cpp'])} | {fmt(r['dayzero'])} | "
              f"{fmt(r['ratio'])}{'×' if r['ratio'] is not None else ''} | {fraction} | {r['notes']} |")
    print("\nllama.cpp: `llama-bench` (tg/pp avg_ts, `-d` for the context), `llama-batched-bench -pps` "
          f"(S_TG); GGUF Q4_0 experts, Q8_0 elsewhere, cache {meta['llama_cpp_cache']}. dayzero: `dayzero bench decode / "
          "prefill --json` on the same shape (FP8 block weights, MXFP4 experts, FP8 latent cache, "
          "synthetic cached context). Commands: OUTDIR/*.cmd; raw outputs: OUTDIR/*.out, *.log.")
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "limits": limits, "rows": rows}, indent=1) + "\n")
    if run.missing:
        print("peer_report.py: missing from " + str(args.out) + ":\n  " + "\n  ".join(run.missing),
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
