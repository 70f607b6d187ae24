#include "dayzero/model/vision/image_processor.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dayzero/kernels/image_resize.h"

namespace dz::model {
namespace {

ResizePlan plan_once(int64_t w, int64_t h, int64_t patch_limit, const ImageProcessorConfig& c) {
  const int64_t ps = c.patch_size;
  const int64_t side = c.patch_limit_on_one_side;
  // Every step in doubles as the processor's Python computes it: the patch product is exact, each
  // division and the square root correctly rounded, int() truncates.
  const auto patches =
      static_cast<double>(std::max<int64_t>(1, w / ps) * std::max<int64_t>(1, h / ps));
  const double s1 = std::sqrt(static_cast<double>(patch_limit) / patches);
  const double s2 = static_cast<double>(side * ps) / static_cast<double>(w);
  const double s3 = static_cast<double>(side * ps) / static_cast<double>(h);
  const double scale = std::min({1.0, s1, s2, s3});
  ResizePlan plan;
  plan.new_width = std::min(
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(w) * scale)), side * ps);
  plan.new_height = std::min(
      std::max<int64_t>(1, static_cast<int64_t>(static_cast<double>(h) * scale)), side * ps);
  const int64_t factor = c.merged_patch();
  plan.pad_width = (factor - plan.new_width % factor) % factor;
  plan.pad_height = (factor - plan.new_height % factor) % factor;
  plan.num_tokens =
      (plan.new_width + plan.pad_width) / factor * ((plan.new_height + plan.pad_height) / factor);
  return plan;
}

// Pillow's convert of a resized RGBA image onto the chessboard: a = A/255 in FP32, then
// trunc(a·c + (1 − a)·bg), each product and the sum rounded to FP32 as numpy does.
void composite_on_chessboard(const kernels::PixelImage& in,
                             const ImageProcessorConfig::Chessboard& board,
                             std::vector<uint8_t>& rgb) {
  rgb.resize(static_cast<size_t>(in.width * in.height * 3));
  for (int64_t y = 0; y < in.height; ++y)
    for (int64_t x = 0; x < in.width; ++x) {
      const bool odd = (y / board.square_size + x / board.square_size) % 2 == 1;
      const uint8_t bg = odd == board.white_on_top_left ? board.gray : board.white;
      const uint8_t* p = in.pixels.data() + (y * in.width + x) * 4;
      const float a = static_cast<float>(p[3]) / 255.0f;
      const float rest = 1.0f - a;
      for (int ch = 0; ch < 3; ++ch) {
        const float fg = a * static_cast<float>(p[ch]);
        const float back = rest * static_cast<float>(bg);
        const float sum = fg + back;
        rgb[static_cast<size_t>((y * in.width + x) * 3 + ch)] = static_cast<uint8_t>(sum);
      }
    }
}

}  // namespace

Result<ResizePlan> plan_resize(int64_t width, int64_t height, const ImageProcessorConfig& config) {
  if (width < 1 || height < 1)
    return make_error(StatusCode::kInvalidArgument, "image of {}x{} pixels", width, height);
  int64_t limit = config.in_patch_limit;
  for (;;) {
    const ResizePlan plan = plan_once(width, height, limit, config);
    const int64_t factor = config.merged_patch();
    if ((plan.new_width + plan.pad_width) / factor * config.merge_kernel_size >
            config.patch_limit_on_one_side ||
        (plan.new_height + plan.pad_height) / factor * config.merge_kernel_size >
            config.patch_limit_on_one_side)
      return make_error(StatusCode::kInvalidArgument,
                        "image of {}x{} pixels: its padded patch grid exceeds "
                        "patch_limit_on_one_side {}",
                        width, height, config.patch_limit_on_one_side);
    if (plan.num_tokens <= config.max_tokens() || limit <= 1) return plan;
    // K3's processor: lower the patch limit in proportion until the tokens fit.
    const auto reduced = static_cast<int64_t>(static_cast<double>(limit * config.max_tokens()) /
                                              static_cast<double>(plan.num_tokens));
    limit = std::max<int64_t>(1, std::min(limit - 1, reduced));
  }
}

ProcessedImage preprocess_image(const formats::DecodedImage& image, const ResizePlan& plan,
                                const ImageProcessorConfig& config) {
  kernels::PixelImage pixels{.width = image.width,
                             .height = image.height,
                             .channels = image.channels,
                             .pixels = image.pixels};
  pixels = image.indexed ? kernels::resize_nearest(pixels, plan.new_width, plan.new_height)
                         : kernels::resize_bicubic(pixels, plan.new_width, plan.new_height);
  std::vector<uint8_t> rgb;
  if (pixels.channels == 4 && config.transparent_background) {
    composite_on_chessboard(pixels, *config.transparent_background, rgb);
  } else if (pixels.channels == 4) {  // alpha dropped
    for (size_t i = 0; i < pixels.pixels.size(); i += 4)
      rgb.insert(rgb.end(), pixels.pixels.begin() + static_cast<long>(i),
                 pixels.pixels.begin() + static_cast<long>(i) + 3);
  } else {
    rgb = std::move(pixels.pixels);
  }
  const int64_t ps = config.patch_size;
  ProcessedImage out;
  out.width = image.width;
  out.height = image.height;
  out.grid_width = (plan.new_width + plan.pad_width) / ps;
  out.grid_height = (plan.new_height + plan.pad_height) / ps;
  out.num_tokens = plan.num_tokens;
  // (u8/255 in FP64, to FP32) − mean, · 1/std: each step in FP64 and stored as FP32, as numpy's
  // float32 array with float64 operands does. Padding is 0, so it normalizes to −mean/std.
  std::array<std::array<float, 256>, 3> level{};
  for (int ch = 0; ch < 3; ++ch) {
    const double inverse_std = 1.0 / config.image_std[static_cast<size_t>(ch)];
    for (int v = 0; v < 256; ++v) {
      const auto x = static_cast<float>(static_cast<double>(v) / 255.0);
      const auto centred =
          static_cast<float>(static_cast<double>(x) - config.image_mean[static_cast<size_t>(ch)]);
      level[static_cast<size_t>(ch)][static_cast<size_t>(v)] =
          static_cast<float>(static_cast<double>(centred) * inverse_std);
    }
  }
  const int64_t patch_elems = 3 * ps * ps;
  out.pixel_values.resize(static_cast<size_t>(out.num_patches() * patch_elems));
  for (int64_t gy = 0; gy < out.grid_height; ++gy)
    for (int64_t gx = 0; gx < out.grid_width; ++gx) {
      float* patch = out.pixel_values.data() + (gy * out.grid_width + gx) * patch_elems;
      for (int ch = 0; ch < 3; ++ch)
        for (int64_t py = 0; py < ps; ++py)
          for (int64_t px = 0; px < ps; ++px) {
            const int64_t y = gy * ps + py;
            const int64_t x = gx * ps + px;
            const uint8_t v = y < plan.new_height && x < plan.new_width
                                  ? rgb[static_cast<size_t>((y * plan.new_width + x) * 3 + ch)]
                                  : uint8_t{0};
            patch[(ch * ps + py) * ps + px] = level[static_cast<size_t>(ch)][v];
          }
    }
  return out;
}

std::string k3_image_prompt(int64_t width, int64_t height) {
  return fmt::format("<|media_begin|>image {}x{}<|media_content|><|media_pad|><|media_end|>", width,
                     height);
}

}  // namespace dz::model
