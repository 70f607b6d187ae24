#include "dayzero/formats/fp8_block.h"

#include "dayzero/core/check.h"
#include "dayzero/formats/decode_tables.h"

namespace dz::formats {

void dequantize_fp8_block(std::span<const uint8_t> codes, std::span<const float> scale_inv,
                          const Fp8BlockShape& shape, std::span<float> out) {
  DZ_CHECK(
      shape.num_rows >= 0 && shape.num_cols >= 0 && shape.block_rows > 0 && shape.block_cols > 0,
      "bad FP8 block shape [{}, {}] / [{}, {}]", shape.num_rows, shape.num_cols, shape.block_rows,
      shape.block_cols);
  const auto num_elems = static_cast<size_t>(shape.num_rows * shape.num_cols);
  DZ_CHECK(codes.size() == num_elems && out.size() == num_elems, "codes {} / out {} for [{}, {}]",
           codes.size(), out.size(), shape.num_rows, shape.num_cols);
  DZ_CHECK(scale_inv.size() == static_cast<size_t>(shape.num_scale_rows() * shape.num_scale_cols()),
           "scale_inv has {} values, [{}, {}] needs [{}, {}]", scale_inv.size(), shape.num_rows,
           shape.num_cols, shape.num_scale_rows(), shape.num_scale_cols());
  const int64_t num_scale_cols = shape.num_scale_cols();
  for (int64_t i = 0; i < shape.num_rows; ++i) {
    const float* scale_row = scale_inv.data() + (i / shape.block_rows) * num_scale_cols;
    const int64_t row_begin = i * shape.num_cols;
    for (int64_t j = 0; j < shape.num_cols; ++j)
      out[row_begin + j] = decode_e4m3(codes[row_begin + j]) * scale_row[j / shape.block_cols];
  }
}

}  // namespace dz::formats
