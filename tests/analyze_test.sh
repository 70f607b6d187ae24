#!/usr/bin/env bash
# `dayzero analyze` as a user runs it: the four released configs of tests/data/configs/ (file or
# folder) in text and JSON, the JSON consistent with itself; an impossible plan, a missing file, an
# unknown model_type and a malformed config fail with a message naming the cause.
# $1 = the dayzero binary; ctest sets DZ_SOURCE_DIR.
set -euo pipefail
dayzero=$1
python=/usr/bin/python3
configs="$DZ_SOURCE_DIR/tests/data/configs"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_failure PATTERN ARGS...: analyze must exit non-zero and print PATTERN on stderr.
expect_failure() {
  local pattern=$1
  shift
  if "$dayzero" analyze "$@" >"$work/out" 2>"$work/err"; then
    fail "analyze $* succeeded: $(cat "$work/out")"
  fi
  grep -Eq -- "$pattern" "$work/err" || fail "analyze $* printed '$(cat "$work/err")', expected /$pattern/"
  echo "refused as expected: $(head -c 300 "$work/err")"
}

for arch in deepseek_v32 kimi_linear kimi_k3 glm5_next; do
  "$dayzero" analyze "$configs/$arch.json" --tp 2 --ep 2 --context 8192 --batch 4 >"$work/$arch.txt"
  grep -q "^requirements" "$work/$arch.txt" || fail "$arch: no requirements list"
  "$dayzero" analyze "$configs/$arch.json" --tp 2 --ep 2 --context 8192 --batch 4 --json >"$work/$arch.json"
  "$python" - "$arch" "$work/$arch.json" <<'PY'
import json, sys
arch, path = sys.argv[1], sys.argv[2]
a = json.load(open(path))
assert a["model_type"] == arch, a["model_type"]
assert a["runnable"] == (arch != "glm5_next"), a["runnable"]
assert a["plan"]["ranks"] == 4 and a["plan"]["error"] == ""
m = a["memory_per_rank"]
assert m["total"] == m["weights"] + m["cache"]
# Routed experts split 4 ways, everything else at most 2: a rank holds under half the model.
assert m["weights"] < a["params"]["bytes"] / 2, (m["weights"], a["params"]["bytes"])
c = a["cache"]
per_token = (c["mla_bytes_per_token_fp8"] or c["mla_bytes_per_token_bf16"]) + c["index_bytes_per_token"]
# Batch 4 over ep = 2 groups: 2 sequences per rank.
assert m["cache"] == 8192 * 2 * per_token + 2 * c["state_bytes_per_sequence"], m["cache"]
for line in a["decode_comm"] + a["prefill_comm"]:
    assert line["bytes_per_step"] == line["bytes_per_layer"] * line["layers"], line
dims = {line["dimension"] for line in a["decode_comm"]}
assert dims == {"tp", "ep"}, dims
print(arch, "ok:", a["params"]["total"], "params,", m["total"], "bytes per rank")
PY
done
# A folder holding config.json reads the same.
mkdir "$work/k3" && cp "$configs/kimi_k3.json" "$work/k3/config.json"
"$dayzero" analyze "$work/k3" --json >"$work/k3_dir.json"
"$dayzero" analyze "$configs/kimi_k3.json" --json >"$work/k3_file.json"
cmp -s "$work/k3_dir.json" "$work/k3_file.json" || fail "folder and file analyses differ"

expect_failure "num_attention_heads \(MLA heads\) 128 is not divisible by --tp 3" "$configs/deepseek_v32.json" --tp 3
expect_failure "the 288 routed experts do not divide over tp x ep = 10 ranks" "$configs/glm5_next.json" --tp 2 --ep 5
expect_failure "--tp 0 must be at least 1" "$configs/kimi_linear.json" --tp 0
expect_failure "missing.*not found" "$work/missing"
echo '{"model_type": "llama"}' >"$work/llama.json"
expect_failure 'unknown model_type "llama"' "$work/llama.json"
echo '{"model_type": "deepseek_v32", "hidden_size": "wide"}' >"$work/bad.json"
expect_failure "hidden_size|vocab_size" "$work/bad.json"
echo '{"model_type": ' >"$work/truncated.json"
expect_failure "truncated.json" "$work/truncated.json"
echo "analyze: all checks passed"
