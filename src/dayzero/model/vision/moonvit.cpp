#include "dayzero/model/vision/moonvit.h"

#include <algorithm>
#include <cmath>
#include <string>

#include <fmt/format.h>

#include "dayzero/core/check.h"
#include "dayzero/kernels/dense_attention.h"
#include "dayzero/kernels/fast_math.h"
#include "dayzero/kernels/norms.h"
#include "dayzero/model/decoder_layer.h"

namespace dz::model {
namespace {

constexpr DType kPublished = DType::kBF16;

// y = BF16(x · wᵀ) into `y` (resized, reused).
void linear_into(const ExecContext& ctx, const kernels::LinearWeight& w, const float* x,
                 int64_t rows, std::vector<float>& y) {
  y.resize(static_cast<size_t>(rows * w.out_features()));
  w.forward(ctx, x, rows, y.data());
  kernels::round_to_bf16(y.data(), static_cast<int64_t>(y.size()));
}

std::vector<float> linear(const ExecContext& ctx, const kernels::LinearWeight& w, const float* x,
                          int64_t rows) {
  std::vector<float> y;
  linear_into(ctx, w, x, rows, y);
  return y;
}

// fn(begin, end) over [0, n) in parallel chunks (elementwise work of a whole batch of patches).
template <typename F>
void elementwise(const ExecContext& ctx, int64_t n, F&& fn) {
  parallel_for(ctx, n, grain_for_work(1, 1 << 16), fn);
}

void add_bf16(const ExecContext& ctx, float* x, const float* y, int64_t n) {
  elementwise(ctx, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) x[i] += y[i];
    kernels::round_to_bf16(x + begin, end - begin);
  });
}

void gelu_tanh_bf16(const ExecContext& ctx, float* x, int64_t n) {
  const float k = 0.7978845608028654f;  // √(2/π)
  elementwise(ctx, n, [&](int64_t begin, int64_t end) {
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float v = x[i];
      x[i] = 0.5f * v * (1.0f + kernels::tanh_fast(k * (v + 0.044715f * v * v * v)));
    }
    kernels::round_to_bf16(x + begin, end - begin);
  });
}

void gelu_erf_bf16(const ExecContext& ctx, float* x, int64_t n) {
  elementwise(ctx, n, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      x[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * 0.70710678118654752f));
    kernels::round_to_bf16(x + begin, end - begin);
  });
}

}  // namespace

void visit_moonvit_tensors(TensorVisitor& v, const VisionConfig& c, MoonVitWeights& w) {
  const int64_t d = c.vt_hidden_size;
  const int64_t p = c.patch_size;
  const int64_t q = c.qkv_hidden_size;
  const int64_t inter = c.vt_intermediate_size;
  constexpr Split kAll = Split::kReplicated;
  constexpr Quantizable kBf16 = Quantizable::kNo;
  {
    TensorVisitor::Scope tower(v, {.prefix = "vision_tower.", .component = Component::kVision});
    v.floats("patch_embed.proj.weight", Shape{d, 3, p, p}, kPublished, kAll, w.patch_proj);
    v.floats("patch_embed.pos_emb.weight", Shape{c.init_pos_emb_height, c.init_pos_emb_width, d},
             kPublished, kAll, w.pos_emb);
    w.blocks.resize(static_cast<size_t>(c.vt_num_hidden_layers));
    for (int64_t i = 0; i < c.vt_num_hidden_layers; ++i) {
      const std::string prefix = fmt::format("encoder.blocks.{}.", i);
      TensorVisitor::Scope block(v, {.prefix = prefix});
      MoonVitBlockWeights& b = w.blocks[static_cast<size_t>(i)];
      v.floats("norm0.weight", Shape{d}, kPublished, kAll, b.norm0);
      v.linear("wqkv", 3 * q, d, kAll, kBf16, b.wqkv);
      v.linear("wo", d, q, kAll, kBf16, b.wo);
      v.floats("norm1.weight", Shape{d}, kPublished, kAll, b.norm1);
      v.linear("mlp.fc0", inter, d, kAll, kBf16, b.fc0);
      v.linear("mlp.fc1", d, inter, kAll, kBf16, b.fc1);
    }
    v.floats("encoder.final_layernorm.weight", Shape{d}, kPublished, kAll, w.final_norm);
  }
  TensorVisitor::Scope projector(v, {.prefix = "mm_projector.", .component = Component::kVision});
  v.linear("proj.0", c.merged_size(), c.merged_size(), kAll, kBf16, w.proj0);
  v.linear("proj.2", c.text_hidden_size, c.merged_size(), kAll, kBf16, w.proj2);
  v.floats("post_norm.weight", Shape{c.text_hidden_size}, kPublished, kAll, w.post_norm);
}

MoonVit::MoonVit(VisionConfig config, MoonVitWeights weights)
    : config_(config), weights_(std::move(weights)) {
  const int64_t p = config_.patch_size;
  patch_linear_ = kernels::LinearWeight::from_f32_as_bf16(weights_.patch_proj.data(),
                                                          config_.vt_hidden_size, 3 * p * p);
  // f_k = 1/10000^(4k/head_dim), in FP32 as the reference's table.
  const int64_t hd = config_.head_dim();
  for (int64_t k = 0; k < hd / 4; ++k)
    rope_frequencies_.push_back(
        1.0f / std::pow(10000.0f, static_cast<float>(4 * k) / static_cast<float>(hd)));
}

std::vector<float> MoonVit::positions(int64_t gh, int64_t gw) const {
  const int64_t h0 = config_.init_pos_emb_height;
  const int64_t w0 = config_.init_pos_emb_width;
  const int64_t d = config_.vt_hidden_size;
  if (gh == h0 && gw == w0) return weights_.pos_emb;  // as stored, no interpolation
  // Bilinear, align_corners false: source (i + ½)·in/out − ½ clamped at 0, the upper neighbour
  // clamped at the edge; FP32, rounded to BF16 once.
  struct Tap {
    int64_t lo, hi;
    float w_lo, w_hi;
  };
  auto taps = [](int64_t in, int64_t out) {
    std::vector<Tap> t(static_cast<size_t>(out));
    const float scale = static_cast<float>(in) / static_cast<float>(out);
    for (int64_t i = 0; i < out; ++i) {
      const float src = std::max(scale * (static_cast<float>(i) + 0.5f) - 0.5f, 0.0f);
      const auto lo = static_cast<int64_t>(src);
      const float frac = src - static_cast<float>(lo);
      t[static_cast<size_t>(i)] = {lo, lo < in - 1 ? lo + 1 : lo, 1.0f - frac, frac};
    }
    return t;
  };
  const std::vector<Tap> ty = taps(h0, gh);
  const std::vector<Tap> tx = taps(w0, gw);
  std::vector<float> out(static_cast<size_t>(gh * gw * d));
  const float* table = weights_.pos_emb.data();
  for (int64_t y = 0; y < gh; ++y)
    for (int64_t x = 0; x < gw; ++x) {
      const Tap& a = ty[static_cast<size_t>(y)];
      const Tap& b = tx[static_cast<size_t>(x)];
      float* o = out.data() + (y * gw + x) * d;
      const float* v00 = table + (a.lo * w0 + b.lo) * d;
      const float* v01 = table + (a.lo * w0 + b.hi) * d;
      const float* v10 = table + (a.hi * w0 + b.lo) * d;
      const float* v11 = table + (a.hi * w0 + b.hi) * d;
      for (int64_t c = 0; c < d; ++c)
        o[c] = a.w_lo * (b.w_lo * v00[c] + b.w_hi * v01[c]) +
               a.w_hi * (b.w_lo * v10[c] + b.w_hi * v11[c]);
    }
  kernels::round_to_bf16(out.data(), static_cast<int64_t>(out.size()));
  return out;
}

std::vector<float> MoonVit::patch_embed(const ExecContext& ctx, std::span<const VisionSpan> spans,
                                        const float* pixel_values) const {
  int64_t n = 0;
  for (const VisionSpan& s : spans) n += s.num_patches();
  const int64_t p = config_.patch_size;
  const int64_t d = config_.vt_hidden_size;
  std::vector<float> pixels(pixel_values, pixel_values + n * 3 * p * p);
  kernels::round_to_bf16(pixels.data(), static_cast<int64_t>(pixels.size()));
  std::vector<float> x = linear(ctx, patch_linear_, pixels.data(), n);
  for (const VisionSpan& s : spans) {
    const std::vector<float> pos = positions(s.grid_height, s.grid_width);
    add_bf16(ctx, x.data() + s.first_patch * d, pos.data(), s.num_patches() * d);
  }
  return x;
}

void MoonVit::attention(const ExecContext& ctx, std::span<const VisionSpan> spans, float* qkv,
                        float* out, std::vector<std::byte>& workspace) const {
  const int64_t heads = config_.vt_num_attention_heads;
  const int64_t hd = config_.head_dim();
  const int64_t q_size = config_.qkv_hidden_size;
  const int64_t row = 3 * q_size;
  // 2-D RoPE on q and k: the pair (2j, 2j+1) of a head is a complex number turned by x·f_k for
  // j = 2k and by y·f_k for j = 2k + 1 (x the patch's column, y its row). FP32, then BF16.
  for (const VisionSpan& s : spans)
    parallel_for(ctx, s.num_patches(), grain_for_work(4 * q_size, 1 << 16),
                 [&](int64_t begin, int64_t end) {
                   for (int64_t t = begin; t < end; ++t) {
                     const auto y = static_cast<float>(t / s.grid_width);
                     const auto x = static_cast<float>(t % s.grid_width);
                     float* r = qkv + (s.first_patch + t) * row;
                     for (int64_t j = 0; j < hd / 2; ++j) {
                       const float angle =
                           (j % 2 == 0 ? x : y) * rope_frequencies_[static_cast<size_t>(j / 2)];
                       const float c = std::cos(angle);
                       const float sn = std::sin(angle);
                       for (int64_t part = 0; part < 2; ++part)  // q, then k
                         for (int64_t h = 0; h < heads; ++h) {
                           float* e = r + part * q_size + h * hd + 2 * j;
                           const float re = e[0] * c - e[1] * sn;
                           const float im = e[0] * sn + e[1] * c;
                           e[0] = re;
                           e[1] = im;
                         }
                     }
                     kernels::round_to_bf16(r, 2 * q_size);
                   }
                 });
  // Softmax(q·kᵀ/√hd)·v within each image (docs/vision.md §3): the dense attention kernel,
  // FP32 scores and softmax, BF16 probabilities into P·V.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (const VisionSpan& s : spans) {
    const float* q = qkv + s.first_patch * row;
    workspace.resize(
        std::max(workspace.size(), kernels::dense_attention_workspace_bytes(s.num_patches(), hd)));
    kernels::dense_attention(ctx,
                             {.num_tokens = s.num_patches(),
                              .num_heads = heads,
                              .head_dim = hd,
                              .softmax_scale = scale,
                              .q = q,
                              .k = q + q_size,
                              .v = q + 2 * q_size,
                              .q_stride = row,
                              .k_stride = row,
                              .v_stride = row,
                              .out = out + s.first_patch * q_size,
                              .out_stride = q_size},
                             workspace);
  }
}

void MoonVit::run_block(const ExecContext& ctx, int64_t block, std::span<const VisionSpan> spans,
                        float* x, MoonVitScratch& scratch) const {
  const MoonVitBlockWeights& b = weights_.blocks[static_cast<size_t>(block)];
  const int64_t d = config_.vt_hidden_size;
  int64_t n = 0;
  for (const VisionSpan& s : spans) n += s.num_patches();
  std::vector<float>& h = scratch.normed;
  h.resize(static_cast<size_t>(n * d));
  rms_norm_bf16(ctx, x, b.norm0, h.data(), n, d, kVisionNormEps);
  linear_into(ctx, b.wqkv, h.data(), n, scratch.qkv);
  scratch.attn.resize(static_cast<size_t>(n * config_.qkv_hidden_size));
  attention(ctx, spans, scratch.qkv.data(), scratch.attn.data(), scratch.attention);
  kernels::round_to_bf16(scratch.attn.data(), static_cast<int64_t>(scratch.attn.size()));
  linear_into(ctx, b.wo, scratch.attn.data(), n, scratch.delta);
  add_bf16(ctx, x, scratch.delta.data(), n * d);
  rms_norm_bf16(ctx, x, b.norm1, h.data(), n, d, kVisionNormEps);
  linear_into(ctx, b.fc0, h.data(), n, scratch.hidden);
  gelu_tanh_bf16(ctx, scratch.hidden.data(), static_cast<int64_t>(scratch.hidden.size()));
  linear_into(ctx, b.fc1, scratch.hidden.data(), n, scratch.delta);
  add_bf16(ctx, x, scratch.delta.data(), n * d);
}

void MoonVit::final_norm(const ExecContext& ctx, int64_t num_patches, float* x) const {
  rms_norm_bf16(ctx, x, weights_.final_norm, x, num_patches, config_.vt_hidden_size,
                kVisionNormEps);
}

std::vector<float> MoonVit::merge(std::span<const VisionSpan> spans, const float* x) const {
  const int64_t d = config_.vt_hidden_size;
  std::vector<float> merged;
  for (const VisionSpan& s : spans)
    for (int64_t my = 0; my < s.grid_height / 2; ++my)
      for (int64_t mx = 0; mx < s.grid_width / 2; ++mx)
        for (int64_t ky = 0; ky < 2; ++ky)  // [top-left | top-right | bottom-left | bottom-right]
          for (int64_t kx = 0; kx < 2; ++kx) {
            const float* r = x + (s.first_patch + (2 * my + ky) * s.grid_width + 2 * mx + kx) * d;
            merged.insert(merged.end(), r, r + d);
          }
  return merged;
}

std::vector<float> MoonVit::project(const ExecContext& ctx, int64_t num_tokens,
                                    const float* merged) const {
  std::vector<float> hidden = linear(ctx, weights_.proj0, merged, num_tokens);
  gelu_erf_bf16(ctx, hidden.data(), static_cast<int64_t>(hidden.size()));
  std::vector<float> out = linear(ctx, weights_.proj2, hidden.data(), num_tokens);
  rms_norm_bf16(ctx, out.data(), weights_.post_norm, out.data(), num_tokens,
                config_.text_hidden_size, static_cast<float>(config_.projector_ln_eps));
  return out;
}

std::vector<float> MoonVit::encode(const ExecContext& ctx,
                                   std::span<const ProcessedImage* const> images,
                                   TapSink* taps) const {
  std::vector<VisionSpan> spans;
  std::vector<float> pixels;
  int64_t n = 0;
  for (const ProcessedImage* image : images) {
    DZ_CHECK(image->grid_height % 2 == 0 && image->grid_width % 2 == 0,
             "MoonVit: a patch grid of {}x{} cannot be merged 2 x 2", image->grid_height,
             image->grid_width);
    spans.push_back(
        {.first_patch = n, .grid_height = image->grid_height, .grid_width = image->grid_width});
    pixels.insert(pixels.end(), image->pixel_values.begin(), image->pixel_values.end());
    n += image->num_patches();
  }
  const int64_t d = config_.vt_hidden_size;
  const int64_t p = config_.patch_size;
  tap(taps, kVisionTapLayer, "pixel_values", pixels.data(), {n, 3 * p * p});
  std::vector<float> x = patch_embed(ctx, spans, pixels.data());
  tap(taps, kVisionTapLayer, "patch_embed", x.data(), {n, d});
  MoonVitScratch scratch;
  for (int64_t b = 0; b < num_blocks(); ++b) {
    run_block(ctx, b, spans, x.data(), scratch);
    tap(taps, kVisionTapLayer, fmt::format("block{}_out", b), x.data(), {n, d});
  }
  final_norm(ctx, n, x.data());
  tap(taps, kVisionTapLayer, "final_norm", x.data(), {n, d});
  const std::vector<float> merged = merge(spans, x.data());
  const int64_t tokens = n / 4;
  tap(taps, kVisionTapLayer, "merged", merged.data(), {tokens, 4 * d});
  std::vector<float> out = project(ctx, tokens, merged.data());
  tap(taps, kVisionTapLayer, "projector_out", out.data(), {tokens, config_.text_hidden_size});
  return out;
}

}  // namespace dz::model
