#pragma once
// Bicubic resampling of 8-bit images exactly as Pillow's Image.resize(size, BICUBIC) computes it
// (docs/vision.md §2), because the published vision processors resize with Pillow and the tower
// sees their pixels: a separable filter (a = −0.5, support 2 widened by the scale when shrinking),
// coefficients normalised per output pixel and rounded to 22-bit fixed point, the horizontal pass
// first, each pass rounded and clamped to 8 bits. RGBA is resampled premultiplied by alpha and
// divided back, as Pillow does.

#include <cstdint>
#include <vector>

namespace dz::kernels {

struct PixelImage {
  int64_t width = 0;
  int64_t height = 0;
  int channels = 0;             // 1 to 4; 4 is RGBA (alpha last)
  std::vector<uint8_t> pixels;  // [height, width, channels]
};

// `in` resized to out_width × out_height (both ≥ 1). A side of unchanged length is not filtered.
PixelImage resize_bicubic(const PixelImage& in, int64_t out_width, int64_t out_height);

// Pillow's NEAREST (which it forces for palette images): output pixel x reads input pixel
// trunc(s/2 + x·s), s = in/out, the position accumulated by repeated addition as Pillow does.
PixelImage resize_nearest(const PixelImage& in, int64_t out_width, int64_t out_height);

}  // namespace dz::kernels
