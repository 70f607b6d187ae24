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

// The parallel plan (docs/parallel.md): more than one rank needs `mpirun -np tp·ep·cp`.
struct ParallelArgs {
  int tp = 1;
  int ep = 1;
  int cp = 1;
  std::string cp_layout = "zigzag";  // or "contiguous" (to measure the load balance)
};

struct ModelArgs {
  std::string model_dir;
  std::string kv_cache_dtype = "auto";     // auto: the recipe's default
  std::string mxfp4_activations = "bf16";  // or "mxint8"
  int num_threads = 0;                     // 0: all hardware threads
  int64_t block_size = 64;
  ParallelArgs parallel;
};

// --model, --kv-cache-dtype, --mxfp4-activations, --threads, --block-size. --model is required
// unless `model_has_default` (generate, serve: then resolve_model_dir (default_model.h) fills it
// in).
void add_model_options(CLI::App& command, ModelArgs& args, bool model_has_default = false);

// --tp, --ep, --cp and --cp-layout, for the commands that run a model over several ranks.
void add_parallel_options(CLI::App& command, ParallelArgs& args);
// "rank 0 of 2: 41 collectives, 1234 bytes received, 1234 sent (received: all_reduce 1000,
// all_gather 234); step messages: 9 collectives": this rank's share of the model's traffic so
// far, then of the step messages (descriptions and gathered logits); "" in one process.
std::string traffic_summary();
// The communicator over the plan's ranks once a multi-rank load started it; null in one process.
dist::Comm* plan_comm();

// This process's rank in the plan: starts MPI for a plan of more than one rank (errors as
// load_model's); 0 in one process.
Result<int> plan_rank(const ModelArgs& args);

ExecContext exec_context(const ModelArgs& args);
// Loads the checkpoint (config, tensor checks, weights) with the parsed cache dtype. A plan of
// more than one rank starts MPI (once per process) and needs as many ranks from `mpirun`; rank 0
// gets its shard behind a model::StepLeader, which sends every step to the other ranks, and on
// every other rank this call follows rank 0's steps until rank 0 is done, then returns nullptr:
// the command has nothing left to do there (docs/parallel.md §7).
Result<std::unique_ptr<model::CausalLm>> load_model(const ModelArgs& args);
// This rank's shard on every rank, with no leader: for a command whose every rank runs the same
// calls in step (verify); the model alone in one process.
Result<std::unique_ptr<model::CausalLm>> load_shard(const ModelArgs& args);

// "1,2,3" → ids; refuses empty lists, non-integers and negative ids, naming the item.
Result<std::vector<int32_t>> parse_token_ids(const std::string& list, const char* flag);

// CLI11 check for an integer flag >= min, with a plain message ("must be an integer >= 1, got 0")
// instead of CLI::PositiveNumber's range of doubles.
CLI::Validator integer_at_least(int64_t min);

// Prints "error: <message>" to stderr and returns the exit code 1.
int fail(const Status& status);

}  // namespace dz::cli
