#pragma once
// JPEG files to 8-bit RGB through libjpeg-turbo (docs/vision.md §1), the decoder Pillow links on
// Debian, with its default settings (accurate integer IDCT, fancy upsampling) so the pixels are the
// ones the reference sees. The declared size is checked against the limits before any pixel is
// decoded, a progressive file may not have more than kMaxJpegScans scans, and a file cut short is
// an error, not an image padded with grey.

#include <cstdint>
#include <span>

#include "dayzero/core/status.h"
#include "dayzero/formats/image_decode.h"

namespace dz::formats {

// libjpeg-turbo's own recommendation for untrusted progressive files: each scan is a pass over the
// whole coefficient buffer, so thousands of tiny scans would cost minutes on a small file.
inline constexpr int kMaxJpegScans = 500;

// Greyscale and colour (YCbCr, RGB) JPEGs; CMYK and YCCK are refused (Pillow resizes those in CMYK
// before converting, which this pipeline does not follow).
Result<DecodedImage> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits);

}  // namespace dz::formats
