// dayzero: one binary, subcommands registered from their own files (commands.h).

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/core/logging.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/kernel_paths.h"

namespace dz::cli {
namespace {
std::vector<std::string>& stored_command_line() {
  static std::vector<std::string> args;
  return args;
}
}  // namespace

void set_command_line(int argc, char** argv) {
  stored_command_line().assign(argv, argv + argc);
}

const std::vector<std::string>& command_line() {
  return stored_command_line();
}
}  // namespace dz::cli

int main(int argc, char** argv) {
  CLI::App app{
      "dayzero: an inference engine for sparse, hybrid Mixture-of-Experts language models "
      "(DeepSeek-V3.2, Kimi-Linear, Kimi-K3)"};
  // The version, then which variant of each kernel this CPU runs (kernels/kernel_paths.h).
  app.set_version_flag("--version", [] {
    std::string text = "dayzero " DZ_VERSION "\n";
    if (dz::Result<dz::kernels::CpuIsa> isa = dz::kernels::cpu_isa_from_env(); isa.ok())
      text += dz::kernels::kernel_path_report(dz::kernels::detected_cpu_features(), *isa);
    else
      text += isa.status().message() + "\n";
    text.pop_back();  // CLI11 adds the last newline
    return text;
  });
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  app.require_subcommand(0, 1);

  std::vector<std::pair<CLI::App*, dz::cli::RunCommand>> commands;
  auto add = [&](dz::cli::RunCommand (*adder)(CLI::App&)) {
    size_t before = app.get_subcommands({}).size();
    auto run = adder(app);
    commands.emplace_back(app.get_subcommands({}).at(before), std::move(run));
  };
  add(dz::cli::add_inspect_command);
  add(dz::cli::add_analyze_command);
  add(dz::cli::add_bench_command);
  add(dz::cli::add_tokenize_command);
  add(dz::cli::add_logits_command);
  add(dz::cli::add_generate_command);
  add(dz::cli::add_perplexity_command);
  add(dz::cli::add_verify_command);
  add(dz::cli::add_serve_command);
  add(dz::cli::add_chat_template_command);

  dz::cli::set_command_line(argc, argv);
  CLI11_PARSE(app, argc, argv);
  dz::init_logging(log_level);
  // A bad DZ_CPU_ISA is a usage error here, before any kernel runs (cpu_features.h).
  if (dz::Result<dz::kernels::CpuIsa> isa = dz::kernels::cpu_isa_from_env(); !isa.ok())
    return dz::cli::fail(isa.status());
  for (auto& [subcommand, run] : commands)
    if (subcommand->parsed()) return run();
  std::fputs(app.help().c_str(), stdout);
  return 0;
}
