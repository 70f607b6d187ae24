#!/usr/bin/env bash
# `dayzero inspect` on the tiny checkpoints of every architecture (make_tiny.py): the --json counts
# must equal the ones tests/inspect_check.py computes from config.json and the safetensors headers,
# and corrupted copies (truncated shard, dropped tensor, changed config shape, bad 1-based list)
# must fail with a message naming the file, tensor or field.
# $1 = the dayzero binary; ctest sets PYTHONPATH (python/) and DZ_SOURCE_DIR.
set -euo pipefail
dayzero=$1
python=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# expect_failure DIR PATTERN: inspect must exit non-zero and print PATTERN (grep -E) on stderr.
expect_failure() {
  if "$dayzero" inspect "$1" >"$work/out" 2>"$work/err"; then
    fail "inspect accepted $1: $(cat "$work/out")"
  fi
  grep -Eq -- "$2" "$work/err" || fail "inspect on $1 printed '$(cat "$work/err")', expected /$2/"
  echo "refused as expected: $(cat "$work/err")"
}

for arch in deepseek_v32 kimi_linear kimi_k3; do
  "$python" -m dayzero_ref.make_tiny "$arch" "$work/$arch" --seed 7
  "$dayzero" inspect "$work/$arch"
  "$dayzero" inspect --json "$work/$arch" >"$work/$arch.json"
  "$python" "$here/inspect_check.py" check "$work/$arch" "$work/$arch.json"
done
# Sharding does not change the counts.
"$python" -m dayzero_ref.make_tiny kimi_linear "$work/kimi_linear_sharded" --seed 7 --shard-bytes 300000
"$dayzero" inspect --json "$work/kimi_linear_sharded" >"$work/kimi_linear_sharded.json"
"$python" "$here/inspect_check.py" check "$work/kimi_linear_sharded" "$work/kimi_linear_sharded.json"
"$python" - "$work/kimi_linear.json" "$work/kimi_linear_sharded.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:])
assert a == b, "sharded and single-file reports differ"
PY

# A truncated shard.
cp -r "$work/kimi_k3" "$work/truncated"
shard=$(ls "$work/truncated" | grep -E '^model-0000[0-9]-of-' | sed -n 2p)
truncate -s -100 "$work/truncated/$shard"
expect_failure "$work/truncated" "$shard"

# A dropped tensor.
cp -r "$work/deepseek_v32" "$work/dropped"
"$python" "$here/inspect_check.py" drop "$work/dropped" model.layers.2.mlp.experts.5.up_proj.weight_scale_inv
expect_failure "$work/dropped" 'tensor "model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight_scale_inv" is missing'

# An extra tensor the recipe does not expect (layer 0 is dense: no experts).
cp -r "$work/deepseek_v32" "$work/extra"
"$python" "$here/inspect_check.py" copy "$work/extra" model.layers.1.mlp.experts.0.up_proj.weight \
  model.layers.0.mlp.experts.0.up_proj.weight
expect_failure "$work/extra" 'tensor "model\.layers\.0\.mlp\.experts\.0\.up_proj\.weight" in model\.safetensors is not expected by the deepseek_v32 recipe'

# A dtype changed: an FP8 weight stored as BF16.
cp -r "$work/deepseek_v32" "$work/retyped"
"$python" "$here/inspect_check.py" retype "$work/retyped" model.layers.1.self_attn.o_proj.weight BF16
expect_failure "$work/retyped" 'tensor "model\.layers\.1\.self_attn\.o_proj\.weight" in model\.safetensors has dtype BF16, expected F8_E4M3'

# A shape changed in the config.
cp -r "$work/kimi_linear" "$work/reshaped"
"$python" - "$work/reshaped/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["moe_intermediate_size"] = 96
json.dump(c, open(sys.argv[1], "w"))
PY
expect_failure "$work/reshaped" 'tensor "model\.layers\.1\.block_sparse_moe\.experts\.0\.w1\.weight" in model\.safetensors has shape \[64, 128\], config\.json implies \[96, 128\]'

# A 1-based layer list written 0-based.
cp -r "$work/kimi_k3" "$work/zero_based"
"$python" - "$work/zero_based/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["text_config"]["linear_attn_config"]["kda_layers"] = [0, 1, 2]
json.dump(c, open(sys.argv[1], "w"))
PY
expect_failure "$work/zero_based" 'field "text_config\.linear_attn_config\.kda_layers\[0\]": expected a positive integer, found 0'

# An MXFP4 expert the ignore list names.
cp -r "$work/kimi_k3" "$work/ignored"
"$python" - "$work/ignored/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["text_config"]["quantization_config"]["ignore"].append("re:.*experts\\.3\\.")
json.dump(c, open(sys.argv[1], "w"))
PY
expect_failure "$work/ignored" 'quantization_config ignore list names module "language_model\.model\.layers\.1\.block_sparse_moe\.experts\.3\.w1"'

echo "inspect_test: all checks passed"
