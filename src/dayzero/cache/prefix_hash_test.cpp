#include "dayzero/cache/prefix_hash.h"

#include <gtest/gtest.h>

#include <random>
#include <set>
#include <utility>

namespace dz::cache {
namespace prefix_hash_test {

std::vector<int32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, 150000);
  std::vector<int32_t> tokens(n);
  for (int32_t& t : tokens) t = token(rng);
  return tokens;
}

TEST(PrefixHash, ChainDependsOnEveryInput) {
  const BlockHash seed = model_seed_hash("model-a");
  const std::vector<int32_t> tokens = random_tokens(64, 1);
  const std::vector<std::byte> extra = block_extra_keys(0, "", "fp8/64");
  const BlockHash h = hash_block(seed, tokens, extra);
  EXPECT_EQ(h, hash_block(seed, tokens, extra));  // deterministic
  EXPECT_NE(h, hash_block(model_seed_hash("model-b"), tokens, extra));
  std::vector<int32_t> changed = tokens;
  changed[37] += 1;
  EXPECT_NE(h, hash_block(seed, changed, extra));
  EXPECT_NE(h, hash_block(seed, tokens, block_extra_keys(0, "tenant", "fp8/64")));
  EXPECT_NE(h, hash_block(seed, tokens, block_extra_keys(0, "", "bf16/64")));
  EXPECT_NE(h, hash_block(seed, std::span<const int32_t>(tokens).first(63), extra));
  EXPECT_NE(h.lo, h.hi);  // both words are hash output, not a zero pad
}

TEST(PrefixHash, ExtraKeyFieldsCannotBeConfused) {
  // The salt only enters block 0; the same bytes as a salt, a format or an image key differ.
  EXPECT_EQ(block_extra_keys(1, "tenant", "f"), block_extra_keys(1, "", "f"));
  EXPECT_NE(block_extra_keys(0, "tenant", "f"), block_extra_keys(0, "", "f"));
  EXPECT_NE(block_extra_keys(0, "ab", ""), block_extra_keys(0, "", "ab"));
  EXPECT_NE(block_extra_keys(0, "a", "b"), block_extra_keys(0, "", "ab"));
  const std::string image = "ab";
  EXPECT_NE(block_extra_keys(0, "", "", std::as_bytes(std::span(image))),
            block_extra_keys(0, "ab", ""));
}

TEST(PrefixHash, FullBlocksChainAndSharePrefixes) {
  const BlockHash seed = model_seed_hash("m");
  std::vector<int32_t> a = random_tokens(70, 2);  // 4 full blocks of 16, tail of 6
  const std::vector<BlockHash> ha = hash_full_blocks(seed, a, 16, "", "bf16/16");
  ASSERT_EQ(ha.size(), 4u);
  // Recomputed link by link.
  BlockHash parent = seed;
  for (size_t j = 0; j < ha.size(); ++j) {
    parent = hash_block(parent, std::span<const int32_t>(a).subspan(j * 16, 16),
                        block_extra_keys(static_cast<int64_t>(j), "", "bf16/16"));
    EXPECT_EQ(ha[j], parent) << j;
  }
  // A prompt differing in block 2 shares the first two hashes only; the tail never matters.
  std::vector<int32_t> b = a;
  b[40] ^= 1;
  b[69] ^= 1;
  const std::vector<BlockHash> hb = hash_full_blocks(seed, b, 16, "", "bf16/16");
  EXPECT_EQ(hb[0], ha[0]);
  EXPECT_EQ(hb[1], ha[1]);
  EXPECT_NE(hb[2], ha[2]);
  EXPECT_NE(hb[3], ha[3]);  // chained: a change propagates
  std::vector<int32_t> c = a;
  c[69] ^= 1;
  EXPECT_EQ(hash_full_blocks(seed, c, 16, "", "bf16/16"), ha);
  // A salt isolates tenants on every block, through the chain.
  const std::vector<BlockHash> salted = hash_full_blocks(seed, a, 16, "t1", "bf16/16");
  for (size_t j = 0; j < ha.size(); ++j) EXPECT_NE(salted[j], ha[j]) << j;
  EXPECT_TRUE(hash_full_blocks(seed, std::span<const int32_t>(a).first(15), 16, "", "").empty());
}

TEST(PrefixHash, NoCollisionsAmongManyBlocks) {
  std::set<std::pair<uint64_t, uint64_t>> seen;
  const BlockHash seed = model_seed_hash("m");
  for (uint32_t s = 0; s < 200; ++s)
    for (const BlockHash& h : hash_full_blocks(seed, random_tokens(64, s), 4, "", "x"))
      EXPECT_TRUE(seen.emplace(h.lo, h.hi).second);
  EXPECT_EQ(seen.size(), 200u * 16u);
}

}  // namespace prefix_hash_test
}  // namespace dz::cache
