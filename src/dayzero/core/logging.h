#pragma once
// Logging goes through spdlog's default logger, the only process-wide state (docs/style.md §16).
// `main` calls init_logging once; libraries call spdlog::info/warn/... directly.

#include <string_view>

#include <spdlog/spdlog.h>

namespace dz {

// Level names as spdlog spells them: trace, debug, info, warn, error, critical, off.
// Logs go to stderr so that stdout stays clean for generated text and tables.
void init_logging(std::string_view level);

}  // namespace dz
