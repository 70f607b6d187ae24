#pragma once
// `dayzero bench decode` and `dayzero bench prefill`: end-to-end model benchmarks (issue 8 item 1)
// on a synthetic model built from a bench/configs/*.json (random weights, no file) or a checkpoint
// directory, reported against the limits measured in the same run. Siblings of `bench limits`,
// registered by bench_command.cpp; the arithmetic lives in bench/model_sweep.h.

#include <CLI/CLI.hpp>

#include "dayzero/cli/commands.h"

namespace dz::cli {

// Add `decode` / `prefill` under `bench`; the returned function runs it (call only when parsed).
RunCommand add_bench_decode_subcommand(CLI::App& bench);
RunCommand add_bench_prefill_subcommand(CLI::App& bench);

}  // namespace dz::cli
