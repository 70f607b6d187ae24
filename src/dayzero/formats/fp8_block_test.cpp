#include "dayzero/formats/fp8_block.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"

namespace dz::formats {
namespace fp8_block_test {

struct Case {
  Fp8BlockShape shape;
  int64_t expected_scale_rows;
  int64_t expected_scale_cols;
};

TEST(Fp8Block, DequantizesPartialEdgeTilesWithTheirOwnScale) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> exponent(-20, 5);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  const Case cases[] = {
      {{.num_rows = 320, .num_cols = 256}, 3, 2},  // last row tile holds 64 rows
      {{.num_rows = 130, .num_cols = 129}, 2, 2},  // 2-row and 1-column edge tiles
      {{.num_rows = 1, .num_cols = 1}, 1, 1},
      {{.num_rows = 7, .num_cols = 10, .block_rows = 3, .block_cols = 4}, 3, 3},
  };
  for (const Case& c : cases) {
    const Fp8BlockShape& shape = c.shape;
    ASSERT_EQ(shape.num_scale_rows(), c.expected_scale_rows);
    ASSERT_EQ(shape.num_scale_cols(), c.expected_scale_cols);
    std::vector<uint8_t> codes(shape.num_rows * shape.num_cols);
    for (auto& code : codes) {
      do code = static_cast<uint8_t>(byte(rng));
      while ((code & 0x7F) == 0x7F);
    }
    // Powers of two and arbitrary values: both occur as weight_scale_inv.
    std::vector<float> scale_inv(shape.num_scale_rows() * shape.num_scale_cols());
    for (size_t i = 0; i < scale_inv.size(); ++i)
      scale_inv[i] = std::ldexp(i % 2 ? mantissa(rng) : 1.0f, exponent(rng));
    std::vector<float> out(codes.size());
    dequantize_fp8_block(codes, scale_inv, shape, out);
    for (int64_t i = 0; i < shape.num_rows; ++i) {
      for (int64_t j = 0; j < shape.num_cols; ++j) {
        const int64_t flat = i * shape.num_cols + j;
        const float scale =
            scale_inv[(i / shape.block_rows) * shape.num_scale_cols() + j / shape.block_cols];
        // One FP32 product: the FP64 product of the two FP32 factors, rounded once.
        const auto expected =
            static_cast<float>(static_cast<double>(decode_e4m3(codes[flat])) * scale);
        ASSERT_EQ(std::bit_cast<uint32_t>(out[flat]), std::bit_cast<uint32_t>(expected))
            << i << "," << j;
      }
    }
  }
}

TEST(Fp8Block, DeepSeekKvAProjShapeHasFiveByFiftySixScales) {
  const Fp8BlockShape shape{.num_rows = 576, .num_cols = 7168};
  EXPECT_EQ(shape.num_scale_rows(), 5);
  EXPECT_EQ(shape.num_scale_cols(), 56);
}

}  // namespace fp8_block_test
}  // namespace dz::formats
