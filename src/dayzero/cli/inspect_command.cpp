#include <cstdio>
#include <memory>
#include <string>

#include "dayzero/cli/commands.h"
#include "dayzero/model/inspect.h"

namespace dz::cli {

RunCommand add_inspect_command(CLI::App& app) {
  auto* command = app.add_subcommand("inspect", "Describe a checkpoint folder");
  auto dir = std::make_shared<std::string>();
  auto as_json = std::make_shared<bool>(false);
  command->add_option("DIR", *dir, "Hugging Face checkpoint folder")->required();
  command->add_flag("--json", *as_json, "Print the same data as JSON");
  return [dir, as_json] {
    auto summary = model::inspect_checkpoint(*dir);
    if (!summary.ok()) {
      std::fprintf(stderr, "dayzero inspect: %s\n", summary.status().to_string().c_str());
      return 1;
    }
    std::string text = *as_json ? model::format_summary_json(*summary) + "\n"
                                : model::format_summary_text(*summary);
    std::fputs(text.c_str(), stdout);
    return 0;
  };
}

}  // namespace dz::cli
