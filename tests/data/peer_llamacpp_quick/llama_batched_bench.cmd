LLAMA_DIR/build/bin/llama-batched-bench -m MODEL.gguf --no-mmap -c 1056 -b 2048 -ub 512 -npp 256 -ntg 8 -npl 1,4 -pps -t 2 --output-format jsonl
