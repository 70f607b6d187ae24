#pragma once
// Where the AMX kernels of an MXFP4 weight (linear_mxfp4_amx_avx512.cpp) keep its nibbles and
// scales. Rows go in groups of 16 (the last padded with zero rows, scale code 127); a group's
// blocks follow each other, each block (16 rows × 32 inputs) as 256 bytes laid out so that VPERMW
// on its four 64-byte chunks, shifted by 0, 4, 8 and 12 bits, gives the 16 rows of an AMX BF16
// B tile directly: tile row r holds dword n = (W[n][2r], W[n][2r + 1]). Chunk c, 16-bit word w,
// nibble q (bits 4q … 4q + 3) holds tile row r = 4c + q, word w: row n = w / 2, input k = 2r + w
// % 2. The scales of a group's block are its 16 rows' E8M0 codes, 16 bytes, in the same block
// order.

#include <cstdint>

namespace dz::kernels::detail {

inline constexpr int64_t kMxfp4AmxGroupRows = 16;
inline constexpr int64_t kMxfp4AmxBlockBytes = 256;

inline int64_t mxfp4_amx_num_groups(int64_t out) {
  return (out + kMxfp4AmxGroupRows - 1) / kMxfp4AmxGroupRows;
}

struct Mxfp4AmxNibble {
  int64_t byte;  // offset in the packed codes
  int shift;     // 0: low nibble, 4: high nibble
};

// Element [row, col] of a weight with `in` inputs.
inline Mxfp4AmxNibble mxfp4_amx_nibble(int64_t in, int64_t row, int64_t col) {
  const int64_t group = row / kMxfp4AmxGroupRows, n = row % kMxfp4AmxGroupRows;
  const int64_t block = col / 32, k = col % 32;
  const int64_t tile_row = k / 2, chunk = tile_row / 4, q = tile_row % 4, word = 2 * n + k % 2;
  return {(group * (in / 32) + block) * kMxfp4AmxBlockBytes + 64 * chunk + 2 * word + q / 2,
          static_cast<int>(4 * (q % 2))};
}

// The scale code of [row, block].
inline int64_t mxfp4_amx_scale_index(int64_t in, int64_t row, int64_t block) {
  return ((row / kMxfp4AmxGroupRows) * (in / 32) + block) * kMxfp4AmxGroupRows +
         row % kMxfp4AmxGroupRows;
}

}  // namespace dz::kernels::detail
