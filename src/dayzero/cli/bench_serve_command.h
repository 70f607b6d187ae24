#pragma once
// `dayzero bench serve`: a sibling of `bench limits`, registered by bench_command.cpp.

#include <CLI/CLI.hpp>

#include "dayzero/cli/commands.h"

namespace dz::cli {

// Adds `serve` under `bench`; the returned function runs it (call only when it was parsed).
RunCommand add_bench_serve_subcommand(CLI::App& bench);

}  // namespace dz::cli
