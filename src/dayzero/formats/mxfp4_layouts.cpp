#include "dayzero/formats/mxfp4_layouts.h"

#include "dayzero/core/check.h"
#include "dayzero/formats/decode_tables.h"
#include "dayzero/formats/mx_block.h"

namespace dz::formats {

void dequantize_mxfp4_packed(std::span<const uint8_t> weight_packed,
                             std::span<const uint8_t> weight_scale, int64_t num_rows,
                             int64_t num_cols, std::span<float> out) {
  DZ_CHECK(num_rows >= 0 && num_cols >= 0 && num_cols % kMxBlockElems == 0,
           "MXFP4 weight [{}, {}]: in must be a multiple of 32", num_rows, num_cols);
  const auto num_elems = static_cast<size_t>(num_rows * num_cols);
  DZ_CHECK(weight_packed.size() == num_elems / 2 && weight_scale.size() == num_elems / 32 &&
               out.size() == num_elems,
           "packed {} / scale {} / out {} for [{}, {}]", weight_packed.size(), weight_scale.size(),
           out.size(), num_rows, num_cols);
  // Rows are contiguous and in % 32 == 0, so element e of the flattened weight is nibble e % 2 of
  // byte e / 2 and its scale is code e / 32, whatever the row.
  for (size_t byte = 0; byte < weight_packed.size(); ++byte) {
    const float scale = decode_e8m0(weight_scale[byte / 16]);
    out[2 * byte] = decode_e2m1(weight_packed[byte] & 0xF) * scale;
    out[2 * byte + 1] = decode_e2m1(weight_packed[byte] >> 4) * scale;
  }
}

void dequantize_mxfp4_gpt_oss(std::span<const uint8_t> blocks, std::span<const uint8_t> scales,
                              int64_t num_experts, int64_t num_rows, int64_t num_cols,
                              std::span<float> out) {
  DZ_CHECK(num_experts >= 0, "num_experts {}", num_experts);
  // [E, out, in/32, 16] is byte for byte the packed layout of an [E · out, in] weight.
  dequantize_mxfp4_packed(blocks, scales, num_experts * num_rows, num_cols, out);
}

}  // namespace dz::formats
