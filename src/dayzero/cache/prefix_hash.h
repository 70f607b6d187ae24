#pragma once
// Hash chain of the prefix cache (docs/serving.md §1.4): h_j = H(h_{j-1}, token ids of block j,
// extra keys), h_{-1} a per-model seed, H = XXH3-128. Extra keys are opaque bytes: the request's
// cache salt on the first block only (isolates tenants), the cache format (dtype, block size) on
// every block, and content hashes of images whose placeholders fall in the block.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace dz::cache {

// The one definition of the 128-bit chained hash of a full KV block (state_pool.h keys
// checkpoints by it too).
struct BlockHash {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const BlockHash&, const BlockHash&) = default;
};

struct BlockHashHasher {
  // The hash is already uniform; folding the halves is enough for a hash table.
  size_t operator()(const BlockHash& h) const { return static_cast<size_t>(h.lo ^ (h.hi * 31)); }
};

// An image in a sequence (docs/vision.md §4): its placeholders fill [offset, offset +
// num_tokens); `hash` is its content hash.
struct ImagePlacement {
  int64_t offset = 0;
  int64_t num_tokens = 0;
  BlockHash hash;
};

// The image keys of the block of positions [begin, end): the hash and offset of every image
// whose placeholders fall in it, so that two prompts with the same placeholder ids but different
// images (or the same image elsewhere) never share the block.
std::vector<std::byte> image_keys(std::span<const ImagePlacement> images, int64_t begin,
                                  int64_t end);

// The content hash of an image's decoded pixels (XXH3-128 of its size, channels and bytes).
BlockHash image_content_hash(int64_t width, int64_t height, int channels,
                             std::span<const uint8_t> pixels);

// h_{-1} of one model: the hash of a version tag and model_identity (e.g. the checkpoint's
// config hash), so two models never share cache entries.
BlockHash model_seed_hash(std::string_view model_identity);

// One link of the chain. The encoding is unambiguous: the parent, the token count, the token ids
// (little-endian int32), then extra_keys.
BlockHash hash_block(const BlockHash& parent, std::span<const int32_t> token_ids,
                     std::span<const std::byte> extra_keys);

// The extra keys of block `block_index` of a request: the cache format on every block, the cache
// salt on block 0 (an empty salt adds nothing), then image_keys; each field tagged and
// length-prefixed, so no field can be read as another.
std::vector<std::byte> block_extra_keys(int64_t block_index, std::string_view cache_salt,
                                        std::string_view cache_format,
                                        std::span<const std::byte> image_keys = {});

// Hashes of the full blocks of tokens (the partial tail is not hashed), chained from seed, with
// block_extra_keys(j, cache_salt, cache_format) as each block's extra keys. block_size > 0.
std::vector<BlockHash> hash_full_blocks(const BlockHash& seed, std::span<const int32_t> tokens,
                                        int64_t block_size, std::string_view cache_salt,
                                        std::string_view cache_format);

}  // namespace dz::cache
