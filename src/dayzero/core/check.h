#pragma once
// Invariant checks (docs/style.md §17). DZ_CHECK is always on, DZ_DCHECK only in debug builds. Both
// report file and line and abort: they guard programming errors, never bad input (that returns a
// Status).

#include <fmt/format.h>

namespace dz::detail {
[[noreturn]] void check_failed(const char* file, int line, const char* condition,
                               const std::string& message);
}  // namespace dz::detail

#define DZ_CHECK(cond, ...)                                                                 \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::dz::detail::check_failed(__FILE__, __LINE__, #cond, ::fmt::format("" __VA_ARGS__)); \
  } while (0)

#ifdef NDEBUG
#define DZ_DCHECK(cond, ...) \
  do {                       \
  } while (0)
#else
#define DZ_DCHECK(cond, ...) DZ_CHECK(cond, __VA_ARGS__)
#endif
