#include "dayzero/formats/image_decode.h"

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "dayzero/formats/jpeg_decode.h"

// stb_image, compiled here only, for the formats above and from memory only.
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_GIF
#define STBI_ONLY_BMP
#define STBI_NO_STDIO
#define STBI_NO_LINEAR
#define STBI_NO_HDR
#define STBI_MAX_DIMENSIONS 65536
// stb is a system header here (/usr/include): its own warnings are not ours.
#include <stb/stb_image.h>

namespace dz::formats {
namespace {

using namespace std::string_view_literals;

std::string_view container_of(std::span<const uint8_t> b) {
  auto starts = [&](std::string_view magic, size_t at = 0) {
    return b.size() >= at + magic.size() &&
           std::memcmp(b.data() + at, magic.data(), magic.size()) == 0;
  };
  if (starts("\x89PNG\r\n\x1a\n"sv)) return "PNG";
  if (starts("\xff\xd8\xff"sv)) return "JPEG";
  if (starts("GIF87a"sv) || starts("GIF89a"sv)) return "GIF";
  if (starts("BM"sv)) return "BMP";
  if (starts("RIFF"sv) && starts("WEBP"sv, 8)) return "WebP";
  if (starts("II*"sv) || starts("MM\0*"sv)) return "TIFF";
  if (starts("ftyp"sv, 4)) return "HEIF/AVIF";
  if (starts("qoif"sv)) return "QOI";
  return {};
}

uint32_t big_endian(std::span<const uint8_t> b, size_t at, int bytes) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) v = v << 8 | b[at + static_cast<size_t>(i)];
  return v;
}

uint32_t little_endian(std::span<const uint8_t> b, size_t at, int bytes) {
  uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = v << 8 | b[at + static_cast<size_t>(i)];
  return v;
}

struct Size {
  int64_t width = 0;
  int64_t height = 0;
};

// The size the file declares (PNG, GIF, BMP), read here rather than by stb (which refuses some
// sizes with a bare "unknown image type"); nothing when the header is cut short.
std::optional<Size> declared_size(std::span<const uint8_t> b, std::string_view container) {
  if (container == "PNG") {  // IHDR first: width, height as big-endian u32
    if (b.size() < 26) return std::nullopt;
    return Size{big_endian(b, 16, 4), big_endian(b, 20, 4)};
  }
  if (container == "GIF") {  // logical screen: little-endian u16 width, height
    if (b.size() < 10) return std::nullopt;
    return Size{little_endian(b, 6, 2), little_endian(b, 8, 2)};
  }
  if (container == "BMP") {  // BITMAPINFOHEADER: i32 width, height (negative: top-down)
    if (b.size() < 26) return std::nullopt;
    const auto w = static_cast<int32_t>(little_endian(b, 18, 4));
    const auto h = static_cast<int32_t>(little_endian(b, 22, 4));
    return Size{std::abs(int64_t{w}), std::abs(int64_t{h})};
  }
  return std::nullopt;
}

// PNG chunks must each fit in the file: stb_image grows its IDAT buffer to a chunk's declared
// length before reading it, so one forged length field of a few-byte file would cost gigabytes.
Status check_png_chunks(std::span<const uint8_t> b) {
  size_t at = 8;  // after the signature
  while (at + 12 <= b.size()) {
    const uint32_t length = big_endian(b, at, 4);
    if (length > b.size() - at - 12)
      return make_error(StatusCode::kInvalidArgument,
                        "corrupt PNG: a chunk at byte {} declares {} bytes, {} remain", at, length,
                        b.size() - at - 12);
    if (std::memcmp(b.data() + at + 4, "IEND", 4) == 0) return Status::ok_status();
    at += 12 + length;
  }
  return make_error(StatusCode::kInvalidArgument, "truncated PNG: it ends before its IEND chunk");
}

}  // namespace

Result<DecodedImage> decode_image(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  if (static_cast<int64_t>(bytes.size()) > limits.max_file_bytes)
    return make_error(StatusCode::kInvalidArgument, "image of {} bytes: the limit is {} bytes",
                      bytes.size(), limits.max_file_bytes);
  const std::string_view container = container_of(bytes);
  if (container.empty())
    return make_error(StatusCode::kInvalidArgument,
                      "not an image: the data is none of PNG, JPEG, GIF or BMP ({} bytes)",
                      bytes.size());
  if (container == "JPEG") return decode_jpeg(bytes, limits);  // docs/vision.md §1
  if (container != "PNG" && container != "GIF" && container != "BMP")
    return make_error(StatusCode::kUnsupported,
                      "{} images are not supported (PNG, JPEG, GIF and BMP are)", container);
  if (bytes.size() > static_cast<size_t>(INT32_MAX))
    return make_error(StatusCode::kInvalidArgument, "image file too large");
  const std::optional<Size> declared = declared_size(bytes, container);
  if (!declared)
    return make_error(StatusCode::kInvalidArgument, "corrupt {} header: cut short", container);
  // The limits hold before anything is decoded.
  const auto [w, h] = *declared;
  if (w > limits.max_side || h > limits.max_side || w * h > limits.max_pixels)
    return make_error(StatusCode::kInvalidArgument,
                      "{} image of {}x{} pixels: the limits are {} pixels a side and {} pixels in "
                      "all",
                      container, w, h, limits.max_side, limits.max_pixels);
  if (w < limits.min_side || h < limits.min_side)
    return make_error(StatusCode::kInvalidArgument,
                      "{} image of {}x{} pixels: each side must be at least {} pixels", container,
                      w, h, limits.min_side);
  if (container == "PNG") DZ_RETURN_IF_ERROR(check_png_chunks(bytes));
  const auto size = static_cast<int>(bytes.size());
  int width = 0;
  int height = 0;
  int channels = 0;
  if (stbi_info_from_memory(bytes.data(), size, &width, &height, &channels) == 0)
    return make_error(StatusCode::kInvalidArgument, "corrupt {} header: {}", container,
                      stbi_failure_reason());
  // PNG colour type (IHDR byte 25) and bit depth (24): RGB stays RGB even with a tRNS chunk.
  const uint8_t png_colour_type = container == "PNG" ? bytes[25] : uint8_t{0};
  const uint8_t png_bit_depth = container == "PNG" ? bytes[24] : uint8_t{0};
  const bool png_rgb = container == "PNG" && png_colour_type == 2;
  const int wanted = (channels == 2 || channels == 4) && !png_rgb ? 4 : 3;
  int got_w = 0;
  int got_h = 0;
  int file_channels = 0;
  stbi_uc* data = stbi_load_from_memory(bytes.data(), size, &got_w, &got_h, &file_channels, wanted);
  if (data == nullptr)
    return make_error(StatusCode::kInvalidArgument, "cannot decode the {} image ({}x{}): {}",
                      container, w, h, stbi_failure_reason());
  // BMP: bits per pixel at 28; 8 or fewer index a palette (Pillow's mode "P", or "1").
  const bool bmp_palette =
      container == "BMP" && bytes.size() >= 30 && little_endian(bytes, 28, 2) <= 8;
  const bool indexed = container == "GIF" || bmp_palette ||
                       (container == "PNG" && png_colour_type == 3) ||
                       (container == "PNG" && png_colour_type == 0 && png_bit_depth == 1);
  DecodedImage image{
      .width = got_w, .height = got_h, .channels = wanted, .pixels = {}, .indexed = indexed};
  image.pixels.assign(data, data + static_cast<size_t>(got_w) * static_cast<size_t>(got_h) *
                                       static_cast<size_t>(wanted));
  stbi_image_free(data);
  if (got_w != width || got_h != height)
    return make_error(StatusCode::kInvalidArgument,
                      "corrupt {} image: the header says {}x{}, the data {}x{}", container, w, h,
                      got_w, got_h);
  return image;
}

}  // namespace dz::formats
