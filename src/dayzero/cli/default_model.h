#pragma once
// Which checkpoint `generate` and `serve` run when --model is not given: the shipped demo model
// (models/demo). Resolution order: --model, env DAYZERO_MODEL, the installed copy
// <exe>/../share/dayzero/models/demo, then the source tree's models/demo (DZ_DEFAULT_MODEL_DIR,
// compiled in). The choice is logged.

#include <string>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::cli {

// Where the default model may live, in the order they are tried (exists = holds config.json).
std::vector<std::string> default_model_candidates();

// The folder to load: `flag` when non-empty, else $DAYZERO_MODEL when set and non-empty, else the
// first candidate holding a config.json; kNotFound naming every candidate otherwise. `env` and
// `candidates` are passed in so the order can be tested without touching the process.
Result<std::string> resolve_model_dir(const std::string& flag, const char* env,
                                      const std::vector<std::string>& candidates);

// resolve_model_dir with the real environment and candidates; logs the pick and its source.
Result<std::string> resolve_model_dir(const std::string& flag);

// The help text of --model for commands with the default ("... default: ...").
std::string default_model_help();

}  // namespace dz::cli
