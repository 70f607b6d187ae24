#pragma once
// `dayzero generate --prompts-file FILE.jsonl`: every prompt of the file submitted at once to the
// serving Engine (continuous batching, chunked prefill, prefix cache, preemption), one JSON line
// per prompt on stdout in input order, a summary on stderr.

#include <cstdint>
#include <string>

#include <CLI/CLI.hpp>

#include "dayzero/cli/model_args.h"
#include "dayzero/cli/prompts_file.h"
#include "dayzero/core/status.h"

namespace dz::cli {

struct EngineArgs {
  int64_t max_num_seqs = 32;
  int64_t max_num_batched_tokens = 512;
  int64_t num_blocks = 0;                // 0: from kv_cache_memory
  std::string kv_cache_memory = "1GiB";  // bytes, or with a KiB / MiB / GiB suffix
  int64_t max_model_len = 0;             // 0: min(4096, max_position_embeddings)
  bool no_prefix_caching = false;
  int64_t max_state_checkpoints = -1;
  int64_t state_checkpoint_interval = 1024;  // rounded up to a multiple of the block size
  int64_t long_prefill_threshold = 0;
};

// --max-num-seqs, --max-num-batched-tokens, --num-blocks, --kv-cache-memory, --max-model-len,
// --no-prefix-caching, --max-state-checkpoints, --state-checkpoint-interval,
// --long-prefill-threshold.
void add_engine_options(CLI::App& command, EngineArgs& args);

// "512MiB", "2GiB", "64KiB" or a plain number of bytes.
Result<int64_t> parse_memory_size(const std::string& text, const char* flag);

struct BatchGenerateArgs {
  ModelArgs model;
  EngineArgs engine;
  std::string prompts_file;
  std::string dump_logits_dir;  // non-empty: DIR/<index>.npy, float32 [num_generated, vocab]
  PromptDefaults defaults;
};

Status run_prompts_file(const BatchGenerateArgs& args);

}  // namespace dz::cli
