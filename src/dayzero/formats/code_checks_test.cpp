#include "dayzero/formats/code_checks.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace dz::formats {
namespace code_checks_test {

TEST(CodeChecks, RefusesE8m0NanScaleNamingTheFirstIndex) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, 254);
  std::vector<uint8_t> scales(2 * 3 * 4);
  for (auto& s : scales) s = static_cast<uint8_t>(code(rng));
  EXPECT_TRUE(check_e8m0_scales(scales, Shape{2, 3, 4}).ok());
  scales[19] = 0xFF;  // [1, 1, 3]
  scales[22] = 0xFF;
  const Status status = check_e8m0_scales(scales, Shape{2, 3, 4});
  EXPECT_EQ(status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(status.message(),
            "E8M0 scale code 0xFF (NaN) at index [1, 1, 3] (element 19 of [2, 3, 4])");
}

TEST(CodeChecks, RefusesE4m3NanCodesOfEitherSign) {
  std::vector<uint8_t> codes(6 * 5, 0x7E);
  codes[3] = 0x80;
  EXPECT_TRUE(check_e4m3_codes(codes, Shape{6, 5}).ok());
  codes[17] = 0xFF;
  codes[29] = 0x7F;
  Status status = check_e4m3_codes(codes, Shape{6, 5});
  EXPECT_EQ(status.code(), StatusCode::kCorrupt);
  EXPECT_EQ(status.message(), "E4M3 NaN code 0xFF at index [3, 2] (element 17 of [6, 5])");
  codes[17] = 0x01;
  status = check_e4m3_codes(codes, Shape{6, 5});
  EXPECT_EQ(status.message(), "E4M3 NaN code 0x7F at index [5, 4] (element 29 of [6, 5])");
}

TEST(CodeChecks, RefusesASizeThatDoesNotMatchTheShape) {
  const std::vector<uint8_t> codes(7, 1);
  const Status status = check_e4m3_codes(codes, Shape{2, 4});
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "E4M3 codes: 7 bytes for shape [2, 4] (8 elements)");
}

}  // namespace code_checks_test
}  // namespace dz::formats
