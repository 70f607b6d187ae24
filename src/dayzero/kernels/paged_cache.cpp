#include "dayzero/kernels/paged_cache.h"

#include <array>
#include <cstring>

#include "dayzero/core/check.h"
#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"

namespace dz::kernels {
namespace {

constexpr int64_t kTileElems = formats::kActQuantGroupElems;

void store_bf16(std::byte* dst, const float* values, int64_t num_elems) {
  for (int64_t i = 0; i < num_elems; ++i) {
    const uint16_t code = formats::encode_bf16(values[i]);
    std::memcpy(dst + i * 2, &code, 2);
  }
}

void load_bf16(const std::byte* src, int64_t num_elems, float* out) {
  for (int64_t i = 0; i < num_elems; ++i) {
    uint16_t code;
    std::memcpy(&code, src + i * 2, 2);
    out[i] = formats::decode_bf16(code);
  }
}

}  // namespace

void write_mla_record(const MlaCacheLayout& layout, std::byte* pool, int64_t slot,
                      const float* c_kv, const float* k_pe) {
  DZ_DCHECK(slot >= 0, "slot {}", slot);
  std::byte* record = pool + slot * layout.record_bytes();
  if (layout.dtype == KvCacheDtype::kBf16) {
    store_bf16(record, c_kv, layout.latent_dim);
    store_bf16(record + layout.latent_dim * 2, k_pe, layout.rope_dim);
    return;
  }
  DZ_CHECK(layout.latent_dim % kTileElems == 0, "fp8 latent_dim {} is not a multiple of 128",
           layout.latent_dim);
  // act_quant reads BF16 codes: c_kv is BF16-valued already, so this is exact (docs/formats.md
  // §4.1: quantizing FP32 directly would be a different double rounding).
  std::array<uint16_t, kTileElems> tile_bf16;
  std::array<uint8_t, kTileElems> tile_codes;
  const int64_t num_tiles = layout.latent_dim / kTileElems;
  std::byte* scales = record + layout.latent_dim;
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    for (int64_t i = 0; i < kTileElems; ++i)
      tile_bf16[static_cast<size_t>(i)] = formats::encode_bf16(c_kv[tile * kTileElems + i]);
    float scale = 0;
    formats::act_quant(tile_bf16, formats::ActScaleFormat::kUe8m0, tile_codes,
                       std::span<float>(&scale, 1));
    std::memcpy(record + tile * kTileElems, tile_codes.data(), kTileElems);
    std::memcpy(scales + tile * 4, &scale, 4);
  }
  store_bf16(scales + num_tiles * 4, k_pe, layout.rope_dim);
}

void read_mla_record(const MlaCacheLayout& layout, const std::byte* pool, int64_t slot,
                     float* out) {
  DZ_DCHECK(slot >= 0, "slot {}", slot);
  const std::byte* record = pool + slot * layout.record_bytes();
  if (layout.dtype == KvCacheDtype::kBf16) {
    load_bf16(record, layout.latent_dim + layout.rope_dim, out);
    return;
  }
  const int64_t num_tiles = layout.latent_dim / kTileElems;
  const std::byte* scales = record + layout.latent_dim;
  for (int64_t tile = 0; tile < num_tiles; ++tile) {
    float scale;
    std::memcpy(&scale, scales + tile * 4, 4);
    for (int64_t i = 0; i < kTileElems; ++i) {
      const auto code = static_cast<uint8_t>(record[tile * kTileElems + i]);
      out[tile * kTileElems + i] = formats::decode_e4m3(code) * scale;  // exact: scale is 2^k
    }
  }
  load_bf16(scales + num_tiles * 4, layout.rope_dim, out + layout.latent_dim);
}

void write_index_key(const IndexCacheLayout& layout, std::byte* pool, int64_t slot,
                     std::span<const uint8_t> codes, float scale) {
  DZ_CHECK(static_cast<int64_t>(codes.size()) == layout.key_dim, "index key of {} codes, want {}",
           codes.size(), layout.key_dim);
  DZ_DCHECK(slot >= 0, "slot {}", slot);
  std::memcpy(pool + layout.key_offset_bytes(slot), codes.data(), codes.size());
  std::memcpy(pool + layout.scale_offset_bytes(slot), &scale, 4);
}

}  // namespace dz::kernels
