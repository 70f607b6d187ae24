#!/usr/bin/env bash
# `dayzero bench limits` runs end to end and reports positive figures and the oneDNN kernels used.
# Speed itself is not asserted here (docs/performance.md: timing belongs in benchmarks, not tests).
set -euo pipefail
# Its own file: the cli tests run in parallel in one folder (ctest -j).
err=$(mktemp)
dayzero=$1
out=$("$dayzero" bench limits --json --seconds 0.05 --dram-mib 64)
/usr/bin/python3 - "$out" <<'PY'
import json, sys
limits = json.loads(sys.argv[1])
for key in ("dram_read_gbps_1thread", "dram_read_gbps", "gemm_f32_gflops", "gemm_bf16_gflops"):
    assert limits[key] > 0, (key, limits)
assert limits["num_threads"] >= 1
assert limits["gemm_f32_impl"] and limits["gemm_bf16_impl"], limits
print("bench limits:", limits)
PY
# Bad options are refused with a message, not a crash.
if "$dayzero" bench limits --dram-mib 1 2>"$err"; then echo "expected failure"; exit 1; fi
grep -q "dram-mib" "$err"
rm -f "$err"
