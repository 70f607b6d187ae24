#include "dayzero/runtime/philox.h"

#include <gtest/gtest.h>

namespace dz::runtime {
namespace philox_test {

// Known answers from Random123's kat_vectors (counter[4] key[2] -> output[4]).
TEST(Philox, MatchesRandom123KnownAnswers) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(
      philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}),
      (PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}));
  EXPECT_EQ(
      philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}),
      (PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

TEST(Philox, UniformIsInUnitIntervalAndDependsOnEveryKeyPart) {
  const double base = philox_uniform(7, 0, 3, RandomPurpose::kSampleToken);
  EXPECT_GE(base, 0.0);
  EXPECT_LT(base, 1.0);
  EXPECT_EQ(base, philox_uniform(7, 0, 3, RandomPurpose::kSampleToken));
  EXPECT_NE(base, philox_uniform(8, 0, 3, RandomPurpose::kSampleToken));
  EXPECT_NE(base, philox_uniform(7, 1, 3, RandomPurpose::kSampleToken));
  EXPECT_NE(base, philox_uniform(7, 0, 4, RandomPurpose::kSampleToken));
  EXPECT_NE(base, philox_uniform(7, 0, 3 + (int64_t{1} << 32), RandomPurpose::kSampleToken));
  EXPECT_NE(base, philox_uniform(7 + (uint64_t{1} << 32), 0, 3, RandomPurpose::kSampleToken));
  EXPECT_NE(base, philox_uniform(7, 0, 3, static_cast<RandomPurpose>(1)));
  // Mean of many uniforms: 0.5 with standard error 1/sqrt(12 * 20000) = 0.002; 0.01 is 5 sigma.
  double sum = 0;
  for (int64_t p = 0; p < 20000; ++p) sum += philox_uniform(1, 0, p, RandomPurpose::kSampleToken);
  EXPECT_NEAR(sum / 20000, 0.5, 0.01);
}

}  // namespace philox_test
}  // namespace dz::runtime
