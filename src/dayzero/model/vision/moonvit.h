#pragma once
// Kimi-K3's vision tower and projector (MoonViT, docs/vision.md §3): 14 × 14 patches through a
// linear patch embedding plus the learnable position table (bilinearly resized to the patch grid),
// pre-norm blocks with 2-D RoPE and full attention within each image, a final RMSNorm, the 2 × 2
// merge and PatchMergerMLPV2 (Linear, GELU, Linear, RMSNorm) to the decoder's width. BF16 weights,
// FP32 arithmetic with activations rounded to BF16 where the published model stores them.

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/taps.h"
#include "dayzero/model/tensor_visitor.h"
#include "dayzero/model/vision/image_processor.h"
#include "dayzero/model/vision/vision_config.h"

namespace dz::model {

// The layer id of the tower's taps (the decoder's globals are −1).
inline constexpr int kVisionTapLayer = -2;
// RMSNorm inside the tower: torch.nn.RMSNorm without eps, i.e. FP32's machine epsilon.
inline constexpr float kVisionNormEps = 1.1920929e-07f;

struct MoonVitBlockWeights {
  std::vector<float> norm0, norm1;  // [D]
  kernels::LinearWeight wqkv;       // [3Q, D]: q, k, v each head-major
  kernels::LinearWeight wo;         // [D, Q]
  kernels::LinearWeight fc0;        // [I, D]
  kernels::LinearWeight fc1;        // [D, I]
};

struct MoonVitWeights {
  std::vector<float> patch_proj;  // conv [D, 3, p, p] = a linear over (c, y, x)
  std::vector<float> pos_emb;     // [H0, W0, D]
  std::vector<MoonVitBlockWeights> blocks;
  std::vector<float> final_norm;  // [D]
  kernels::LinearWeight proj0;    // [4D, 4D]
  kernels::LinearWeight proj2;    // [text hidden, 4D]
  std::vector<float> post_norm;   // [text hidden]
};

// vision_tower.* and mm_projector.* (names, shapes and BF16 as published; K3 has no biases).
void visit_moonvit_tensors(TensorVisitor& v, const VisionConfig& c, MoonVitWeights& w);

// One image's rows in a batch of images: its patches (and merged tokens) are contiguous.
struct VisionSpan {
  int64_t first_patch = 0;
  int64_t grid_height = 0;
  int64_t grid_width = 0;
  int64_t num_patches() const { return grid_height * grid_width; }
};

// The buffers of run_block for one batch of patches, reused from block to block: fresh buffers of
// tens of megabytes per linear cost a third of an encode in page faults and zeroing.
struct MoonVitScratch {
  std::vector<float> normed, qkv, attn, hidden, delta;
  std::vector<std::byte> attention;  // kernels::dense_attention's workspace
};

class MoonVit {
 public:
  MoonVit(VisionConfig config, MoonVitWeights weights);

  const VisionConfig& config() const { return config_; }
  int64_t num_blocks() const { return static_cast<int64_t>(weights_.blocks.size()); }

  // The decoder-width embeddings [Σ num_tokens, text hidden] of `images`, in order; taps (layer
  // kVisionTapLayer): pixel_values, patch_embed, block{i}_out, final_norm, merged, projector_out.
  std::vector<float> encode(const ExecContext& ctx, std::span<const ProcessedImage* const> images,
                            TapSink* taps) const;

  // The stages, for operator-level verification. Rows of x are the spans' patches in order.
  std::vector<float> patch_embed(const ExecContext& ctx, std::span<const VisionSpan> spans,
                                 const float* pixel_values) const;
  void run_block(const ExecContext& ctx, int64_t block, std::span<const VisionSpan> spans, float* x,
                 MoonVitScratch& scratch) const;
  void final_norm(const ExecContext& ctx, int64_t num_patches, float* x) const;
  std::vector<float> merge(std::span<const VisionSpan> spans, const float* x) const;
  std::vector<float> project(const ExecContext& ctx, int64_t num_tokens, const float* merged) const;

 private:
  // The position table resized to a grid (bilinear, BF16-rounded), [gh · gw, D].
  std::vector<float> positions(int64_t grid_height, int64_t grid_width) const;
  void attention(const ExecContext& ctx, std::span<const VisionSpan> spans, float* qkv, float* out,
                 std::vector<std::byte>& workspace) const;

  VisionConfig config_;
  MoonVitWeights weights_;
  kernels::LinearWeight patch_linear_;   // patch_proj as [D, 3 · p · p]
  std::vector<float> rope_frequencies_;  // [head_dim / 4]
};

}  // namespace dz::model
