LLAMA_DIR/build/bin/llama-bench -m MODEL.gguf -mmp 0 -r 1 -o json -p 0 -n 32 -d 256,512 -t 2
