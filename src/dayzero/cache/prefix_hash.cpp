#include "dayzero/cache/prefix_hash.h"

#include <xxhash.h>

#include <cstring>

#include "dayzero/core/check.h"

namespace dz::cache {

namespace {

constexpr std::string_view kSeedTag = "dayzero prefix cache v1";
// Tags of the extra-key fields, so a salt can never be read as a format or an image key.
constexpr uint8_t kSaltTag = 1;
constexpr uint8_t kFormatTag = 2;
constexpr uint8_t kImageTag = 3;

template <typename T>
void append_bytes(std::vector<std::byte>& out, const T* data, size_t count) {
  const size_t at = out.size();
  out.resize(at + count * sizeof(T));
  if (count > 0) std::memcpy(out.data() + at, data, count * sizeof(T));
}

void append_u64(std::vector<std::byte>& out, uint64_t value) {
  // Little-endian regardless of the host, so hashes are portable.
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
}

void append_field(std::vector<std::byte>& out, uint8_t tag, std::span<const std::byte> bytes) {
  out.push_back(static_cast<std::byte>(tag));
  append_u64(out, bytes.size());
  append_bytes(out, bytes.data(), bytes.size());
}

std::span<const std::byte> as_bytes(std::string_view text) {
  return std::as_bytes(std::span<const char>(text.data(), text.size()));
}

BlockHash xxh3_128(std::span<const std::byte> bytes) {
  const XXH128_hash_t hash = XXH3_128bits(bytes.data(), bytes.size());
  return {.lo = hash.low64, .hi = hash.high64};
}

}  // namespace

BlockHash model_seed_hash(std::string_view model_identity) {
  std::vector<std::byte> bytes;
  append_field(bytes, 0, as_bytes(kSeedTag));
  append_field(bytes, 0, as_bytes(model_identity));
  return xxh3_128(bytes);
}

BlockHash hash_block(const BlockHash& parent, std::span<const int32_t> token_ids,
                     std::span<const std::byte> extra_keys) {
  std::vector<std::byte> bytes;
  bytes.reserve(24 + token_ids.size() * 4 + extra_keys.size());
  append_u64(bytes, parent.lo);
  append_u64(bytes, parent.hi);
  append_u64(bytes, token_ids.size());
  for (const int32_t token : token_ids) {
    const auto value = static_cast<uint32_t>(token);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
  }
  append_bytes(bytes, extra_keys.data(), extra_keys.size());
  return xxh3_128(bytes);
}

std::vector<std::byte> block_extra_keys(int64_t block_index, std::string_view cache_salt,
                                        std::string_view cache_format,
                                        std::span<const std::byte> image_keys) {
  std::vector<std::byte> keys;
  append_field(keys, kFormatTag, as_bytes(cache_format));
  if (block_index == 0 && !cache_salt.empty()) append_field(keys, kSaltTag, as_bytes(cache_salt));
  if (!image_keys.empty()) append_field(keys, kImageTag, image_keys);
  return keys;
}

std::vector<std::byte> image_keys(std::span<const ImagePlacement> images, int64_t begin,
                                  int64_t end) {
  std::vector<std::byte> keys;
  for (const ImagePlacement& image : images)
    if (image.offset < end && image.offset + image.num_tokens > begin) {
      append_u64(keys, image.hash.lo);
      append_u64(keys, image.hash.hi);
      append_u64(keys, static_cast<uint64_t>(image.offset));
    }
  return keys;
}

BlockHash image_content_hash(int64_t width, int64_t height, int channels,
                             std::span<const uint8_t> pixels) {
  std::vector<std::byte> bytes;
  append_u64(bytes, static_cast<uint64_t>(width));
  append_u64(bytes, static_cast<uint64_t>(height));
  append_u64(bytes, static_cast<uint64_t>(channels));
  append_bytes(bytes, reinterpret_cast<const std::byte*>(pixels.data()), pixels.size());
  return xxh3_128(bytes);
}

std::vector<BlockHash> hash_full_blocks(const BlockHash& seed, std::span<const int32_t> tokens,
                                        int64_t block_size, std::string_view cache_salt,
                                        std::string_view cache_format) {
  DZ_CHECK(block_size > 0, "block size {}", block_size);
  const auto num_full = static_cast<int64_t>(tokens.size()) / block_size;
  std::vector<BlockHash> hashes;
  hashes.reserve(static_cast<size_t>(num_full));
  BlockHash parent = seed;
  for (int64_t j = 0; j < num_full; ++j) {
    const std::vector<std::byte> extra = block_extra_keys(j, cache_salt, cache_format);
    parent = hash_block(
        parent,
        tokens.subspan(static_cast<size_t>(j * block_size), static_cast<size_t>(block_size)),
        extra);
    hashes.push_back(parent);
  }
  return hashes;
}

}  // namespace dz::cache
