#include "dayzero/kernels/image_resize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace dz::kernels {
namespace image_resize_test {

// The same two passes in FP64 with exact coefficients, each pass rounded half up and clamped to 8
// bits as the kernel does. The kernel's only other rounding is its 22-bit coefficients: a pass's
// sum moves by at most (taps · 255 · 2^−23) ≈ 1e-4 from the exact one, which changes the rounded
// value only where the exact sum lies that close to a half: at most 1 apart, and rarely.
double cubic(double x) {
  x = std::fabs(x);
  if (x < 1) return (1.5 * x - 2.5) * x * x + 1;
  if (x < 2) return ((-0.5 * x + 2.5) * x - 4) * x + 2;
  return 0;
}

// One line of `in_size` values resampled to `out_size`.
std::vector<uint8_t> reference_pass(const std::vector<uint8_t>& in, int64_t out_size) {
  const auto in_size = static_cast<int64_t>(in.size());
  std::vector<uint8_t> out(static_cast<size_t>(out_size));
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double fs = std::max(scale, 1.0);
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (static_cast<double>(o) + 0.5) * scale;
    const auto first = std::max<int64_t>(static_cast<int64_t>(center - 2 * fs + 0.5), 0);
    const auto last = std::min<int64_t>(static_cast<int64_t>(center + 2 * fs + 0.5), in_size);
    double total = 0;
    double sum = 0;
    for (int64_t i = first; i < last; ++i) {
      const double w = cubic((static_cast<double>(i) - center + 0.5) / fs);
      total += w;
      sum += w * in[static_cast<size_t>(i)];
    }
    out[static_cast<size_t>(o)] =
        static_cast<uint8_t>(std::clamp(std::floor(sum / total + 0.5), 0.0, 255.0));
  }
  return out;
}

PixelImage reference_resize(const PixelImage& in, int64_t w, int64_t h) {
  const int c = in.channels;
  // Horizontal: lines are (y, channel); then vertical: lines are (x, channel).
  PixelImage mid = in;
  if (w != in.width) {
    mid.width = w;
    mid.pixels.assign(static_cast<size_t>(w * in.height * c), 0);
    for (int64_t y = 0; y < in.height; ++y)
      for (int ch = 0; ch < c; ++ch) {
        std::vector<uint8_t> line(static_cast<size_t>(in.width));
        for (int64_t x = 0; x < in.width; ++x)
          line[static_cast<size_t>(x)] =
              in.pixels[static_cast<size_t>((y * in.width + x) * c + ch)];
        const std::vector<uint8_t> r = reference_pass(line, w);
        for (int64_t x = 0; x < w; ++x)
          mid.pixels[static_cast<size_t>((y * w + x) * c + ch)] = r[static_cast<size_t>(x)];
      }
  }
  PixelImage out = mid;
  if (h != mid.height) {
    out.height = h;
    out.pixels.assign(static_cast<size_t>(mid.width * h * c), 0);
    for (int64_t x = 0; x < mid.width; ++x)
      for (int ch = 0; ch < c; ++ch) {
        std::vector<uint8_t> line(static_cast<size_t>(mid.height));
        for (int64_t y = 0; y < mid.height; ++y)
          line[static_cast<size_t>(y)] =
              mid.pixels[static_cast<size_t>((y * mid.width + x) * c + ch)];
        const std::vector<uint8_t> r = reference_pass(line, h);
        for (int64_t y = 0; y < h; ++y)
          out.pixels[static_cast<size_t>((y * mid.width + x) * c + ch)] = r[static_cast<size_t>(y)];
      }
  }
  return out;
}

PixelImage random_image(std::mt19937& rng, int64_t w, int64_t h, int c) {
  PixelImage im{.width = w, .height = h, .channels = c, .pixels = {}};
  std::uniform_int_distribution<int> byte(0, 255);
  // Smooth gradients plus noise: both flat areas and edges (where the negative lobes overshoot).
  for (int64_t y = 0; y < h; ++y)
    for (int64_t x = 0; x < w; ++x)
      for (int ch = 0; ch < c; ++ch)
        im.pixels.push_back(static_cast<uint8_t>(
            (x * 255 / std::max<int64_t>(w - 1, 1) + (ch + 1) * y * 37 + byte(rng) / 4) % 256));
  return im;
}

TEST(ImageResize, MatchesTheFp64TwoPassFilterWithinTwoLevels) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  struct Case {
    int64_t w, h, out_w, out_h;
  };
  // Shrinking (widened support), enlarging, one side unchanged, odd ratios, to 1 pixel.
  for (const Case& k : {Case{97, 61, 40, 23}, Case{20, 13, 57, 41}, Case{64, 48, 64, 17},
                        Case{33, 70, 9, 70}, Case{15, 15, 1, 1}, Case{200, 3, 31, 7}})
    for (int c : {1, 3}) {
      const PixelImage in = random_image(rng, k.w, k.h, c);
      const PixelImage got = resize_bicubic(in, k.out_w, k.out_h);
      const PixelImage want = reference_resize(in, k.out_w, k.out_h);
      ASSERT_EQ(got.pixels.size(), want.pixels.size());
      // Pillow's 22-bit fixed-point coefficients (and its FP32 filter centres) can put a value
      // on the other side of a rounding boundary than FP64 does: one level in the first pass,
      // which the second pass carries with the gain Σ|w| of its filter (below 1.3 for bicubic
      // with a = −0.5), plus its own flip: |d| ≤ 1 · 1.3 + 1, so at most 2 levels. How often a
      // flip happens depends on the picture, so only the bound is checked; exactness against
      // Pillow itself is the Python tests' (0 bytes differ).
      for (size_t i = 0; i < got.pixels.size(); ++i) {
        const int d = std::abs(int{got.pixels[i]} - int{want.pixels[i]});
        ASSERT_LE(d, 2) << k.w << "x" << k.h << " -> " << k.out_w << "x" << k.out_h << " c" << c
                        << " byte " << i;
      }
    }
}

TEST(ImageResize, RgbaIsFilteredPremultipliedSoTransparentColourDoesNotBleed) {
  // Left half opaque red, right half fully transparent green: after shrinking, no pixel with any
  // opacity may carry green (it would without premultiplication).
  PixelImage in{.width = 16, .height = 4, .channels = 4, .pixels = {}};
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 16; ++x) {
      const bool left = x < 8;
      for (uint8_t v :
           {uint8_t(left ? 255 : 0), uint8_t(left ? 0 : 255), uint8_t{0}, uint8_t(left ? 255 : 0)})
        in.pixels.push_back(v);
    }
  const PixelImage out = resize_bicubic(in, 5, 3);
  for (size_t i = 0; i < out.pixels.size(); i += 4)
    if (out.pixels[i + 3] > 0) {
      EXPECT_EQ(out.pixels[i + 1], 0) << "pixel " << i / 4;
    }
}

TEST(ImageResize, SameSizeIsACopy) {
  std::mt19937 rng(3);
  const PixelImage in = random_image(rng, 9, 7, 3);
  EXPECT_EQ(resize_bicubic(in, 9, 7).pixels, in.pixels);
}

}  // namespace image_resize_test
}  // namespace dz::kernels
