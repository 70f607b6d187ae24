#pragma once
// The vision tower's config.json fields (`vision_config`, Kimi-K3's MoonViT; docs/vision.md §3)
// and the image processor's (preprocessor_config.json `media_proc_cfg`, docs/vision.md §2), with
// the fields K3 publishes. Options K3 does not use (LayerNorm, biases, bicubic position tables,
// the K2.5 projector) are refused by name rather than read and ignored.

#include <array>
#include <cstdint>
#include <optional>

#include "dayzero/core/status.h"
#include "dayzero/formats/hf_config.h"

namespace dz::model {

struct VisionConfig {
  int64_t patch_size = 14;
  int64_t vt_hidden_size = 0;  // D
  int64_t vt_num_hidden_layers = 0;
  int64_t vt_num_attention_heads = 0;
  int64_t qkv_hidden_size = 0;  // Q = heads · head_dim (defaults to D)
  int64_t vt_intermediate_size = 0;
  int64_t init_pos_emb_height = 0;  // the learnable position table's grid
  int64_t init_pos_emb_width = 0;
  int64_t merge_height = 2;  // merge_kernel_size
  int64_t merge_width = 2;
  int64_t mm_hidden_size = 0;      // D again, as the projector sees it
  int64_t text_hidden_size = 0;    // the decoder's hidden size
  double projector_ln_eps = 1e-5;  // the projector's post RMSNorm

  int64_t head_dim() const { return qkv_hidden_size / vt_num_attention_heads; }
  int64_t merged_size() const { return merge_height * merge_width * vt_hidden_size; }
};

// Reads `vision_config`; `text_hidden_size` must equal the decoder's hidden size.
Result<VisionConfig> parse_vision_config(const formats::ConfigObject& obj,
                                         int64_t decoder_hidden_size);

struct ImageProcessorConfig {
  int64_t patch_size = 14;
  int64_t merge_kernel_size = 2;
  int64_t in_patch_limit = 0;           // patches before merging, at most (K3: 65536)
  int64_t patch_limit_on_one_side = 0;  // patches along either side, at most (K3: 512)
  // Per channel; FP64 as the published processor holds them (numpy float64 arrays).
  std::array<double, 3> image_mean = {0.5, 0.5, 0.5};
  std::array<double, 3> image_std = {0.5, 0.5, 0.5};
  // Transparent pixels are composited onto this chessboard after the resize (K3); without it,
  // alpha is dropped.
  struct Chessboard {
    int64_t square_size = 8;
    bool white_on_top_left = true;
    uint8_t white = 255;
    uint8_t gray = 180;
  };
  std::optional<Chessboard> transparent_background;

  int64_t merged_patch() const { return patch_size * merge_kernel_size; }  // 28 pixels
  int64_t max_tokens() const { return in_patch_limit / (merge_kernel_size * merge_kernel_size); }
};

// Reads preprocessor_config.json's `media_proc_cfg` (the whole file is `root`).
Result<ImageProcessorConfig> parse_image_processor_config(const formats::ConfigObject& root);

}  // namespace dz::model
