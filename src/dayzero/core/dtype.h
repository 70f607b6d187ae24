#pragma once
// Element types the engine stores or reads. Sub-byte types (F4_E2M1) count bits, not bytes.

#include <cstdint>
#include <optional>
#include <string_view>

namespace dz {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF8E4M3,  // OCP E4M3 "fn": no Inf, NaN only at 0x7F/0xFF (docs/formats.md §1.1)
  kF8E5M2,
  kF8E8M0,  // MX scale: 2^(code-127), 0xFF is NaN
  kF4E2M1,  // MX element, two per byte
  kU8,
  kI8,
  kI32,
  kI64,
  kBool,
  kF64,
};

// Bits of one element: 4 for F4_E2M1, 8 × bytes otherwise.
int dtype_bits(DType dtype);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dtype);
// Parses a safetensors dtype string; nullopt for anything not in the enum.
std::optional<DType> dtype_from_name(std::string_view name);
bool dtype_is_float(DType dtype);

}  // namespace dz
