LLAMA_DIR/build/bin/llama-bench -m MODEL.gguf -mmp 0 -r 1 -o json -p 128,256 -n 32 -t 2
