#include "dayzero/cli/default_model.h"

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "dayzero/core/logging.h"

#ifndef DZ_DEFAULT_MODEL_DIR
#define DZ_DEFAULT_MODEL_DIR ""
#endif

namespace dz::cli {
namespace {

constexpr const char* kEnvVar = "DAYZERO_MODEL";

bool has_config(const std::string& dir) {
  std::error_code ec;
  return std::filesystem::is_regular_file(std::filesystem::path(dir) / "config.json", ec);
}

}  // namespace

std::vector<std::string> default_model_candidates() {
  std::vector<std::string> out;
  std::error_code ec;
  // An installed binary first: bin/dayzero next to share/dayzero/models/demo.
  std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.has_parent_path())
    out.push_back(
        (exe.parent_path().parent_path() / "share" / "dayzero" / "models" / "demo").string());
  if (std::string(DZ_DEFAULT_MODEL_DIR).size() > 0) out.emplace_back(DZ_DEFAULT_MODEL_DIR);
  return out;
}

Result<std::string> resolve_model_dir(const std::string& flag, const char* env,
                                      const std::vector<std::string>& candidates) {
  if (!flag.empty()) return flag;
  if (env != nullptr && *env != '\0') return std::string(env);
  for (const std::string& dir : candidates)
    if (has_config(dir)) return dir;
  return make_error(StatusCode::kNotFound,
                    "no --model given and the default model was not found at {} (no config.json "
                    "there; {} is unset): pass --model DIR",
                    candidates.empty() ? std::string("(no default compiled in)")
                                       : fmt::format("{}", fmt::join(candidates, " or ")),
                    kEnvVar);
}

Result<std::string> resolve_model_dir(const std::string& flag) {
  const char* env = std::getenv(kEnvVar);
  DZ_ASSIGN_OR_RETURN(std::string dir, resolve_model_dir(flag, env, default_model_candidates()));
  const char* source = !flag.empty()                      ? "--model"
                       : (env != nullptr && *env != '\0') ? kEnvVar
                                                          : "the default demo model";
  spdlog::info("model: {} (from {})", dir, source);
  return dir;
}

std::string default_model_help() {
  return fmt::format(
      "checkpoint folder (config.json, safetensors); default: ${} if set, else the demo model "
      "({})",
      kEnvVar, fmt::join(default_model_candidates(), " or "));
}

}  // namespace dz::cli
