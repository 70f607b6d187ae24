#include <cstdio>
#include <memory>
#include <string>

#include "dayzero/cli/commands.h"
#include "dayzero/model/analyze.h"

namespace dz::cli {

RunCommand add_analyze_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "analyze",
      "What a model config needs before anything is loaded: layers, sizes, memory and "
      "communication per rank under a parallel plan, and what the engine supports");
  auto path = std::make_shared<std::string>();
  auto options = std::make_shared<model::AnalyzeOptions>();
  auto as_json = std::make_shared<bool>(false);
  command->add_option("CONFIG_OR_DIR", *path, "config.json, or a folder holding one")->required();
  command->add_option("--tp", options->plan.tp, "tensor-parallel ranks")->capture_default_str();
  command->add_option("--ep", options->plan.ep, "expert-parallel ranks")->capture_default_str();
  command->add_option("--cp", options->plan.cp, "context-parallel ranks")->capture_default_str();
  command->add_option("--context", options->context, "tokens per sequence in the cache")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--batch", options->batch, "sequences decoding together")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_option("--prefill-tokens", options->prefill_tokens, "tokens of one prefill step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  command->add_flag("--json", *as_json, "Print the same data as JSON");
  return [path, options, as_json] {
    Result<model::Analysis> analysis = model::analyze_config_path(*path, *options);
    if (!analysis.ok()) {
      std::fprintf(stderr, "dayzero analyze: %s\n", analysis.status().to_string().c_str());
      return 1;
    }
    const std::string text = *as_json ? model::format_analysis_json(*analysis) + "\n"
                                      : model::format_analysis_text(*analysis);
    std::fputs(text.c_str(), stdout);
    // An impossible plan is the answer to the question asked, and also an error for scripts.
    if (!analysis->plan_status.ok()) {
      std::fprintf(stderr, "dayzero analyze: %s\n", analysis->plan_status.message().c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace dz::cli
