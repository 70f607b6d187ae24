#pragma once
// `dayzero bench ops`: every operator benchmark (bench/ops/) in one process, against the limits
// measured in the same run; a sibling of `bench limits`, registered by bench_command.cpp.

#include <CLI/CLI.hpp>

#include "dayzero/cli/commands.h"

namespace dz::cli {

// Adds `ops` under `bench`; the returned function runs it (call only when it was parsed).
RunCommand add_bench_ops_subcommand(CLI::App& bench);

}  // namespace dz::cli
