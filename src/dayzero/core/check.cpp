#include "dayzero/core/check.h"

#include <cstdio>
#include <cstdlib>

namespace dz::detail {

void check_failed(const char* file, int line, const char* condition, const std::string& message) {
  std::fprintf(stderr, "%s:%d: check failed: %s%s%s\n", file, line, condition,
               message.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace dz::detail
