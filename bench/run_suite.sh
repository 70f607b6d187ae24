#!/usr/bin/env bash
# The whole benchmark suite in one run (issue 8, docs/performance.md): the machine's limits, every
# operator, end-to-end decode (batch and context sweeps) and prefill on the bandwidth-bound
# synthetic configs, and the PyTorch peer on the demo model. Each command measures its limits again
# in the same run and reports its figures against them; every JSON lands in OUT_DIR, and
# bench/suite_report.py turns them into the table of docs/performance.md.
#
# Usage: bench/run_suite.sh [DAYZERO_BINARY] [OUT_DIR]     (from the repository root)
# Run it on a quiet machine: other processes take cores and memory bandwidth from the figures.
set -euo pipefail
cd "$(dirname "$0")/.."
dayzero=${1:-build/src/dayzero/cli/dayzero}
out=${2:-bench-results}
mkdir -p "$out"
[[ -x $dayzero ]] || { echo "run_suite.sh: no dayzero binary at $dayzero (make build)" >&2; exit 1; }

step() { echo "[$(date +%T)] $*" >&2; }
run_json() {  # run_json NAME COMMAND...: stdout (one JSON object) to OUT_DIR/NAME.json
  local name=$1; shift
  step "$name: $*"
  "$@" > "$out/$name.json"
}

uptime > "$out/uptime_start.txt"
lscpu > "$out/lscpu.txt"
git rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true

run_json limits "$dayzero" bench limits --json
run_json limits_1thread "$dayzero" bench limits --json --threads 1
run_json ops "$dayzero" bench ops --json
run_json ops_1thread "$dayzero" bench ops --json --threads 1 --filter linear

for config in deepseek-v2-lite-shape deepseek-v2-lite-shape-dsa kimi-linear-shape; do
  run_json "decode_batch_$config" "$dayzero" bench decode --config "bench/configs/$config.json" \
    --json --batch 1,4,16,64 --context 1K
  run_json "decode_context_$config" "$dayzero" bench decode --config "bench/configs/$config.json" \
    --json --batch 1 --context 1K,8K,32K,128K
done
for config in dense_bw moe_bw; do
  run_json "decode_batch_$config" "$dayzero" bench decode --config "bench/configs/$config.json" \
    --json --batch 1,4,16,64 --context 1K
done
for config in deepseek-v2-lite-shape dense_bw; do
  run_json "prefill_$config" "$dayzero" bench prefill --config "bench/configs/$config.json" \
    --json --tokens 512,2048 --chunk 2048
done

step "peer: bench/peer_demo.py (2 threads, then 1)"
PYTHONPATH=python /usr/bin/python3 bench/peer_demo.py --dayzero "$dayzero" --threads 2 --json \
  > "$out/peer_2threads.json"
PYTHONPATH=python /usr/bin/python3 bench/peer_demo.py --dayzero "$dayzero" --threads 1 --json \
  > "$out/peer_1thread.json"

uptime > "$out/uptime_end.txt"
step "done: $out (report: /usr/bin/python3 bench/suite_report.py $out)"
