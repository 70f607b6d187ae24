build/src/dayzero/cli/dayzero bench prefill --config OUTDIR/dayzero-shape-vocab512.json --threads 2 --tokens 128,256 --chunk 2048 --limits-seconds 0.1 --json
