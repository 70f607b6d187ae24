# Sourced by the multi-rank CLI tests (parallel_logits_test.sh, context_parallel_test.sh): strict
# mode, a scratch folder removed at exit, and mpirun as every such test runs it on one machine
# (root allowed, ranks oversubscribing the cores, shared memory, one OpenMP thread per rank).
set -euo pipefail
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
