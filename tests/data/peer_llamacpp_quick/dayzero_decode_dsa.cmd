build/src/dayzero/cli/dayzero bench decode --config OUTDIR/dayzero-shape-dsa-vocab512.json --threads 2 --batch 1 --context 1K,4K --seconds 0.2 --min-steps 2 --max-steps 4 --limits-seconds 0.1 --json
