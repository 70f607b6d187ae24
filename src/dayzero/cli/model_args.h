#pragma once
// Options shared by the subcommands that run a model (`logits`, `generate`), spelled the same in
// both (docs/architecture.md, "The command line"), and the small parsers they share.

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/model/causal_lm.h"

namespace dz::cli {

struct ModelArgs {
  std::string model_dir;
  std::string kv_cache_dtype = "auto";  // auto: the recipe's default
  int num_threads = 0;                  // 0: all hardware threads
  int64_t block_size = 64;
  // The parallel plan (docs/parallel.md): more than one rank needs `mpirun -np tp·ep`.
  int tp = 1;
  int ep = 1;
};

// --model, --kv-cache-dtype, --threads, --block-size. --model is required unless
// `model_has_default` (generate, serve: then resolve_model_dir (default_model.h) fills it in).
void add_model_options(CLI::App& command, ModelArgs& args, bool model_has_default = false);

// --tp and --ep, for the commands that run a model over several ranks.
void add_parallel_options(CLI::App& command, ModelArgs& args);
// This process's rank in the plan (0 in one process): only rank 0 writes a command's output.
int model_rank();
// "rank 0 of 2: 41 collectives, 1.2 MiB received" over the plan's ranks so far; "" in one
// process.
std::string traffic_summary();

ExecContext exec_context(const ModelArgs& args);
// Loads the checkpoint (config, tensor checks, weights) with the parsed cache dtype. A plan of
// more than one rank starts MPI (once per process) and needs as many ranks from `mpirun`.
Result<std::unique_ptr<model::CausalLm>> load_model(const ModelArgs& args);

// "1,2,3" → ids; refuses empty lists, non-integers and negative ids, naming the item.
Result<std::vector<int32_t>> parse_token_ids(const std::string& list, const char* flag);

// CLI11 check for an integer flag >= min, with a plain message ("must be an integer >= 1, got 0")
// instead of CLI::PositiveNumber's range of doubles.
CLI::Validator integer_at_least(int64_t min);

// Prints "error: <message>" to stderr and returns the exit code 1.
int fail(const Status& status);

}  // namespace dz::cli
