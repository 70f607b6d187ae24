#!/usr/bin/env bash
# dayzero side by side with llama.cpp on the same model shape, in one run (docs/performance.md
# "The peer"). The shape is bench/configs/deepseek-v2-lite-shape.json: bench/peer_gguf.py writes it
# as a synthetic llama.cpp `deepseek2` GGUF (Q4_0 experts, Q8_0 elsewhere, vocab 512) and as the
# same config with vocab 512 for dayzero. The run: the machine's limits (`dayzero bench limits`),
# llama-bench and llama-batched-bench, `dayzero bench decode` / `prefill` on the same shape,
# threads and contexts, the DSA variant (dayzero only), the limits again (the bracket). Every raw
# output lands in OUTDIR; bench/peer_report.py prints the table (OUTDIR/table.md, table.json).
#
# Usage: bench/peer_llamacpp.sh --llama LLAMA_DIR --dayzero PATH/TO/dayzero --gguf PATH.gguf
#            --out OUTDIR [--llama-build BUILD_DIR] [--threads 2] [--mxint8] [--quick]
#   LLAMA_DIR: a llama.cpp source tree (its gguf-py writes the GGUF) built in BUILD_DIR
#   (default LLAMA_DIR/build; bin/llama-bench, bin/llama-batched-bench). A missing GGUF is written (6.2 GiB, about a minute).
#   --mxint8: also run dayzero's decode (B=1 at the mid context, the batches) and prefill rows with
#   --mxfp4-activations mxint8 (8-bit activations of the MXFP4 experts, as llama.cpp's Q8 blocks).
#   --quick: one repetition, batches 1 and 4, shorter contexts and prompts (a smoke test of a few
#   minutes; its figures are not the comparison).
# Run it on a quiet machine: other processes take cores and memory bandwidth from both sides.
set -euo pipefail

usage() {
  sed -n '/^# Usage:/,/^#   --quick/p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
die() { echo "peer_llamacpp.sh: $*" >&2; exit 1; }
step() { echo "[$(date +%T)] $*" >&2; }

llama="" llama_build="" dayzero="" gguf="" out="" threads=2 quick=0 mxint8=0
while (($#)); do
  case $1 in
    --llama) llama=${2:?--llama needs a directory}; shift 2 ;;
    --llama-build) llama_build=${2:?--llama-build needs a directory}; shift 2 ;;
    --dayzero) dayzero=${2:?--dayzero needs a path}; shift 2 ;;
    --gguf) gguf=${2:?--gguf needs a path}; shift 2 ;;
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --threads) threads=${2:?--threads needs a number}; shift 2 ;;
    --quick) quick=1; shift ;;
    --mxint8) mxint8=1; shift ;;
    -h | --help) usage ;;
    *) echo "peer_llamacpp.sh: unknown argument $1" >&2; usage ;;
  esac
done
[[ -n $llama && -n $dayzero && -n $gguf && -n $out ]] || usage
[[ $threads =~ ^[1-9][0-9]*$ ]] || die "--threads $threads: expected a positive integer"

repo=$(cd "$(dirname "$0")/.." && pwd)
python=/usr/bin/python3
shape=$repo/bench/configs/deepseek-v2-lite-shape.json
shape_dsa=$repo/bench/configs/deepseek-v2-lite-shape-dsa.json
llama_build=${llama_build:-$llama/build}
llama_bench=$llama_build/bin/llama-bench
batched_bench=$llama_build/bin/llama-batched-bench

[[ -d $llama ]] || die "--llama $llama: no such directory"
[[ -x $llama_bench ]] || die "no llama-bench binary at $llama_bench (build it: cmake --build $llama_build --target llama-bench llama-batched-bench)"
[[ -x $batched_bench ]] || die "no llama-batched-bench binary at $batched_bench (build it: cmake --build $llama_build --target llama-bench llama-batched-bench)"
[[ -f $llama/gguf-py/gguf/__init__.py ]] || die "no gguf-py at $llama/gguf-py (the gguf Python package of the llama.cpp tree)"
[[ -x $dayzero ]] || die "--dayzero $dayzero: no executable there (make build)"
[[ -x $python ]] || die "no $python (Debian's python3, with numpy, writes the GGUF and the report)"
[[ -f $shape && -f $shape_dsa ]] || die "no $shape or $shape_dsa"
[[ $gguf == *.gguf ]] || die "--gguf $gguf: expected a path ending in .gguf"
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The sweep. Full: the table of docs/performance.md "The peer". Quick: everything shorter.
if ((quick)); then
  reps=1 short_gen=32 mid=256 long=512 prompts=128,256 batches=1,4 batch_gen=8 dsa_contexts=1K,4K
  dz_steps=(--seconds 0.2 --min-steps 2 --max-steps 4) dz_limits=(--limits-seconds 0.1)
  limits_seconds=0.2
else
  reps=3 short_gen=128 mid=1024 long=4096 prompts=512,2048 batches=1,4,16,64 batch_gen=32
  dsa_contexts=1K,32K dz_steps=() dz_limits=() limits_seconds=1
fi
short_context=$((short_gen / 2))  # llama-bench's generation runs from context 0 to short_gen
max_batch=${batches##*,}
batched_ctx=$((max_batch * (mid + batch_gen)))  # -pps: each sequence holds the prompt + its tokens

cat > "$out/run.json" <<EOF
{"threads": $threads, "quick": $quick, "mxint8": $mxint8, "reps": $reps, "short_gen": $short_gen,
 "short_context": $short_context, "mid_context": $mid, "long_context": $long,
 "prompts": [$prompts], "batches": [$batches], "batch_gen": $batch_gen,
 "dsa_contexts": "$dsa_contexts", "gguf": "$gguf", "llama_dir": "$llama", "llama_build": "$llama_build", "dayzero": "$dayzero"}
EOF
uptime > "$out/uptime_start.txt"
lscpu > "$out/lscpu.txt"
git -C "$repo" rev-parse HEAD > "$out/commit.txt" 2>/dev/null || true

# The shape, derived once from the repository's configs (bench/peer_gguf.py holds the vocab size).
step "shapes: $out/dayzero-shape-vocab512.json, $out/dayzero-shape-dsa-vocab512.json"
"$python" "$repo/bench/peer_gguf.py" --config "$shape" --dayzero-config "$out/dayzero-shape-vocab512.json"
"$python" "$repo/bench/peer_gguf.py" --config "$shape_dsa" \
  --dayzero-config "$out/dayzero-shape-dsa-vocab512.json"
dz_shape=$out/dayzero-shape-vocab512.json
dz_shape_dsa=$out/dayzero-shape-dsa-vocab512.json

export PYTHONPATH=$llama/gguf-py${PYTHONPATH:+:$PYTHONPATH}
if [[ -f $gguf ]]; then
  step "gguf: $gguf exists; checking its shape"
  "$python" "$repo/bench/peer_gguf.py" --config "$shape" --check-gguf "$gguf"
else
  step "gguf: writing $gguf (6.2 GiB, about a minute)"
  mkdir -p "$(dirname "$gguf")"
  "$python" "$repo/bench/peer_gguf.py" --config "$shape" --gguf "$gguf.partial"
  mv "$gguf.partial" "$gguf"
fi

run() {  # run NAME COMMAND...: stdout to OUTDIR/NAME.out, stderr to OUTDIR/NAME.log
  local name=$1 status=0; shift
  step "$name: $*"
  printf '%s\n' "$*" > "$out/$name.cmd"
  "$@" > "$out/$name.out" 2> "$out/$name.log" || status=$?
  ((status == 0)) && return
  if [[ $name == llama* ]] && { ((status == 132)) || grep -q 'cur_backend_id != -1' "$out/$name.log"; }; then
    # Seen with GGML_NATIVE on an AMX machine: llama.cpp's AMX buffer takes the Q8_0 attn_k_b /
    # attn_v_b, whose per-head products it cannot run (with those in BF16, its AMX Q8_0 kernel
    # then stopped on SIGILL).
    echo "peer_llamacpp.sh: llama.cpp's CPU backend could not run the model (SIGILL or" \
      "GGML_ASSERT(*cur_backend_id != -1)); if this CPU has AMX, build llama.cpp without its AMX" \
      "kernels: -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" \
      "-DGGML_BMI2=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON" \
      "-DGGML_AVX512_BF16=ON (AMX stays off; see docs/performance.md)" >&2
  fi
  die "$name failed (exit $status): $*; see $out/$name.log"
}

run limits_start "$dayzero" bench limits --json --threads "$threads" --seconds "$limits_seconds"
run limits_start_1thread "$dayzero" bench limits --json --threads 1 --seconds "$limits_seconds"

# llama.cpp: llama-bench (JSON), then llama-batched-bench (JSONL where this version has it). The
# model is read into memory, not mapped: mapped, the first timed generation also faults in every
# expert the one-token warm-up did not touch (tg32 at 2.4 instead of 9.2 tokens/s here).
lb() { run "$1" "$llama_bench" -m "$gguf" -mmp 0 -r "$reps" -o json "${@:2}"; }
lb llama_bench -p "$prompts" -n "$short_gen" -t "$threads"
lb llama_bench_depth -p 0 -n 32 -d "$mid,$long" -t "$threads"
lb llama_bench_depth_1thread -p 0 -n 32 -d "$mid" -t 1
batched_format=() batched_help=$("$batched_bench" --help 2>&1 || true)
if [[ $batched_help == *--output-format*jsonl* ]]; then  # else bench/peer_report.py reads the table
  batched_format=(--output-format jsonl)
fi
run llama_batched_bench "$batched_bench" -m "$gguf" --no-mmap -c "$batched_ctx" -b 2048 -ub 512 \
  -npp "$mid" -ntg "$batch_gen" -npl "$batches" -pps -t "$threads" "${batched_format[@]}"

# dayzero on the same shape (its own formats: FP8 block weights, MXFP4 experts, FP8 latent cache).
dz() { run "$1" "$dayzero" bench "${@:2}" "${dz_limits[@]}" --json; }
dz dayzero_decode_contexts decode --config "$dz_shape" --threads "$threads" --batch 1 \
  --context "$short_context,$mid,$long" "${dz_steps[@]}"
dz dayzero_decode_1thread decode --config "$dz_shape" --threads 1 --batch 1 --context "$mid" \
  "${dz_steps[@]}"
dz dayzero_decode_batch decode --config "$dz_shape" --threads "$threads" --batch "$batches" \
  --context "$mid" "${dz_steps[@]}"
dz dayzero_prefill prefill --config "$dz_shape" --threads "$threads" --tokens "$prompts" \
  --chunk 2048
dz dayzero_decode_dsa decode --config "$dz_shape_dsa" --threads "$threads" --batch 1 \
  --context "$dsa_contexts" "${dz_steps[@]}"
if ((mxint8)); then
  int8=(--mxfp4-activations mxint8)
  dz dayzero_mxint8_decode_batch decode --config "$dz_shape" --threads "$threads" \
    --batch "$batches" --context "$mid" "${int8[@]}" "${dz_steps[@]}"
  dz dayzero_mxint8_prefill prefill --config "$dz_shape" --threads "$threads" --tokens "$prompts" \
    --chunk 2048 "${int8[@]}"
fi

run limits_end "$dayzero" bench limits --json --threads "$threads" --seconds "$limits_seconds"
run limits_end_1thread "$dayzero" bench limits --json --threads 1 --seconds "$limits_seconds"
uptime > "$out/uptime_end.txt"

step "report: $out/table.md, $out/table.json"
"$python" "$repo/bench/peer_report.py" "$out" --json "$out/table.json" | tee "$out/table.md"
