#pragma once
// Value checks the loader runs on quantized weights before dequantizing them (docs/formats.md §2.1,
// §3.6): an E8M0 scale 0xFF makes its whole block NaN and an E4M3 NaN code poisons every output it
// touches, so both are refused with the first offending index.

#include <cstdint>
#include <span>
#include <string>

#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"

namespace dz::formats {

// scales: the E8M0 codes of a tensor of `shape` (C order). kCorrupt naming the first 0xFF, e.g.
// "E8M0 scale code 0xFF (NaN) at index [1, 3] (element 7 of [2, 4])".
Status check_e8m0_scales(std::span<const uint8_t> scales, const Shape& shape);

// codes: the E4M3 codes of a tensor of `shape`. kCorrupt naming the first 0x7F or 0xFF.
Status check_e4m3_codes(std::span<const uint8_t> codes, const Shape& shape);

// "[i0, i1, ...]": the multi-index of C-order element `flat_index` in `shape`.
std::string unravel_index(int64_t flat_index, const Shape& shape);

}  // namespace dz::formats
