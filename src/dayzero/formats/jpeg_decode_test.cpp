#include "dayzero/formats/jpeg_decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <jpeglib.h>

namespace dz::formats {
namespace jpeg_decode_test {

// A smooth random picture (JPEG keeps smooth content nearly intact): a gradient per channel plus
// low noise.
std::vector<uint8_t> smooth_pixels(int w, int h, int c, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> noise(-3, 3);
  std::vector<uint8_t> p(static_cast<size_t>(w * h * c));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int ch = 0; ch < c; ++ch) {
        const int v = 40 + (x * 150 / w) + (ch * 30) + (y * 20 / h) + noise(rng);
        p[static_cast<size_t>((y * w + x) * c + ch)] = static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
  return p;
}

struct Encoded {
  unsigned char* data = nullptr;
  unsigned long size = 0;
  ~Encoded() { std::free(data); }
  std::vector<uint8_t> bytes() const { return {data, data + size}; }
};

// libjpeg's own encoder (its errors end the test program, which is fine for a test).
std::vector<uint8_t> jpeg(int w, int h, int c, const std::vector<uint8_t>& pixels,
                          bool progressive = false, J_COLOR_SPACE space = JCS_UNKNOWN) {
  jpeg_compress_struct cinfo{};
  jpeg_error_mgr errors{};
  cinfo.err = jpeg_std_error(&errors);
  jpeg_create_compress(&cinfo);
  Encoded out;
  jpeg_mem_dest(&cinfo, &out.data, &out.size);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : (c == 4 ? JCS_CMYK : JCS_RGB);
  jpeg_set_defaults(&cinfo);
  if (space != JCS_UNKNOWN) jpeg_set_colorspace(&cinfo, space);
  jpeg_set_quality(&cinfo, 95, TRUE);
  if (progressive) jpeg_simple_progression(&cinfo);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * static_cast<size_t>(w * c);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return out.bytes();
}

std::string error_of(const std::vector<uint8_t>& bytes, const ImageLimits& limits = {}) {
  Result<DecodedImage> r = decode_image(bytes, limits);
  return r.ok() ? std::string("(decoded)") : r.status().message();
}

// Quality 95 on a smooth picture: the mean error of a pixel value stays within ~1 step, a single
// value within a few (chroma subsampling blurs the colour of the noise).
void expect_close(const DecodedImage& image, const std::vector<uint8_t>& pixels, int c) {
  double total = 0;
  int worst = 0;
  for (size_t p = 0; p < static_cast<size_t>(image.width * image.height); ++p)
    for (size_t ch = 0; ch < 3; ++ch) {
      const int want = pixels[p * static_cast<size_t>(c) + (c == 1 ? 0 : ch)];
      const int diff = std::abs(image.pixels[p * 3 + ch] - want);
      total += diff;
      worst = std::max(worst, diff);
    }
  EXPECT_LT(total / static_cast<double>(image.pixels.size()), 2.0);
  EXPECT_LE(worst, 16);
}

TEST(JpegDecode, ColourGreyAndProgressiveFilesDecodeToRgb) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int c : {3, 1})
    for (bool progressive : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "channels " << c << " progressive " << progressive);
      const std::vector<uint8_t> pixels = smooth_pixels(61, 37, c, seed);
      Result<DecodedImage> image = decode_image(jpeg(61, 37, c, pixels, progressive));
      ASSERT_TRUE(image.ok()) << image.status().to_string();
      EXPECT_EQ(image->width, 61);
      EXPECT_EQ(image->height, 37);
      ASSERT_EQ(image->channels, 3);
      EXPECT_FALSE(image->indexed);
      ASSERT_EQ(image->pixels.size(), size_t{61 * 37 * 3});
      expect_close(*image, pixels, c);
      if (c == 1) {  // grey: R = G = B exactly
        for (size_t p = 0; p < 61 * 37; ++p) {
          ASSERT_TRUE(image->pixels[p * 3] == image->pixels[p * 3 + 1] &&
                      image->pixels[p * 3] == image->pixels[p * 3 + 2]);
        }
      }
    }
}

TEST(JpegDecode, BadFilesNameWhatIsWrong) {
  const std::vector<uint8_t> good = jpeg(64, 48, 3, smooth_pixels(64, 48, 3, 5));
  // Cut in the middle of the entropy-coded data: libjpeg would pad with grey; refused here.
  std::vector<uint8_t> truncated(good.begin(), good.end() - 100);
  EXPECT_NE(error_of(truncated).find("truncated JPEG"), std::string::npos) << error_of(truncated);
  // Cut inside the header.
  std::vector<uint8_t> header_cut(good.begin(), good.begin() + 40);
  EXPECT_NE(error_of(header_cut).find("cannot decode the JPEG image"), std::string::npos)
      << error_of(header_cut);
  // The headers after the first marker scrambled: libjpeg's reason comes back.
  std::vector<uint8_t> scrambled = good;
  for (size_t i = 20; i < 200; ++i) scrambled[i] ^= 0x33;
  EXPECT_NE(error_of(scrambled).find("cannot decode the JPEG image"), std::string::npos)
      << error_of(scrambled);
  EXPECT_NE(error_of(jpeg(10, 40, 3, smooth_pixels(10, 40, 3, 6))).find("at least 14 pixels"),
            std::string::npos);
  const std::string cmyk = error_of(jpeg(32, 32, 4, smooth_pixels(32, 32, 4, 7)));
  EXPECT_NE(cmyk.find("CMYK JPEG images are not supported"), std::string::npos) << cmyk;
}

// Finds the start-of-frame segment (FFC0 baseline, FFC2 progressive) and returns the offset of
// its height field.
size_t sof_size_field(const std::vector<uint8_t>& b) {
  for (size_t i = 2; i + 9 < b.size(); ++i)
    if (b[i] == 0xff && (b[i + 1] == 0xc0 || b[i + 1] == 0xc2)) return i + 5;
  ADD_FAILURE() << "no SOF marker";
  return 0;
}

TEST(JpegDecode, HugeDeclaredSizesAreRefusedBeforeDecoding) {
  std::vector<uint8_t> bomb = jpeg(40, 30, 3, smooth_pixels(40, 30, 3, 8));
  const size_t at = sof_size_field(bomb);
  for (const auto& [h, w] : {std::pair{20000, 20000}, std::pair{12000, 12000}}) {
    bomb[at] = static_cast<uint8_t>(h >> 8);  // big-endian height, then width
    bomb[at + 1] = static_cast<uint8_t>(h);
    bomb[at + 2] = static_cast<uint8_t>(w >> 8);
    bomb[at + 3] = static_cast<uint8_t>(w);
    const std::string error = error_of(bomb);
    EXPECT_NE(error.find(std::to_string(w) + "x" + std::to_string(h)), std::string::npos) << error;
    EXPECT_NE(error.find("the limits are"), std::string::npos) << error;
  }
}

TEST(JpegDecode, AProgressiveFileWithTooManyScansIsRefused) {
  // A progressive file whose last scan is repeated 600 times: libjpeg only warns about the
  // repeated refinement and would run over the whole coefficient buffer for each one.
  const std::vector<uint8_t> file = jpeg(48, 48, 3, smooth_pixels(48, 48, 3, 9), true);
  size_t last_sos = 0;
  for (size_t i = 2; i + 1 < file.size(); ++i)
    if (file[i] == 0xff && file[i + 1] == 0xda) last_sos = i;
  ASSERT_GT(last_sos, 0u);
  const std::vector<uint8_t> scan(file.begin() + static_cast<long>(last_sos), file.end() - 2);
  std::vector<uint8_t> many(file.begin(), file.end() - 2);  // without EOI
  for (int i = 0; i < 600; ++i) many.insert(many.end(), scan.begin(), scan.end());
  many.push_back(0xff);
  many.push_back(0xd9);
  const std::string error = error_of(many);
  EXPECT_NE(error.find("more than 500 scans"), std::string::npos) << error;
  // The file as written decodes.
  EXPECT_EQ(error_of(file), "(decoded)");
}

}  // namespace jpeg_decode_test
}  // namespace dz::formats
