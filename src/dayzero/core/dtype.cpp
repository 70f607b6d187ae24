#include "dayzero/core/dtype.h"

#include <array>
#include <utility>

namespace dz {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int bits;
  bool is_float;
};

constexpr std::array kDTypes = {
    DTypeInfo{DType::kF32, "F32", 32, true},      DTypeInfo{DType::kF16, "F16", 16, true},
    DTypeInfo{DType::kBF16, "BF16", 16, true},    DTypeInfo{DType::kF8E4M3, "F8_E4M3", 8, true},
    DTypeInfo{DType::kF8E5M2, "F8_E5M2", 8, true}, DTypeInfo{DType::kF8E8M0, "F8_E8M0", 8, false},
    DTypeInfo{DType::kF4E2M1, "F4", 4, true},     DTypeInfo{DType::kU8, "U8", 8, false},
    DTypeInfo{DType::kI8, "I8", 8, false},        DTypeInfo{DType::kI32, "I32", 32, false},
    DTypeInfo{DType::kI64, "I64", 64, false},     DTypeInfo{DType::kBool, "BOOL", 8, false},
    DTypeInfo{DType::kF64, "F64", 64, true},
};

const DTypeInfo& info(DType dtype) {
  for (const auto& entry : kDTypes)
    if (entry.dtype == dtype) return entry;
  __builtin_unreachable();
}

}  // namespace

int dtype_bits(DType dtype) { return info(dtype).bits; }
std::string_view dtype_name(DType dtype) { return info(dtype).name; }
bool dtype_is_float(DType dtype) { return info(dtype).is_float; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& entry : kDTypes)
    if (entry.name == name) return entry.dtype;
  return std::nullopt;
}

}  // namespace dz
