#include "dayzero/core/base64.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

namespace dz {
namespace base64_test {

TEST(Base64, KnownVectorsAndStrictness) {
  // RFC 4648 §10.
  EXPECT_EQ(encode_base64(""), "");
  EXPECT_EQ(encode_base64("f"), "Zg==");
  EXPECT_EQ(encode_base64("fo"), "Zm8=");
  EXPECT_EQ(encode_base64("foo"), "Zm9v");
  EXPECT_EQ(encode_base64("foobar"), "Zm9vYmFy");
  EXPECT_EQ(decode_base64("Zm9vYg=="), "foob");
  EXPECT_EQ(decode_base64("Zm9vYmE="), "fooba");
  for (const char* bad : {"", "Zg=", "Zm9v YmFy", "Zm9vYmF=", "Zh==", "Z===", "Zm9v\n", "Zg=a"})
    EXPECT_FALSE(decode_base64(bad).has_value()) << '"' << bad << '"';
}

TEST(Base64, RandomBytesRoundTrip) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  for (int n = 1; n < 200; ++n) {
    std::string bytes(static_cast<size_t>(n), '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    const std::string text = encode_base64(bytes);
    ASSERT_EQ(text.size() % 4, 0u);
    ASSERT_EQ(decode_base64(text), bytes) << n;
  }
}

}  // namespace base64_test
}  // namespace dz
