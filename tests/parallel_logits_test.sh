#!/usr/bin/env bash
# `mpirun -np N dayzero logits --tp N` against the single process (docs/parallel.md): every
# architecture (tiny DeepSeek-V3.2: MLA heads, the replicated DSA indexer, dense MLP and MoE;
# Kimi-Linear: KDA heads and their states; Kimi-K3: latent MoE, AttnRes, gated MLA; the demo model,
# dayzero_hybrid) at TP 2 and TP 4 (4 ranks oversubscribe 2 cores), full prefill, chunked prefill
# and decode, within the model-level tolerance; the bytes each rank received equal the all-reduce
# and gather formulas; impossible plans fail on every rank with a message, never a hang.
# $1 = the dayzero binary; ctest sets PYTHONPATH (python/).
set -euo pipefail
dayzero=$1
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe --bind-to none --mca btl self,vader
        --mca btl_vader_single_copy_mechanism none -x OMP_NUM_THREADS=1)

fail() { echo "FAIL: $*" >&2; exit 1; }

for arch in deepseek_v32 kimi_linear kimi_k3; do
  "$python" -m dayzero_ref.make_tiny "$arch" "$work/$arch" --seed 3 >/dev/null
done
compare() {  # compare A.npy B.npy: per-position relative L2 and argmax agreement
  "$python" - "$1" "$2" <<'PY'
import sys
import numpy as np
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.shape == b.shape, (a.shape, b.shape)
rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
agree = (a.argmax(1) == b.argmax(1)).mean()
print(f"  max rel L2 {rel.max():.2e}, median {np.median(rel):.2e}, argmax agreement {agree:.3f}")
# Model-level tolerance of docs/models.md §8.1 (BF16 activations): only the order of FP32 sums
# differs between layouts, so a BF16 rounding flips here and there.
assert np.median(rel) < 2e-2 and agree >= 0.95, "multi-rank logits differ from one process"
PY
}

run_paths() {  # run_paths MODEL_DIR VOCAB: every path at TP 2 and 4 against one process
  local model=$1 vocab=$2
  # 40 tokens: past index_topk (16) of the DSA models, so the indexer selects in prefill and decode.
  local ids
  ids=$("$python" -c "import random; r = random.Random(5); print(','.join(str(r.randrange($vocab)) for _ in range(40)))")
  for path in "" "--prefill-chunk 7" "--decode-from 10" "--decode-from 17 --prefill-chunk 5"; do
    echo "$(basename "$model"), path: ${path:-full prefill}"
    # shellcheck disable=SC2086
    "$dayzero" --log-level warn logits --model "$model" --token-ids "$ids" --threads 1 $path \
      --output "$work/one.npy"
    for tp in 2 4; do
      # shellcheck disable=SC2086
      "${mpirun[@]}" -np $tp "$dayzero" logits --model "$model" --token-ids "$ids" --threads 1 \
        --tp $tp $path --output "$work/tp$tp.npy" 2>"$work/tp$tp.log" || { cat "$work/tp$tp.log"; fail "tp $tp"; }
      echo " tp $tp:"
      compare "$work/one.npy" "$work/tp$tp.npy"
    done
  done
}
run_paths "$work/deepseek_v32" 512
run_paths "$work/kimi_linear" 512
run_paths "$work/kimi_k3" 512
run_paths "$DZ_SOURCE_DIR/models/demo" 4096

# Bytes on the wire, full prefill of T = 40 tokens (one step): h = 256, 4 layers. Each rank
# receives 2 (N-1)/N T h 4 per all-reduce (embedding, then after o_proj and after the FFN of each
# layer: 9) and the other ranks' logit columns, (N-1) T (512/N) 4.
ids=$("$python" -c "print(','.join(str(i * 7 % 512) for i in range(40)))")
"${mpirun[@]}" -np 2 "$dayzero" logits --model "$work/deepseek_v32" --token-ids "$ids" --threads 1 --tp 2 \
  --output "$work/bytes.npy" 2>"$work/bytes.log"
expected=$(( 9 * 2 * 1 * 40 * 256 * 4 / 2 + 1 * 40 * 256 * 4 ))
for rank in 0 1; do
  grep -q "rank $rank of 2: 10 collectives, $expected bytes received" "$work/bytes.log" ||
    fail "rank $rank traffic: $(grep 'rank ' "$work/bytes.log"), expected 10 collectives, $expected bytes"
done
echo "traffic: $expected bytes per rank, as the formulas say"
# The same for every architecture, against `dayzero analyze`'s prefill lines (T = 40 tokens, all
# 40 logit rows asked for, where analyze counts one): rank 0's bytes.
for model in "$work/deepseek_v32" "$work/kimi_linear" "$work/kimi_k3" "$DZ_SOURCE_DIR/models/demo"; do
  "${mpirun[@]}" -np 2 "$dayzero" logits --model "$model" --token-ids "$ids" --threads 1 --tp 2 \
    --output "$work/bytes.npy" 2>"$work/bytes.log"
  "$dayzero" analyze "$model" --tp 2 --prefill-tokens 40 --json >"$work/analyze.json"
  "$python" - "$work/analyze.json" "$work/bytes.log" "$(basename "$model")" <<'PY'
import json, re, sys
a = json.load(open(sys.argv[1]))
log = open(sys.argv[2]).read()
measured = int(re.search(r"rank 0 of 2: \d+ collectives, (\d+) bytes received", log).group(1))
expected = 0
for line in a["prefill_comm"]:
    assert line["implemented"], line
    if line["what"].startswith("logit columns"):
        expected += line["bytes_per_layer"] * 40  # 40 rows instead of 1
    else:
        expected += line["bytes_per_step"]
assert measured == expected, (sys.argv[3], measured, expected)
print(f"  {sys.argv[3]}: rank 0 received {measured} bytes = analyze's formulas")
PY
done

# Impossible or unsupported plans: a clear error from every rank, and mpirun returns.
expect_failure() {  # expect_failure PATTERN RANKS ARGS...
  local pattern=$1 ranks=$2
  shift 2
  if timeout 120 "${mpirun[@]}" -np "$ranks" "$dayzero" logits --token-ids 1,2,3 --threads 1 \
    --output "$work/x.npy" "$@" >"$work/out" 2>"$work/err"; then
    fail "accepted: $*"
  fi
  [ "$(grep -c -E -- "$pattern" "$work/err")" -eq "$ranks" ] ||
    fail "expected /$pattern/ from each of $ranks ranks, got: $(cat "$work/err")"
  echo "refused as expected by $ranks ranks: $(grep -m1 -E -- "$pattern" "$work/err")"
}
expect_failure "num_attention_heads \(MLA heads\) 4 is not divisible by --tp 3" 3 --model "$work/deepseek_v32" --tp 3
expect_failure "plan tp=2 ep=1 cp=1 \(2 ranks\) needs 2 ranks, mpirun started 4" 4 --model "$work/deepseek_v32" --tp 2
expect_failure "the forward splits by --tp only so far" 2 --model "$work/kimi_linear" --ep 2
# A rank that cannot load its shard (here rank 1's checkpoint folder is missing): it says why, the
# others name it, and the job ends at once instead of waiting for a collective's deadline.
cp -r "$work/deepseek_v32" "$work/shard0"
if timeout 120 "${mpirun[@]}" -np 2 sh -c "exec \"$dayzero\" logits --model \"$work/shard\$OMPI_COMM_WORLD_RANK\" \
    --token-ids 1,2,3 --threads 1 --tp 2 --output \"$work/x.npy\"" >"$work/out" 2>"$work/err"; then
  fail "a job with a missing shard succeeded"
fi
grep -q "rank 1: config.json: cannot open .*shard1/config.json" "$work/err" || fail "rank 1: $(cat "$work/err")"
grep -q "rank 0: rank(s) 1 could not load their shard" "$work/err" || fail "rank 0: $(cat "$work/err")"
echo "a missing shard is reported by both ranks"
# Without mpirun: the command says how to launch it.
if "$dayzero" logits --model "$work/deepseek_v32" --token-ids 1,2 --output "$work/x.npy" --tp 2 2>"$work/err"; then
  fail "--tp 2 ran without mpirun"
fi
grep -q "run this command under \`mpirun -np 2 dayzero" "$work/err" || fail "no launch hint: $(cat "$work/err")"
echo "parallel logits: all checks passed"
