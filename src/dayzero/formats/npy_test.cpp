#include "dayzero/formats/npy.h"

#include <random>

#include <gtest/gtest.h>

namespace dz::formats {
namespace npy_test {

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

TEST(Npy, HeaderIsVersion1AlignedTo64) {
  std::vector<float> values = random_values(6, 1);
  std::string bytes = encode_npy_f32(values, Shape{2, 3});
  ASSERT_EQ(bytes.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  size_t header_bytes = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
  EXPECT_EQ((10 + header_bytes) % 64, 0u);
  std::string header = bytes.substr(10, header_bytes);
  EXPECT_TRUE(header.starts_with("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"))
      << header;
  EXPECT_EQ(header.back(), '\n');
  EXPECT_EQ(bytes.size(), 10 + header_bytes + 6 * 4);
}

TEST(Npy, RoundTripsShapesIncludingRank1AndEmpty) {
  for (const Shape& shape : {Shape{1}, Shape{7}, Shape{3, 5}, Shape{2, 3, 4}, Shape{0, 4}}) {
    std::vector<float> values = random_values(static_cast<size_t>(shape.num_elems()), 2);
    Result<NpyF32> back = decode_npy_f32(encode_npy_f32(values, shape));
    ASSERT_TRUE(back.ok()) << back.status().to_string();
    EXPECT_EQ(back->shape, shape) << shape.to_string();
    EXPECT_EQ(back->data, values);
  }
}

TEST(Npy, Rank1ShapeHasTrailingComma) {
  std::string bytes = encode_npy_f32(random_values(4, 3), Shape{4});
  EXPECT_NE(bytes.find("'shape': (4,)"), std::string::npos);
}

TEST(Npy, RefusesWrongDtypeAndTruncation) {
  std::string bytes = encode_npy_f32(random_values(6, 4), Shape{2, 3});
  std::string f8 = bytes;
  f8.replace(f8.find("<f4"), 3, "<f8");
  EXPECT_EQ(decode_npy_f32(f8).status().message(), "npy: descr is not '<f4'");
  EXPECT_EQ(decode_npy_f32(bytes.substr(0, bytes.size() - 1)).status().message(),
            "npy: 23 data bytes for shape [2, 3]");
  EXPECT_EQ(decode_npy_f32("hello").status().message(), "npy: missing the \\x93NUMPY magic");
}

TEST(Npy, WriteReportsThePath) {
  Status status = write_npy_f32("/nonexistent-dir/x.npy", random_values(2, 5), Shape{2});
  EXPECT_EQ(status.code(), StatusCode::kIo);
  EXPECT_EQ(status.message(), "/nonexistent-dir/x.npy: cannot open for writing");
}

}  // namespace npy_test
}  // namespace dz::formats
