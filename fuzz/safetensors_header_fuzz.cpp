// Feeds arbitrary bytes to the safetensors header validator (docs/formats.md §3.1). Any input must
// give an ok Status or an error Status: no crash, no hang, no sanitizer report.

#include <cstddef>
#include <cstdint>
#include <span>

#include "dayzero/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto bytes = std::as_bytes(std::span(data, size));
  dz::Status status = dz::formats::SafetensorsFile::validate(bytes, "fuzz.safetensors");
  // Every refusal must say what was wrong.
  if (!status.ok() && status.message().empty()) __builtin_trap();
  return 0;
}
