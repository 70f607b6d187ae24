#pragma once
// Each subcommand of `dayzero` adds itself to the CLI11 app and returns the function that runs it.

#include <functional>

#include <CLI/CLI.hpp>

namespace dz::cli {

using RunCommand = std::function<int()>;

// `dayzero inspect DIR`: architecture, layer schedule, parameters and bytes by component and dtype.
RunCommand add_inspect_command(CLI::App& app);
// `dayzero bench ...`: `limits` measures the machine; later issues add operator benchmarks.
RunCommand add_bench_command(CLI::App& app);
// `dayzero tokenize --model DIR (--text T | --ids 1,2,3 | --batch FILE.json)`.
RunCommand add_tokenize_command(CLI::App& app);

}  // namespace dz::cli
