#pragma once
// The engine flags shared by `dayzero generate` and `dayzero serve` (docs/serving.md §2),
// spelled the same in both, and the EngineConfig they make.

#include <cstdint>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "dayzero/cli/model_args.h"
#include "dayzero/core/status.h"
#include "dayzero/runtime/engine_types.h"

namespace dz::cli {

struct EngineArgs {
  int64_t max_num_seqs = 32;
  int64_t max_num_batched_tokens = 512;
  int64_t max_queued_requests = 256;
  int64_t num_blocks = 0;                // 0: from kv_cache_memory
  std::string kv_cache_memory = "1GiB";  // bytes, or with a KiB / MiB / GiB suffix
  int64_t max_model_len = 0;             // 0: min(4096, max_position_embeddings)
  bool no_prefix_caching = false;
  int64_t max_state_checkpoints = -1;
  int64_t state_checkpoint_interval = 1024;  // rounded up to a multiple of the block size
  int64_t long_prefill_threshold = 0;
  int64_t max_num_encoder_tokens = 0;
  std::string speculative_config;                 // vLLM's --speculative-config JSON; empty: off
  std::optional<uint64_t> fault_nan_logits_seed;  // a test hook (EngineConfig::nan_logits_seed)
  std::optional<uint64_t> fault_crash_seed;       // a test hook (EngineConfig::crash_seed)
};

// --max-num-seqs, --max-num-batched-tokens, --num-blocks, --kv-cache-memory, --max-model-len,
// --no-prefix-caching, --max-state-checkpoints, --state-checkpoint-interval,
// --long-prefill-threshold, --speculative-config (the caller adds --max-queued-requests where it
// means something).
void add_engine_options(CLI::App& command, EngineArgs& args);

// "512MiB", "2GiB", "64KiB" or a plain number of bytes.
Result<int64_t> parse_memory_size(const std::string& text, const char* flag);

// The EngineConfig of the flags: max_model_len defaults from config.json, the checkpoint interval
// rounded up to a multiple of the block size, the prefix-hash identity from the model folder and
// cache dtype. eos ids and token_bytes are the caller's.
Result<runtime::EngineConfig> engine_config(const ModelArgs& model, const EngineArgs& engine);

}  // namespace dz::cli
