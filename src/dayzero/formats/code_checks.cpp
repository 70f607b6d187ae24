#include "dayzero/formats/code_checks.h"

#include <algorithm>

#include <fmt/format.h>

namespace dz::formats {
namespace {

Status check_sizes(size_t num_codes, const Shape& shape, std::string_view what) {
  if (static_cast<int64_t>(num_codes) != shape.num_elems())
    return make_error(StatusCode::kInvalidArgument, "{}: {} bytes for shape {} ({} elements)", what,
                      num_codes, shape.to_string(), shape.num_elems());
  return {};
}

}  // namespace

std::string unravel_index(int64_t flat_index, const Shape& shape) {
  Shape index;
  for (int axis = 0; axis < shape.rank(); ++axis) index.push_back(0);
  for (int axis = shape.rank() - 1; axis >= 0; --axis) {
    const int64_t dim = shape[axis];
    index[axis] = dim > 0 ? flat_index % dim : 0;
    flat_index = dim > 0 ? flat_index / dim : 0;
  }
  return index.to_string();
}

Status check_e8m0_scales(std::span<const uint8_t> scales, const Shape& shape) {
  DZ_RETURN_IF_ERROR(check_sizes(scales.size(), shape, "E8M0 scales"));
  const auto it = std::find(scales.begin(), scales.end(), uint8_t{0xFF});
  if (it == scales.end()) return {};
  const int64_t flat = it - scales.begin();
  return make_error(StatusCode::kCorrupt,
                    "E8M0 scale code 0xFF (NaN) at index {} (element {} of {})",
                    unravel_index(flat, shape), flat, shape.to_string());
}

Status check_e4m3_codes(std::span<const uint8_t> codes, const Shape& shape) {
  DZ_RETURN_IF_ERROR(check_sizes(codes.size(), shape, "E4M3 codes"));
  const auto it =
      std::find_if(codes.begin(), codes.end(), [](uint8_t c) { return (c & 0x7F) == 0x7F; });
  if (it == codes.end()) return {};
  const int64_t flat = it - codes.begin();
  return make_error(StatusCode::kCorrupt, "E4M3 NaN code 0x{:02X} at index {} (element {} of {})",
                    *it, unravel_index(flat, shape), flat, shape.to_string());
}

}  // namespace dz::formats
