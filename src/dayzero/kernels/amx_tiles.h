#pragma once
// AMX tile configuration shared by the AMX kernel variants (include from *_avx512.cpp files only;
// whether AMX may run is cpu_features().amx_bf16). Every kernel uses tiles of 16 rows × 64 bytes.

#include <cstdint>

#include <immintrin.h>

namespace dz::kernels::detail {

struct AmxTileConfig {  // the 64-byte operand of LDTILECFG (palette 1)
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0 … num_tiles − 1 as 16 rows × 64 bytes, on the calling thread.
__attribute__((target("amx-tile"))) inline void configure_amx_tiles(int num_tiles) {
  alignas(64) AmxTileConfig config;
  for (int tile = 0; tile < num_tiles; ++tile) {
    config.rows[tile] = 16;
    config.colsb[tile] = 64;
  }
  // GCC 12's _tile_loadconfig() declares only 8 bytes of the config as read, so the stores to the
  // rest may be dropped; this asm reads the whole 64-byte object.
  asm volatile("ldtilecfg %0" : : "m"(config));
}

__attribute__((target("amx-tile"))) inline void release_amx_tiles() {
  _tile_release();
}

}  // namespace dz::kernels::detail
