#include "dayzero/formats/image_decode.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#define STBI_WRITE_NO_STDIO
#include <stb/stb_image_write.h>

namespace dz::formats {
namespace image_decode_test {

std::vector<uint8_t> random_pixels(int w, int h, int c, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> p(static_cast<size_t>(w * h * c));
  for (uint8_t& v : p) v = static_cast<uint8_t>(byte(rng));
  return p;
}

void append(void* context, void* data, int size) {
  auto* out = static_cast<std::vector<uint8_t>*>(context);
  const auto* bytes = static_cast<const uint8_t*>(data);
  out->insert(out->end(), bytes, bytes + size);
}

std::vector<uint8_t> png(int w, int h, int c, const std::vector<uint8_t>& pixels) {
  std::vector<uint8_t> out;
  EXPECT_NE(stbi_write_png_to_func(append, &out, w, h, c, pixels.data(), w * c), 0);
  return out;
}

std::string error_of(const std::vector<uint8_t>& bytes, const ImageLimits& limits = {}) {
  Result<DecodedImage> r = decode_image(bytes, limits);
  return r.ok() ? std::string("(decoded)") : r.status().message();
}

TEST(ImageDecode, LosslessFormatsRoundTripAndGreyBecomesRgb) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (int c : {1, 2, 3, 4}) {
    const std::vector<uint8_t> pixels = random_pixels(37, 19, c, seed + static_cast<unsigned>(c));
    Result<DecodedImage> image = decode_image(png(37, 19, c, pixels));
    ASSERT_TRUE(image.ok()) << image.status().to_string();
    EXPECT_EQ(image->width, 37);
    EXPECT_EQ(image->height, 19);
    ASSERT_EQ(image->channels, c == 2 || c == 4 ? 4 : 3);
    for (size_t p = 0; p < 37 * 19; ++p)
      for (int ch = 0; ch < image->channels; ++ch) {
        // Grey fills R, G and B; grey + alpha keeps its alpha last.
        const int from = c >= 3 ? ch : (ch == 3 ? 1 : 0);
        ASSERT_EQ(image->pixels[p * static_cast<size_t>(image->channels) + static_cast<size_t>(ch)],
                  pixels[p * static_cast<size_t>(c) + static_cast<size_t>(from)])
            << "c " << c << " pixel " << p << " channel " << ch;
      }
  }
  std::vector<uint8_t> bmp;
  const std::vector<uint8_t> rgb = random_pixels(20, 15, 3, seed);
  ASSERT_NE(stbi_write_bmp_to_func(append, &bmp, 20, 15, 3, rgb.data()), 0);
  Result<DecodedImage> image = decode_image(bmp);
  ASSERT_TRUE(image.ok()) << image.status().to_string();
  EXPECT_EQ(image->pixels, rgb);
}

TEST(ImageDecode, BadInputsNameWhatIsWrong) {
  const std::vector<uint8_t> good = png(40, 30, 3, random_pixels(40, 30, 3, 7));
  EXPECT_NE(error_of({}).find("not an image"), std::string::npos);
  const std::string text = "{\"hello\": 1}";
  EXPECT_NE(error_of(std::vector<uint8_t>(text.begin(), text.end())).find("not an image"),
            std::string::npos);
  std::vector<uint8_t> webp = {'R', 'I', 'F', 'F', 0, 0, 0, 0, 'W', 'E', 'B', 'P', 'V', 'P', '8'};
  EXPECT_NE(error_of(webp).find("WebP images are not supported"), std::string::npos);
  // Truncated: the header survives, the pixel data does not.
  std::vector<uint8_t> truncated(good.begin(), good.begin() + static_cast<long>(good.size() / 2));
  EXPECT_NE(error_of(truncated).find("corrupt PNG: a chunk at byte 33 declares"), std::string::npos)
      << error_of(truncated);
  std::vector<uint8_t> no_end(good.begin(), good.end() - 12);  // IEND cut off
  EXPECT_NE(error_of(no_end).find("truncated PNG"), std::string::npos) << error_of(no_end);
  // Whole chunks, corrupt compressed data: the decoder's own reason.
  std::vector<uint8_t> scrambled = good;
  for (size_t i = 41 + 2; i < 41 + 40; ++i) scrambled[i] ^= 0x5a;  // inside IDAT's zlib stream
  EXPECT_NE(error_of(scrambled).find("cannot decode the PNG image"), std::string::npos)
      << error_of(scrambled);
  std::vector<uint8_t> header_only(good.begin(), good.begin() + 10);
  EXPECT_NE(error_of(header_only).find("corrupt PNG header: cut short"), std::string::npos)
      << error_of(header_only);
  // Too small, and too large by the file size.
  EXPECT_NE(error_of(png(1, 1, 3, {1, 2, 3})).find("at least 14 pixels"), std::string::npos);
  EXPECT_NE(error_of(good, {.max_file_bytes = 16}).find("the limit is 16 bytes"),
            std::string::npos);
}

TEST(ImageDecode, AForgedChunkLengthIsRefusedBeforeTheDecoderAllocatesIt) {
  // The fuzzer's find: an IDAT chunk declaring 2 GB in a file of a few hundred bytes made the
  // decoder grow its buffer to 2 GB first.
  std::vector<uint8_t> forged = png(40, 30, 3, random_pixels(40, 30, 3, 11));
  const size_t idat = 33;  // the chunk after IHDR (8 + 25)
  ASSERT_EQ(std::string(forged.begin() + idat + 4, forged.begin() + idat + 8), "IDAT");
  for (int i = 0; i < 4; ++i) forged[idat + static_cast<size_t>(i)] = i == 0 ? 0x7f : 0xff;
  const std::string error = error_of(forged);
  EXPECT_NE(error.find("declares 2147483647 bytes"), std::string::npos) << error;
}

TEST(ImageDecode, HugeDeclaredSizesAreRefusedBeforeDecoding) {
  // A PNG whose header declares 20000 x 20000 (1.2 GB of RGB) with almost no data: the limit is
  // checked on the header, so this returns at once without allocating the image.
  std::vector<uint8_t> bomb = png(40, 30, 3, random_pixels(40, 30, 3, 9));
  auto put32 = [&](size_t at, uint32_t v) {
    for (int i = 0; i < 4; ++i)
      bomb[at + static_cast<size_t>(i)] = static_cast<uint8_t>(v >> (24 - 8 * i));
  };
  put32(16, 20000);  // IHDR width, then height
  put32(20, 20000);
  const std::string error = error_of(bomb);
  EXPECT_NE(error.find("20000x20000"), std::string::npos) << error;
  EXPECT_NE(error.find("the limits are 16384 pixels a side"), std::string::npos) << error;
  put32(16, 12000);  // each side allowed, the total not
  put32(20, 12000);
  EXPECT_NE(error_of(bomb).find("12000x12000"), std::string::npos) << error_of(bomb);
}

}  // namespace image_decode_test
}  // namespace dz::formats
