#include "dayzero/cli/commands.h"

namespace dz::cli {

RunCommand add_inspect_command(CLI::App& app) {
  auto* command = app.add_subcommand("inspect", "Describe a checkpoint folder");
  auto dir = std::make_shared<std::string>();
  command->add_option("DIR", *dir, "Hugging Face checkpoint folder")->required();
  return [dir] { return 1; };  // filled in by the inspect work (issue 2, item 6)
}

}  // namespace dz::cli
