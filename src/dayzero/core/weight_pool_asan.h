#pragma once
// AddressSanitizer's manual poisoning for memory it does not allocate itself (core/weight_pool):
// no-ops in other builds.

#include <cstddef>

#if defined(__SANITIZE_ADDRESS__)
#define DZ_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define DZ_ADDRESS_SANITIZER 1
#endif
#endif

#ifdef DZ_ADDRESS_SANITIZER
#include <sanitizer/asan_interface.h>
#endif

namespace dz::weight_pool {

#ifdef DZ_ADDRESS_SANITIZER
inline constexpr bool kAddressSanitizer = true;
inline void poison(std::byte* p, size_t n) {
  ASAN_POISON_MEMORY_REGION(p, n);
}
inline void unpoison(std::byte* p, size_t n) {
  ASAN_UNPOISON_MEMORY_REGION(p, n);
}
inline bool is_poisoned(const std::byte* p) {
  return __asan_address_is_poisoned(p) != 0;
}
#else
inline constexpr bool kAddressSanitizer = false;
inline void poison(std::byte*, size_t) {}
inline void unpoison(std::byte*, size_t) {}
inline bool is_poisoned(const std::byte*) {
  return false;
}
#endif

}  // namespace dz::weight_pool
