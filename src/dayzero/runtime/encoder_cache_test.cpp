#include "dayzero/runtime/encoder_cache.h"

#include <gtest/gtest.h>

namespace dz::runtime {
namespace encoder_cache_test {

ImageEmbeddings rows(size_t floats, float value) {
  return std::make_shared<const std::vector<float>>(floats, value);
}

TEST(EncoderCache, KeepsTheMostRecentlyUsedWithinTheBudget) {
  EncoderCache cache(3 * 100 * sizeof(float));
  const cache::BlockHash a{1, 2}, b{3, 4}, c{5, 6}, d{7, 8};
  const ImageEmbeddings held = rows(100, 2);
  cache.insert(a, rows(100, 1));
  cache.insert(b, held);
  cache.insert(c, rows(100, 3));
  EXPECT_EQ(cache.num_entries(), 3);
  ASSERT_NE(cache.find(a), nullptr);  // a is now the most recent: b goes next
  cache.insert(d, rows(100, 4));
  EXPECT_EQ(cache.find(b), nullptr);
  EXPECT_EQ((*held)[0], 2.0f);  // still alive for whoever holds it
  EXPECT_NE(cache.find(a), nullptr);
  EXPECT_NE(cache.find(c), nullptr);
  EXPECT_EQ(cache.bytes(), static_cast<int64_t>(3 * 100 * sizeof(float)));
  cache.insert(a, rows(301, 5));  // larger than the budget: dropped, and the old a with it
  EXPECT_EQ(cache.find(a), nullptr);
  EXPECT_EQ(cache.num_entries(), 2);
}

}  // namespace encoder_cache_test
}  // namespace dz::runtime
