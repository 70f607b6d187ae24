#!/usr/bin/env bash
# Writes the logits of every tiny checkpoint (decisive and plain draws) and of the demo model, for
# prefill, chunked prefill and decode, with both KV cache dtypes, into OUT_DIR (one .npy each).
# A refactor that must not change behaviour dumps before and after and compares the two folders
# byte for byte: `scripts/dump-logits.sh build /tmp/before` … `cmp -r`-style via `diff -r`.
set -euo pipefail
BUILD=${1:?usage: dump-logits.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: dump-logits.sh BUILD_DIR OUT_DIR}
DAYZERO="$BUILD/src/dayzero/cli/dayzero"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
CKPT=$(mktemp -d)
trap 'rm -rf "$CKPT"' EXIT

# 40 token ids below every tiny vocabulary, fixed so both runs see the same input.
IDS=$(/usr/bin/python3 -c 'import random; r = random.Random(16); print(",".join(str(r.randrange(1, 200)) for _ in range(40)))')

# One `dayzero logits` run; a refusal (e.g. an FP8 cache for a latent that is not a multiple of
# 128) is behaviour too: its message is kept in NAME.err.
logits() {  # logits OUT_NAME ARGS...
  local name=$1
  shift
  if ! "$DAYZERO" logits --threads 2 "$@" --output "$OUT/$name.npy" 2>"$OUT/$name.log"; then
    grep -v '^\[' "$OUT/$name.log" >"$OUT/$name.err" || true
  fi
  rm -f "$OUT/$name.log"
}

dump() {  # dump NAME MODEL_DIR
  local name=$1 model=$2
  for dtype in fp8 bf16; do
    logits "$name.$dtype.prefill" --model "$model" --token-ids "$IDS" --kv-cache-dtype "$dtype"
    logits "$name.$dtype.chunked" --model "$model" --token-ids "$IDS" --kv-cache-dtype "$dtype" \
      --prefill-chunk 7
    logits "$name.$dtype.decode" --model "$model" --token-ids "$IDS" --kv-cache-dtype "$dtype" \
      --decode-from 9
  done
}

for arch in deepseek_v32 kimi_linear kimi_k3 dayzero_hybrid; do
  PYTHONPATH="$ROOT/python" /usr/bin/python3 -m dayzero_ref.make_tiny "$arch" "$CKPT/$arch" --seed 0
  PYTHONPATH="$ROOT/python" /usr/bin/python3 -m dayzero_ref.make_tiny "$arch" "$CKPT/$arch-plain" --seed 0 --plain
  dump "$arch" "$CKPT/$arch"
  dump "$arch-plain" "$CKPT/$arch-plain"
done
dump demo "$ROOT/models/demo"
# The MTP head of the tiny DeepSeek-V3.2 checkpoint has logits of its own.
logits deepseek_v32.with-mtp --model "$CKPT/deepseek_v32" --token-ids "$IDS" \
  --mtp-output "$OUT/deepseek_v32.mtp.npy"
ls "$OUT" | wc -l
