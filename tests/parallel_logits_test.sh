#!/usr/bin/env bash
# `mpirun -np N dayzero logits --tp T --ep E` against the single process (docs/parallel.md): every
# architecture (tiny DeepSeek-V3.2: MLA heads, the replicated DSA indexer, dense MLP and MoE;
# Kimi-Linear: KDA heads and their states; Kimi-K3: latent MoE, AttnRes, gated MLA; the demo model,
# dayzero_hybrid) at TP 2, TP 4, EP 2 and TP 2 x EP 2 (4 ranks oversubscribe 2 cores), full prefill, chunked prefill
# and decode, within the model-level tolerance; the bytes each rank received equal the all-reduce
# and gather formulas; generate and perplexity agree with one process; impossible plans fail on
# every rank with a message, never a hang.
# $1 = the dayzero binary; ctest sets PYTHONPATH (python/).
dayzero=$1
# shellcheck source=tests/mpi_test_env.sh
source "$(dirname "$0")/mpi_test_env.sh"  # $python, $work, "${mpirun[@]}", fail, tiny models
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
  # Full prefill, and chunked prefill (chunks of 5) then decode from position 17: every path.
  for path in "" "--decode-from 17 --prefill-chunk 5"; do
    echo "$(basename "$model"), path: ${path:-full prefill}"
    # shellcheck disable=SC2086
    "$dayzero" --log-level warn logits --model "$model" --token-ids "$ids" --threads 1 $path \
      --output "$work/one.npy"
    for plan in "2 --tp 2" "4 --tp 4" "2 --ep 2" "4 --tp 2 --ep 2"; do
      local ranks=${plan%% *} flags=${plan#* }
      # shellcheck disable=SC2086
      "${mpirun[@]}" -np $ranks "$dayzero" logits --model "$model" --token-ids "$ids" --threads 1 \
        $flags $path --output "$work/plan.npy" 2>"$work/plan.log" || { cat "$work/plan.log"; fail "$flags"; }
      echo " $flags:"
      compare "$work/one.npy" "$work/plan.npy"
    done
  done
}
run_paths "$work/deepseek_v32" 512
run_paths "$work/kimi_linear" 512
run_paths "$work/kimi_k3" 512
run_paths "$DZ_SOURCE_DIR/models/demo" 4096

# DeepSeek's MTP layer under every plan (its embedding and head copies split by vocabulary, its
# MoE layer's tokens exchanged at --ep > 1), on chunked prefill then decode.
ids=$("$python" -c "import random; r = random.Random(5); print(','.join(str(r.randrange(512)) for _ in range(40)))")
mtp_path=(--decode-from 17 --prefill-chunk 5)
"$dayzero" --log-level warn logits --model "$work/deepseek_v32" --token-ids "$ids" --threads 1 \
  "${mtp_path[@]}" --output "$work/one.npy" --mtp-output "$work/one_mtp.npy"
for plan in "2 --tp 2" "4 --tp 4" "2 --ep 2" "4 --tp 2 --ep 2"; do
  # shellcheck disable=SC2086
  "${mpirun[@]}" -np "${plan%% *}" "$dayzero" logits --model "$work/deepseek_v32" --token-ids "$ids" \
    --threads 1 ${plan#* } "${mtp_path[@]}" --output "$work/plan.npy" --mtp-output "$work/plan_mtp.npy" \
    2>"$work/plan.log" || { cat "$work/plan.log"; fail "mtp ${plan#* }"; }
  echo "deepseek_v32 MTP head, ${plan#* }:"
  compare "$work/one_mtp.npy" "$work/plan_mtp.npy"
done

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
# At tp 2 x ep 2 the one sequence runs in the first TP group (ranks 0, 1): their all-reduces and
# gather are those of tp 2; the MoE layers add three all-to-alls each (counts, dispatch, combine;
# their bytes depend on the routing and are held to the record format by
# model.moe_expert_parallel). The second group (ranks 2, 3) has no tokens: only all-to-alls.
moe_layers=$("$python" -c "import json; c = json.load(open('$work/deepseek_v32/config.json')); print(c['num_hidden_layers'] - c['first_k_dense_replace'])")
"${mpirun[@]}" -np 4 "$dayzero" logits --model "$work/deepseek_v32" --token-ids "$ids" --threads 1 --tp 2 \
  --ep 2 --output "$work/bytes.npy" 2>"$work/bytes.log"
"$python" - "$work/bytes.log" "$expected" "$moe_layers" <<'PY'
import re, sys
log, expected, moe_layers = open(sys.argv[1]).read(), int(sys.argv[2]), int(sys.argv[3])
for rank in range(4):
    m = re.search(rf"rank {rank} of 4: (\d+) collectives, \d+ bytes received, \d+ sent \(received: ([^)]*)\)", log)
    assert m, f"rank {rank}: no traffic line in {log}"
    by_op = {k: int(v) for k, v in (item.split() for item in m.group(2).split(", "))}
    tp_bytes = by_op.get("all_reduce", 0) + by_op.get("all_gather", 0)
    assert tp_bytes == (expected if rank < 2 else 0), (rank, by_op, expected)
    assert by_op["all_to_all"] > 0, (rank, by_op)
    calls = int(m.group(1)) - (10 if rank < 2 else 0)
    assert calls == 3 * moe_layers, (rank, m.group(0), moe_layers)
print(f"tp 2 x ep 2: the first group's TP traffic is tp 2's ({expected} B), every rank 3 all-to-alls per MoE layer")
PY
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

# generate and perplexity run the same way (rank 0 schedules and samples, every rank runs the step
# it sends): greedy text equal to one process, perplexity within 1e-3 of it.
demo=$DZ_SOURCE_DIR/models/demo
"$dayzero" --log-level warn generate --model "$demo" --prompt "Once upon a time" --max-tokens 16 \
  --temperature 0 --threads 1 >"$work/gen1.txt"
"${mpirun[@]}" -np 2 "$dayzero" --log-level warn generate --model "$demo" --tp 2 \
  --prompt "Once upon a time" --max-tokens 16 --temperature 0 --threads 1 >"$work/gen2.txt"
cmp -s "$work/gen1.txt" "$work/gen2.txt" ||
  fail "generate at tp 2: $(cat "$work/gen2.txt") vs $(cat "$work/gen1.txt")"
"${mpirun[@]}" -np 4 "$dayzero" --log-level warn generate --model "$demo" --tp 2 --ep 2 \
  --prompt "Once upon a time" --max-tokens 16 --temperature 0 --threads 1 >"$work/gen4.txt"
cmp -s "$work/gen1.txt" "$work/gen4.txt" ||
  fail "generate at tp 2 x ep 2: $(cat "$work/gen4.txt") vs $(cat "$work/gen1.txt")"
echo "generate at tp 2 and tp 2 x ep 2: the same greedy text as one process"

# Speculative decoding under a plan (docs/serving.md §4): the chained MTP head of deepseek_v32 (its
# two calls a step on every rank) at tp 2 and tp 2 x ep 2, and n-gram drafts on the demo model,
# whose recurrent-state rollback copies are cache edits every rank repeats: greedy tokens equal the
# same plan's without speculation.
"$python" - "$work/spec.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for seed in range(4):
        ids = [(seed * 37 + 11 * i) % 200 + 3 for i in range(12 + 5 * seed)]
        f.write(json.dumps({"prompt_token_ids": ids + ids, "max_tokens": 12, "temperature": 0}) + "\n")
PY
spec_tokens() {  # spec_tokens OUT RANKS FLAGS...: the token ids of every line
  local out=$1 ranks=$2
  shift 2
  local cmd=("$dayzero" generate --prompts-file "$work/spec.jsonl" --threads 1
             --num-blocks 64 --block-size 16 "$@")
  [ "$ranks" -gt 1 ] && cmd=("${mpirun[@]}" -np "$ranks" "${cmd[@]}")
  "${cmd[@]}" 2>"$out.log" | "$python" -c "import json, sys; print([json.loads(l)['tokens'] for l in sys.stdin])" >"$out"
}
mtp='{"method": "mtp", "num_speculative_tokens": 2}'
spec_tokens "$work/v32-1" 1 --model "$work/deepseek_v32"
for plan in "2 --tp 2" "4 --tp 2 --ep 2"; do
  # shellcheck disable=SC2086
  spec_tokens "$work/v32-n" "${plan%% *}" --model "$work/deepseek_v32" ${plan#* } --speculative-config "$mtp"
  cmp -s "$work/v32-1" "$work/v32-n" || fail "MTP speculation at ${plan#* }: $(cat "$work/v32-n") vs $(cat "$work/v32-1")"
  grep -q "speculative: [1-9][0-9]* drafts" "$work/v32-n.log" || fail "no MTP drafts: $(cat "$work/v32-n.log")"
done
ngram='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'
# Against tp 2 without drafts: the demo's synthetic prompts have near-ties (0.001 nats) that the
# split sums of tp 2 may resolve otherwise than one process, and speculation is what is tested.
spec_tokens "$work/demo-1" 2 --model "$demo" --tp 2
spec_tokens "$work/demo-2" 2 --model "$demo" --tp 2 --speculative-config "$ngram"
cmp -s "$work/demo-1" "$work/demo-2" || fail "n-gram speculation at tp 2: $(cat "$work/demo-2") vs $(cat "$work/demo-1")"
grep -q "speculative: [1-9][0-9]* drafts" "$work/demo-2.log" || fail "no n-gram drafts: $(cat "$work/demo-2.log")"
echo "speculative decoding (MTP at tp 2 and tp 2 x ep 2, n-gram on the demo at tp 2): the greedy tokens without it"
head -c 2000 "$DZ_SOURCE_DIR/README.md" >"$work/text.txt"
ppl=(perplexity --model "$demo" --file "$work/text.txt" --context 96 --max-windows 2 --threads 1 --json)
"$dayzero" --log-level warn "${ppl[@]}" >"$work/ppl1.json"
"${mpirun[@]}" -np 2 "$dayzero" --log-level warn "${ppl[@]}" --tp 2 >"$work/ppl2.json"
"$python" - "$work/ppl1.json" "$work/ppl2.json" <<'PY'
import json, sys
one, two = (json.load(open(p))["mean_nll"] for p in sys.argv[1:])
print(f"perplexity at tp 2: mean NLL {two:.6f} vs {one:.6f} in one process")
assert abs(two - one) < 1e-3 * one, "perplexity differs"
PY
"${mpirun[@]}" -np 4 "$dayzero" --log-level warn "${ppl[@]}" --tp 2 --ep 2 >"$work/ppl4.json"
"$python" - "$work/ppl1.json" "$work/ppl4.json" <<'PY'
import json, sys
one, four = (json.load(open(p))["mean_nll"] for p in sys.argv[1:])
print(f"perplexity at tp 2 x ep 2: mean NLL {four:.6f} vs {one:.6f} in one process")
assert abs(four - one) < 1e-3 * one, "perplexity differs"
PY

# Prefix-cache hits and recurrent-state checkpoints (saved and restored by copies): the
# cache edits rank 0's cache manager makes between steps, repeated on every rank's cache. Prompts
# a and b run together, then one that shares b's first 40 tokens with one that shares a's first 45
# (each hits the blocks of its own forerunner). At --ep 2 a and b run in different data-parallel
# groups, and each later prompt must run in its forerunner's group, where the blocks it hits
# were written (the third prompt would go to the first group if groups were simply taken in turn).
"$python" -m dayzero_ref.make_tiny deepseek_v32 "$work/v32-plain" --seed 3 --plain >/dev/null
for model in "$work/v32-plain" "$demo"; do
  vocab=$("$python" -c "import json; print(json.load(open('$model/config.json'))['vocab_size'])")
  "$python" - "$work/prompts.jsonl" "$vocab" <<'PY'
import json, random, sys
r, vocab = random.Random(7), int(sys.argv[2])
a = [r.randrange(vocab) for _ in range(50)]
b = [r.randrange(vocab) for _ in range(50)]
prompts = [a, b, b[:40] + [r.randrange(vocab) for _ in range(9)], a[:45] + [r.randrange(vocab) for _ in range(7)]]
with open(sys.argv[1], "w") as f:
    for p in prompts:
        f.write(json.dumps({"prompt_token_ids": p, "max_tokens": 6, "temperature": 0}) + "\n")
PY
  flags=(generate --model "$model" --prompts-file "$work/prompts.jsonl" --max-num-seqs 2
         --block-size 16 --state-checkpoint-interval 16 --threads 1)
  "$dayzero" --log-level warn "${flags[@]}" --dump-logits "$work/pfx1" >/dev/null
  for plan in "2 --tp 2" "4 --tp 2 --ep 2"; do
    ranks=${plan%% *}
    # shellcheck disable=SC2086
    "${mpirun[@]}" -np "$ranks" "$dayzero" "${flags[@]}" ${plan#* } --dump-logits "$work/pfx2" >/dev/null 2>"$work/pfx.log"
    grep -q "prefix cache hit rate [1-9]" "$work/pfx.log" || fail "no prefix-cache hit: $(cat "$work/pfx.log")"
    echo "$(basename "$model"), prefix-cache hits at ${plan#* }:"
    for i in 0 1 2 3; do compare "$work/pfx1/$i.npy" "$work/pfx2/$i.npy"; done
    rm -rf "$work/pfx2"
  done
  rm -rf "$work/pfx1"
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
expect_failure "the 8 routed experts do not divide over tp x ep = 3 ranks" 3 --model "$work/kimi_linear" --ep 3
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
