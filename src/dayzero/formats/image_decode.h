#pragma once
// Image files to 8-bit pixels (docs/vision.md §1): PNG, GIF (first frame) and BMP through
// stb_image, JPEG through libjpeg-turbo (stb's JPEG decoder does not survive crafted files). The
// size is read from the header and checked against the limits before a single pixel is decoded, so
// a small file that declares a huge image (a "decompression bomb") costs nothing.

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::formats {

struct DecodedImage {
  int64_t width = 0;
  int64_t height = 0;
  int channels = 0;             // 3 (RGB) or 4 (RGBA: the file had an alpha channel)
  std::vector<uint8_t> pixels;  // [height, width, channels], row-major
  // The file stores palette indices or 1-bit pixels (every GIF; PNG colour type 3 or 1-bit grey):
  // Pillow opens those as modes "P" / "1" and resizes them with nearest neighbour.
  bool indexed = false;
};

struct ImageLimits {
  int64_t max_file_bytes = int64_t{64} << 20;
  int64_t max_side = 16384;                // pixels, either side
  int64_t max_pixels = int64_t{64} << 20;  // width · height
  int64_t min_side = 14;                   // smaller than one vision patch carries nothing
};

// Decodes `bytes`; grayscale becomes RGB, grey + alpha becomes RGBA. Alpha is kept where Pillow
// sees transparency: an alpha channel, or a tRNS chunk on a palette or grey PNG (on an RGB PNG
// Pillow keeps RGB, and so does this). kInvalidArgument names what
// is wrong: not an image, a format not read here (WebP, TIFF, CMYK JPEG, ...), a size outside the
// limits, a truncated or corrupt file.
Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits = {});

}  // namespace dz::formats
