#pragma once
// NumPy .npy files, format version 1.0 (numpy.lib.format): the magic "\x93NUMPY", version 1.0, a
// little-endian u16 header length, an ASCII dict {'descr': '<f4', 'fortran_order': False,
// 'shape': (...), } padded with spaces and ended by '\n' so that the data starts at a multiple of
// 64 bytes, then the C-order data. Written for `dayzero logits`; read back for tests.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/core/tensor_view.h"

namespace dz::formats {

// The whole file for float32 `data` of `shape` (num_elems must match).
std::string encode_npy_f32(std::span<const float> data, const Shape& shape);
// Writes it to `path` (replacing the file); errors name the path.
Status write_npy_f32(const std::string& path, std::span<const float> data, const Shape& shape);

struct NpyF32 {
  Shape shape;
  std::vector<float> data;
};
// Parses a version 1.0 little-endian float32 C-order file as written above.
Result<NpyF32> decode_npy_f32(std::string_view bytes);

}  // namespace dz::formats
