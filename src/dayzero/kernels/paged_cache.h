#pragma once
// Byte layouts of the paged attention caches, docs/formats.md §5. A pool is one contiguous region
// of num_blocks · block_size token records; a slot is block_id · block_size + offset. Kernels read
// and write through these functions only, so the layouts live in one place.

#include <cstddef>
#include <cstdint>
#include <span>

namespace dz::kernels {

enum class KvCacheDtype { kFp8, kBf16 };

// One MLA latent record per token (docs/formats.md §5.2–5.3), generalised from DeepSeek's 512 + 64:
// fp8:  [latent_dim E4M3 codes][latent_dim/128 FP32 scales][rope_dim BF16]  (656 B for 512 + 64)
// bf16: [latent_dim BF16][rope_dim BF16]                                     (1152 B for 512 + 64)
struct MlaCacheLayout {
  int64_t latent_dim = 512;  // kv_lora_rank; a multiple of 128 for fp8
  int64_t rope_dim = 64;     // qk_rope_head_dim
  KvCacheDtype dtype = KvCacheDtype::kFp8;

  int64_t record_bytes() const {
    return dtype == KvCacheDtype::kFp8 ? latent_dim + latent_dim / 128 * 4 + rope_dim * 2
                                       : (latent_dim + rope_dim) * 2;
  }
};

// Writes token records. c_kv [latent_dim] is the normalized latent (BF16-valued FP32) and k_pe
// [rope_dim] the rotated rope part; fp8 quantizes c_kv in tiles of 128 with act_quant (ue8m0).
void write_mla_record(const MlaCacheLayout& layout, std::byte* pool, int64_t slot,
                      const float* c_kv, const float* k_pe);
// Reads one record back as FP32: latent [latent_dim] then rope [rope_dim] into out
// [latent_dim + rope_dim]. decode(code) · scale is exact, so this is the dequantized value.
void read_mla_record(const MlaCacheLayout& layout, const std::byte* pool, int64_t slot, float* out);

// Indexer key cache (docs/formats.md §5.4): block-planar, per block all keys (head_dim E4M3 codes
// each, token-major), then all FP32 scales. key_dim is index_head_dim (128).
struct IndexCacheLayout {
  int64_t key_dim = 128;
  int64_t block_size = 64;

  int64_t block_bytes() const { return block_size * (key_dim + 4); }
  int64_t key_offset_bytes(int64_t slot) const {
    return slot / block_size * block_bytes() + slot % block_size * key_dim;
  }
  int64_t scale_offset_bytes(int64_t slot) const {
    return slot / block_size * block_bytes() + block_size * key_dim + slot % block_size * 4;
  }
};

// Stores a quantized key: codes [key_dim] E4M3 and its FP32 scale.
void write_index_key(const IndexCacheLayout& layout, std::byte* pool, int64_t slot,
                     std::span<const uint8_t> codes, float scale);

}  // namespace dz::kernels
