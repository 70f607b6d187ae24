#include "dayzero/kernels/image_resize.h"

#include <algorithm>
#include <cmath>

#include "dayzero/core/check.h"

namespace dz::kernels {
namespace {

constexpr int kPrecisionBits = 32 - 8 - 2;  // Pillow's fixed point for 8-bit images
constexpr double kSupport = 2.0;

double bicubic(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}

// The taps of one output pixel: input pixels [first, first + weights.size()).
struct Taps {
  int64_t first = 0;
  std::vector<int32_t> weights;
};

std::vector<Taps> taps_for(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = kSupport * filter_scale;
  const double inverse = 1.0 / filter_scale;  // Pillow multiplies by it (not divides): same bits
  std::vector<Taps> taps(static_cast<size_t>(out_size));
  std::vector<double> w;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = (static_cast<double>(i) + 0.5) * scale;
    // Pillow's rounding of the window ends: truncation of x + 0.5, then clamped.
    const int64_t first = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const int64_t last = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    w.assign(static_cast<size_t>(std::max<int64_t>(last - first, 0)), 0.0);
    double total = 0;
    for (size_t x = 0; x < w.size(); ++x) {
      w[x] =
          bicubic((static_cast<double>(first + static_cast<int64_t>(x)) - center + 0.5) * inverse);
      total += w[x];
    }
    Taps& t = taps[static_cast<size_t>(i)];
    t.first = first;
    for (double v : w) {
      if (total != 0.0) v /= total;
      const double fixed = v * static_cast<double>(1 << kPrecisionBits);
      t.weights.push_back(static_cast<int32_t>(v < 0 ? fixed - 0.5 : fixed + 0.5));
    }
  }
  return taps;
}

uint8_t clip8(int64_t sum) {
  return static_cast<uint8_t>(std::clamp<int64_t>(sum >> kPrecisionBits, 0, 255));
}

// The horizontal pass.
PixelImage resample_rows(const PixelImage& in, int64_t out_width) {
  const std::vector<Taps> taps = taps_for(in.width, out_width);
  const int c = in.channels;
  PixelImage out{.width = out_width, .height = in.height, .channels = c, .pixels = {}};
  out.pixels.resize(static_cast<size_t>(out_width * in.height * c));
  for (int64_t y = 0; y < in.height; ++y) {
    const uint8_t* row = in.pixels.data() + y * in.width * c;
    uint8_t* dst = out.pixels.data() + y * out_width * c;
    for (int64_t x = 0; x < out_width; ++x) {
      const Taps& t = taps[static_cast<size_t>(x)];
      for (int ch = 0; ch < c; ++ch) {
        int64_t sum = int64_t{1} << (kPrecisionBits - 1);
        for (size_t k = 0; k < t.weights.size(); ++k)
          sum += int64_t{row[(t.first + static_cast<int64_t>(k)) * c + ch]} * t.weights[k];
        dst[x * c + ch] = clip8(sum);
      }
    }
  }
  return out;
}

// The vertical pass.
PixelImage resample_columns(const PixelImage& in, int64_t out_height) {
  const std::vector<Taps> taps = taps_for(in.height, out_height);
  const int64_t row_elems = in.width * in.channels;
  PixelImage out{.width = in.width, .height = out_height, .channels = in.channels, .pixels = {}};
  out.pixels.resize(static_cast<size_t>(row_elems * out_height));
  std::vector<int64_t> sums(static_cast<size_t>(row_elems));
  for (int64_t y = 0; y < out_height; ++y) {
    const Taps& t = taps[static_cast<size_t>(y)];
    std::fill(sums.begin(), sums.end(), int64_t{1} << (kPrecisionBits - 1));
    for (size_t k = 0; k < t.weights.size(); ++k) {
      const uint8_t* row = in.pixels.data() + (t.first + static_cast<int64_t>(k)) * row_elems;
      for (int64_t e = 0; e < row_elems; ++e)
        sums[static_cast<size_t>(e)] += int64_t{row[e]} * t.weights[k];
    }
    uint8_t* dst = out.pixels.data() + y * row_elems;
    for (int64_t e = 0; e < row_elems; ++e) dst[e] = clip8(sums[static_cast<size_t>(e)]);
  }
  return out;
}

// Pillow's RGBA → RGBa: c · α / 255 rounded with its two-shift division.
void premultiply(PixelImage& im) {
  for (size_t i = 0; i < im.pixels.size(); i += 4) {
    const uint32_t alpha = im.pixels[i + 3];
    for (size_t ch = 0; ch < 3; ++ch) {
      const uint32_t t = im.pixels[i + ch] * alpha + 128;
      im.pixels[i + ch] = static_cast<uint8_t>(((t >> 8) + t) >> 8);
    }
  }
}

// Pillow's RGBa → RGBA: c · 255 / α truncated and clamped; α of 0 or 255 left as is.
void unpremultiply(PixelImage& im) {
  for (size_t i = 0; i < im.pixels.size(); i += 4) {
    const uint32_t alpha = im.pixels[i + 3];
    if (alpha == 0 || alpha == 255) continue;
    for (size_t ch = 0; ch < 3; ++ch)
      im.pixels[i + ch] =
          static_cast<uint8_t>(std::min<uint32_t>(255 * im.pixels[i + ch] / alpha, 255));
  }
}

}  // namespace

PixelImage resize_bicubic(const PixelImage& in, int64_t out_width, int64_t out_height) {
  DZ_CHECK(out_width >= 1 && out_height >= 1 && in.width >= 1 && in.height >= 1,
           "resize_bicubic: {}x{} to {}x{}", in.width, in.height, out_width, out_height);
  DZ_CHECK(in.channels >= 1 && in.channels <= 4 &&
               in.pixels.size() == static_cast<size_t>(in.width * in.height * in.channels),
           "resize_bicubic: {} bytes for {}x{}x{}", in.pixels.size(), in.width, in.height,
           in.channels);
  if (out_width == in.width && out_height == in.height) return in;
  PixelImage im = in;
  const bool rgba = in.channels == 4;
  if (rgba) premultiply(im);
  if (out_width != im.width) im = resample_rows(im, out_width);
  if (out_height != im.height) im = resample_columns(im, out_height);
  if (rgba) unpremultiply(im);
  return im;
}

PixelImage resize_nearest(const PixelImage& in, int64_t out_width, int64_t out_height) {
  DZ_CHECK(out_width >= 1 && out_height >= 1 && in.width >= 1 && in.height >= 1,
           "resize_nearest: {}x{} to {}x{}", in.width, in.height, out_width, out_height);
  if (out_width == in.width && out_height == in.height) return in;
  auto sources = [](int64_t in_size, int64_t out_size) {
    const double step = static_cast<double>(in_size) / static_cast<double>(out_size);
    std::vector<int64_t> from(static_cast<size_t>(out_size));
    double at = step * 0.5;
    for (int64_t& f : from) {
      f = std::min(static_cast<int64_t>(at), in_size - 1);
      at += step;
    }
    return from;
  };
  const std::vector<int64_t> xs = sources(in.width, out_width);
  const std::vector<int64_t> ys = sources(in.height, out_height);
  const int c = in.channels;
  PixelImage out{.width = out_width, .height = out_height, .channels = c, .pixels = {}};
  out.pixels.resize(static_cast<size_t>(out_width * out_height * c));
  for (int64_t y = 0; y < out_height; ++y)
    for (int64_t x = 0; x < out_width; ++x)
      for (int ch = 0; ch < c; ++ch)
        out.pixels[static_cast<size_t>((y * out_width + x) * c + ch)] =
            in.pixels[static_cast<size_t>(
                (ys[static_cast<size_t>(y)] * in.width + xs[static_cast<size_t>(x)]) * c + ch)];
  return out;
}

}  // namespace dz::kernels
