#include "dayzero/formats/jpeg_decode.h"

#include <csetjmp>
#include <cstdio>  // jpeglib.h needs FILE and size_t declared first
#include <cstdlib>
#include <memory>

#include <jpeglib.h>
// after jpeglib.h, which it needs: the message codes (JWRN_JPEG_EOF)
#include <jerror.h>

namespace dz::formats {
namespace {

// libjpeg reports fatal errors by calling error_exit, which must not return: it jumps back to the
// setjmp in decode_into. Nothing between the two has a destructor, so the jump skips no C++
// cleanup.
struct ErrorManager {
  jpeg_error_mgr pub;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool truncated;
  bool too_many_scans;
};

ErrorManager& errors_of(j_common_ptr cinfo) {
  return *reinterpret_cast<ErrorManager*>(cinfo->err);
}

[[noreturn]] void on_error(j_common_ptr cinfo) {
  ErrorManager& errors = errors_of(cinfo);
  (*cinfo->err->format_message)(cinfo, errors.message);
  std::longjmp(errors.jump, 1);
}

// Warnings (level -1) are recoverable corruption; the one that matters is the end of the data
// before the end of the image, which libjpeg papers over with grey.
void on_message(j_common_ptr cinfo, int level) {
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) errors_of(cinfo).truncated = true;
}

void on_progress(j_common_ptr cinfo) {
  auto* decompress = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (decompress->input_scan_number > kMaxJpegScans) {
    errors_of(cinfo).too_many_scans = true;
    std::snprintf(errors_of(cinfo).message, JMSG_LENGTH_MAX, "more than %d scans", kMaxJpegScans);
    std::longjmp(errors_of(cinfo).jump, 1);
  }
}

enum class Outcome { kDecoded, kFailed, kOutsideLimits, kCmyk };

struct Header {
  JDIMENSION width;
  JDIMENSION height;
};

// The libjpeg part, in plain C style so that longjmp is safe: the pixels go to a malloc'd buffer
// the caller frees (also on failure).
Outcome decode_into(const uint8_t* data, unsigned long size, const ImageLimits& limits,
                    ErrorManager& errors, Header& header, unsigned char*& pixels) {
  jpeg_decompress_struct cinfo{};
  jpeg_progress_mgr progress{};
  cinfo.err = jpeg_std_error(&errors.pub);
  errors.pub.error_exit = on_error;
  errors.pub.emit_message = on_message;
  if (setjmp(errors.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    return Outcome::kFailed;
  }
  jpeg_create_decompress(&cinfo);
  progress.progress_monitor = on_progress;
  cinfo.progress = &progress;
  jpeg_mem_src(&cinfo, data, size);
  jpeg_read_header(&cinfo, TRUE);
  header = {cinfo.image_width, cinfo.image_height};
  const int64_t w = cinfo.image_width;
  const int64_t h = cinfo.image_height;
  if (w > limits.max_side || h > limits.max_side || w * h > limits.max_pixels ||
      w < limits.min_side || h < limits.min_side) {
    jpeg_destroy_decompress(&cinfo);
    return Outcome::kOutsideLimits;
  }
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return Outcome::kCmyk;
  }
  cinfo.out_color_space = JCS_RGB;  // greyscale too: libjpeg-turbo replicates the channel
  jpeg_start_decompress(&cinfo);
  const size_t stride = static_cast<size_t>(cinfo.output_width) * 3;
  pixels = static_cast<unsigned char*>(std::malloc(stride * cinfo.output_height));
  if (pixels == nullptr) {
    jpeg_destroy_decompress(&cinfo);
    std::snprintf(errors.message, JMSG_LENGTH_MAX, "out of memory");
    return Outcome::kFailed;
  }
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return Outcome::kDecoded;
}

}  // namespace

Result<DecodedImage> decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits) {
  ErrorManager errors{};
  Header header{};
  unsigned char* pixels = nullptr;
  const Outcome outcome = decode_into(bytes.data(), static_cast<unsigned long>(bytes.size()),
                                      limits, errors, header, pixels);
  std::unique_ptr<unsigned char, decltype(&std::free)> owned(pixels, &std::free);
  const int64_t w = header.width;
  const int64_t h = header.height;
  switch (outcome) {
    case Outcome::kOutsideLimits:
      if (w < limits.min_side || h < limits.min_side)
        return make_error(StatusCode::kInvalidArgument,
                          "JPEG image of {}x{} pixels: each side must be at least {} pixels", w, h,
                          limits.min_side);
      return make_error(StatusCode::kInvalidArgument,
                        "JPEG image of {}x{} pixels: the limits are {} pixels a side and {} "
                        "pixels in all",
                        w, h, limits.max_side, limits.max_pixels);
    case Outcome::kCmyk:
      return make_error(StatusCode::kUnsupported,
                        "CMYK JPEG images are not supported (send RGB or greyscale)");
    case Outcome::kFailed:
      if (errors.too_many_scans)
        return make_error(StatusCode::kInvalidArgument,
                          "JPEG image with {}: a progressive file may have at most {}",
                          errors.message, kMaxJpegScans);
      return make_error(StatusCode::kInvalidArgument, "cannot decode the JPEG image: {}",
                        errors.message);
    case Outcome::kDecoded:
      break;
  }
  if (errors.truncated)
    return make_error(StatusCode::kInvalidArgument,
                      "truncated JPEG: the data ends before the image ({}x{})", w, h);
  DecodedImage image{.width = w, .height = h, .channels = 3, .pixels = {}, .indexed = false};
  image.pixels.assign(owned.get(), owned.get() + static_cast<size_t>(w * h * 3));
  return image;
}

}  // namespace dz::formats
