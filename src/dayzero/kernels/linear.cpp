#include "dayzero/kernels/linear.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include <dnnl.hpp>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/logging.h"
#include "dayzero/formats/code_checks.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/formats/fp8_block.h"
#include "dayzero/formats/mxfp4_layouts.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/gemm_small_bf16.h"
#include "dayzero/kernels/linear_kernels.h"
#include "dayzero/kernels/linear_ref.h"

// How forward() runs (each path is tested against linear_ref.cpp):
// - BF16 weights: one oneDNN matmul, bf16 x × bf16 Wᵀ → f32 y, with Wᵀ reordered once at load
//   into the blocked layout oneDNN picks for it (AMX/AVX-512 brgemm). One primitive per
//   num_tokens, cached per weight; the blocked layout does not depend on num_tokens.
// - FP8 weights, num_tokens < kFp8GemmMinTokens: the fused GEMV, one contiguous range of output
//   rows per thread: E4M3 → BF16 byte tables + VDPBF16PS (linear_fp8_bf16_avx512.cpp) where the
//   CPU has VBMI and BF16 and block_cols % 64 == 0, else E4M3 → FP16 → FP32 FMAs
//   (linear_fp8_avx512.cpp, parallel over row chunks).
// - FP8 weights, more tokens: tiles of kTileRows output rows × all of K are dequantized into a
//   per-thread workspace (BF16 when every scale is a power of two, so exact; FP32 otherwise) and
//   multiplied by a single-threaded oneDNN matmul per tile, the tiles spread over the threads.
// - MXFP4 weights: the same two paths (linear_mxfp4_avx512.cpp): a fused GEMV below
//   kMxfp4GemmMinTokens, else tiles dequantized into a fixed per-thread workspace (BF16, or FP32
//   for tiles whose rows hold scale codes 0 or 1 with nonzero elements: BF16 subnormals, which
//   the BF16 GEMM may flush) and multiplied by oneDNN.
// - No AVX-512, or scales that the fast paths cannot fold exactly: the scalar reference.

namespace dz::kernels {

namespace {

using dnnl::memory;
using Dt = memory::data_type;
using Tag = memory::format_tag;

// GEMV below this many tokens (one pass of detail::kFp8GemvMaxTokens reads the weights once): its
// cost grows by ≈ 2 VDPBF16PS per 64 codes per token, while the tile path pays a fixed
// dequantization (byte tables, ≈ DRAM-bound) and per-tile oneDNN calls, then runs on AMX.
// Measured on [2048, 7168], 1 thread, CPU time, loaded machine (±30 % between runs), two
// alternating rounds: GEMV 6.0–8.0 / 10.2–11.3 / 11.9–13.3 ms at 8 / 12 / 16 tokens, tiles
// 6.8–7.1 / 5.5–8.0 / 7.5–9.0 ms: even at 8, so a second GEMV pass (9+) never pays.
constexpr int64_t kFp8GemmMinTokens = 9;
// Output rows per dequantized tile: 64 × 7168 BF16 is 0.9 MiB, half the L2, leaving room for
// oneDNN's packed copy of it.
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileTokens = 256;  // tokens per tile GEMM
constexpr size_t kMaxCachedPrimitives = 64;
// MXFP4: the GEMV costs about 0.3 ms per token per [3072, 3584] expert matrix (4 VDPBF16PS per
// 128 weights per token), the tiles a fixed ~2.4 ms (a DRAM-bound dequantization, then AMX); at 8
// tokens (one GEMV pass) they measured 2.3 vs 2.5 ms, 9 tokens need a second GEMV pass.
constexpr int64_t kMxfp4GemmMinTokens = 9;
// The fixed per-thread tile buffer: 1 MiB holds 64 BF16 rows of 7168 (as the FP8 tiles) or 170 of
// the K3 experts' 3072, and fits in the 2 MiB L2 next to oneDNN's packed copy.
constexpr size_t kMxfp4WorkspaceBytes = size_t{1} << 20;
constexpr int64_t kMxfp4MaxTileRows = 256;

// The one CPU engine; oneDNN engines are immutable handles.
const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Per-thread reusable buffers: activations in BF16, tiles, oneDNN scratchpads. Contents never
// outlive one forward() call, so they carry no state between calls.
struct ThreadScratch {
  AlignedBuffer x_bf16, x_f32, tile, onednn, mxfp4_tile;
};
thread_local ThreadScratch t_scratch;

std::byte* ensure(AlignedBuffer& buffer, size_t size_bytes) {
  if (buffer.size_bytes() < size_bytes) buffer = AlignedBuffer(size_bytes + size_bytes / 4);
  return buffer.data();
}

// oneDNN's OpenMP runtime reads omp_get_max_threads() of the calling thread; this sets it to
// ctx.num_threads for the duration of one forward() and restores it.
class OmpThreads {
 public:
  explicit OmpThreads(int num_threads) : saved_(omp_get_max_threads()) {
    omp_set_num_threads(num_threads < 1 ? 1 : num_threads);
  }
  ~OmpThreads() { omp_set_num_threads(saved_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

struct CachedMatmul {
  dnnl::matmul primitive;
  size_t scratchpad_bytes = 0;
};

void execute(const CachedMatmul& mm, const memory::desc& src_desc, const void* src,
             const memory::desc& weights_desc, const void* weights, const memory::desc& dst_desc,
             float* dst) {
  const dnnl::engine& engine = cpu_engine();
  dnnl::stream stream(engine);
  std::byte* scratch = ensure(t_scratch.onednn, mm.scratchpad_bytes + 64);
  memory::desc scratch_desc({static_cast<memory::dim>(mm.scratchpad_bytes)}, Dt::u8, Tag::a);
  mm.primitive.execute(
      stream, {{DNNL_ARG_SRC, memory(src_desc, engine, const_cast<void*>(src))},
               {DNNL_ARG_WEIGHTS, memory(weights_desc, engine, const_cast<void*>(weights))},
               {DNNL_ARG_DST, memory(dst_desc, engine, dst)},
               {DNNL_ARG_SCRATCHPAD, memory(scratch_desc, engine, scratch)}});
  stream.wait();
}

Status check_matrix(const TensorView& view, std::string_view what) {
  if (view.rank() != 2)
    return make_error(StatusCode::kInvalidArgument, "{}: expected rank 2 [out, in], found shape {}",
                      what, view.shape().to_string());
  if (view.dim(0) <= 0 || view.dim(1) <= 0)
    return make_error(StatusCode::kInvalidArgument, "{}: expected a non-empty [out, in], found {}",
                      what, view.shape().to_string());
  if (view.strides()[1] != 1 || view.strides()[0] < view.dim(1))
    return make_error(StatusCode::kInvalidArgument,
                      "{}: expected rows with contiguous columns, found strides {} for shape {}",
                      what, view.strides().to_string(), view.shape().to_string());
  return {};
}

}  // namespace

struct LinearWeight::Impl {
  int64_t out_features = 0;
  int64_t in_features = 0;
  bool fp8_block = false;

  // BF16 weights: Wᵀ [in, out] as oneDNN's matmul B, in the layout it chose (weights_mem), or,
  // when no oneDNN matmul exists for it, W [out, in] as BF16 codes for the reference (bf16).
  memory::desc weights_desc;
  memory weights_mem;
  std::optional<AmxPanelWeight> amx_panels;  // weights_mem as gemm_small_bf16 reads it (few tokens)
  AlignedBuffer bf16;

  // FP8 block weights: [out, in] E4M3 codes and [num_scale_rows, num_scale_cols] FP32 scales.
  AlignedBuffer codes;
  AlignedBuffer scale_inv;
  formats::Fp8BlockShape block;
  bool scales_pow2 = false;  // all powers of two: BF16 tiles are exact
  bool fp8_fast = false;     // AVX-512 present and every scale foldable by 2^8 exactly
  bool fp8_bf16 = false;     // the GEMV's BF16 variant (VBMI + BF16, block_cols % 64 == 0)

  // MXFP4 weights: packed [out, in/2] nibbles, E8M0 scales [out, in/32] (no 0xFF), and per row
  // whether a block with scale code 0 or 1 has a nonzero element (its values are BF16
  // subnormals: such rows go through FP32 tiles).
  bool mxfp4 = false;
  bool mxfp4_fast = false;  // AVX-512 with BF16
  AlignedBuffer packed, mx_scales;
  std::vector<uint8_t> mx_row_subnormal;
  bool mx_any_subnormal = false;

  // Matmul primitives by (tokens, tile rows, FP32 tile?); creation is serialised, execution not.
  // Callers get their own reference, so emptying a full cache never frees a primitive that
  // another thread (a tile task, a second caller) is still executing.
  mutable std::mutex mutex;
  mutable std::map<std::tuple<int64_t, int64_t, bool>, CachedMatmul> primitives;

  const uint8_t* code_data() const { return reinterpret_cast<const uint8_t*>(codes.data()); }
  const float* scale_data() const { return reinterpret_cast<const float*>(scale_inv.data()); }
  const uint8_t* packed_data() const { return reinterpret_cast<const uint8_t*>(packed.data()); }
  const uint8_t* mx_scale_data() const {
    return reinterpret_cast<const uint8_t*>(mx_scales.data());
  }
  // Output rows per MXFP4 tile so that one tile fits the workspace; 0 if not even one row does.
  int64_t mxfp4_tile_rows() const;

  // The matmul for x [num_tokens, in] (bf16, or f32 when f32) · weights → y [num_tokens, n]
  // with row stride ldy. n == 0: the whole BF16 weight in weights_desc. A copy of the cached
  // entry (dnnl::matmul is a reference-counted handle): the cache may be emptied meanwhile.
  CachedMatmul matmul_for(int64_t num_tokens, int64_t tile_rows, bool f32) const;

  void repack_for_onednn();
  void forward_bf16(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  void forward_fp8_gemv(const ExecContext& ctx, const float* x, int64_t num_tokens, float* y) const;
  void forward_fp8_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens,
                         float* y) const;
  void forward_mxfp4_gemv(const ExecContext& ctx, const float* x, int64_t num_tokens,
                          float* y) const;
  void forward_mxfp4_tiles(const ExecContext& ctx, const float* x, int64_t num_tokens,
                           float* y) const;
};

namespace {

memory::desc tile_weights_desc(int64_t in, int64_t tile_rows, bool f32) {
  // The tile is W rows [tile_rows, in] row-major, i.e. B = tileᵀ [in, tile_rows] in "ba".
  return memory::desc({in, tile_rows}, f32 ? Dt::f32 : Dt::bf16, Tag::ba);
}

memory::desc dst_desc(int64_t num_tokens, int64_t cols, int64_t row_stride) {
  return memory::desc({num_tokens, cols}, Dt::f32, memory::dims{row_stride, 1});
}

// Converts x [num_elems] to BF16 codes and/or BF16-valued floats in parallel.
void round_activations(const ExecContext& ctx, const float* x, int64_t num_elems, uint16_t* bf16,
                       float* f32) {
  parallel_for(ctx, num_elems, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    detail::round_to_bf16_avx512(x + begin, end - begin, bf16 ? bf16 + begin : nullptr,
                                 f32 ? f32 + begin : nullptr);
  });
}

}  // namespace

// Moves the BF16 codes of impl.bf16 into oneDNN's preferred layout for Wᵀ; keeps them for the
// reference when oneDNN has no BF16 matmul here.
void LinearWeight::Impl::repack_for_onednn() {
  Impl& impl = *this;
  if (!cpu_features().avx512) return;
  const int64_t out = impl.out_features, in = impl.in_features;
  try {
    const dnnl::engine& engine = cpu_engine();
    const memory::desc plain({in, out}, Dt::bf16, Tag::ba);
    // The blocked layout oneDNN picks does not depend on the token count (checked for 1..1000);
    // matmul_for() asks for exactly this layout for every count and fails loudly otherwise.
    const dnnl::matmul::primitive_desc pd(
        dnnl::matmul::desc(memory::desc({64, in}, Dt::bf16, Tag::ab),
                           memory::desc({in, out}, Dt::bf16, Tag::any),
                           memory::desc({64, out}, Dt::f32, Tag::ab)),
        user_scratchpad_attr(), engine);
    impl.weights_desc = pd.weights_desc();
    impl.weights_mem = memory(impl.weights_desc, engine);
    memory plain_mem(plain, engine, impl.bf16.data());
    dnnl::stream stream(engine);
    dnnl::reorder(plain_mem, impl.weights_mem).execute(stream, plain_mem, impl.weights_mem);
    stream.wait();
    impl.bf16 = AlignedBuffer();
    impl.amx_panels =
        amx_panel_weight(impl.weights_desc, impl.weights_mem.get_data_handle(), in, out);
  } catch (const dnnl::error& e) {
    spdlog::warn("linear weight [{}, {}]: no oneDNN BF16 matmul ({}); using the reference", out, in,
                 e.what());
    impl.weights_mem = memory();
  }
}

Result<LinearWeight> LinearWeight::from_float(const TensorView& weight) {
  DZ_RETURN_IF_ERROR(check_matrix(weight, "linear weight"));
  const DType dtype = weight.dtype();
  if (dtype != DType::kBF16 && dtype != DType::kF16 && dtype != DType::kF32)
    return make_error(StatusCode::kUnsupported,
                      "linear weight: expected dtype BF16, F16 or F32, found {}",
                      dtype_name(dtype));
  const int64_t out_features = weight.dim(0), in_features = weight.dim(1);
  const int64_t row_stride = weight.strides()[0];
  LinearWeight result;
  Impl& impl = *result.impl_;
  impl.out_features = out_features;
  impl.in_features = in_features;
  impl.bf16 = AlignedBuffer(static_cast<size_t>(out_features * in_features) * sizeof(uint16_t));
  auto* dst = reinterpret_cast<uint16_t*>(impl.bf16.data());
  for (int64_t i = 0; i < out_features; ++i) {
    uint16_t* dst_row = dst + i * in_features;
    if (dtype == DType::kBF16) {
      const uint16_t* src = weight.data_as<const uint16_t>() + i * row_stride;
      std::memcpy(dst_row, src, static_cast<size_t>(in_features) * sizeof(uint16_t));
    } else if (dtype == DType::kF16) {
      const uint16_t* src = weight.data_as<const uint16_t>() + i * row_stride;
      for (int64_t j = 0; j < in_features; ++j)
        dst_row[j] = formats::encode_bf16(formats::decode_fp16(src[j]));
    } else {
      const float* src = weight.data_as<const float>() + i * row_stride;
      for (int64_t j = 0; j < in_features; ++j) dst_row[j] = formats::encode_bf16(src[j]);
    }
  }
  if (dtype != DType::kBF16)
    spdlog::debug("linear weight [{}, {}]: {} rounded to BF16 (RNE)", out_features, in_features,
                  dtype_name(dtype));
  impl.repack_for_onednn();
  return result;
}

Result<LinearWeight> LinearWeight::from_fp8_block(const TensorView& codes,
                                                  const TensorView& scale_inv, int64_t block_rows,
                                                  int64_t block_cols) {
  DZ_RETURN_IF_ERROR(check_matrix(codes, "FP8 weight"));
  if (codes.dtype() != DType::kF8E4M3)
    return make_error(StatusCode::kUnsupported, "FP8 weight: expected dtype F8_E4M3, found {}",
                      dtype_name(codes.dtype()));
  if (block_rows <= 0 || block_cols <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "FP8 weight: expected a positive block size, found [{}, {}]", block_rows,
                      block_cols);
  formats::Fp8BlockShape block{codes.dim(0), codes.dim(1), block_rows, block_cols};
  const Shape expected_scale_shape{block.num_scale_rows(), block.num_scale_cols()};
  if (!(scale_inv.shape() == expected_scale_shape))
    return make_error(StatusCode::kInvalidArgument,
                      "FP8 weight scale_inv: expected shape {} for weight {} in [{}, {}] blocks, "
                      "found {}",
                      expected_scale_shape.to_string(), codes.shape().to_string(), block_rows,
                      block_cols, scale_inv.shape().to_string());
  if (scale_inv.dtype() != DType::kF32)
    return make_error(StatusCode::kUnsupported,
                      "FP8 weight scale_inv: expected dtype F32, found {}",
                      dtype_name(scale_inv.dtype()));
  if (!scale_inv.is_contiguous())
    return make_error(StatusCode::kInvalidArgument,
                      "FP8 weight scale_inv: expected a contiguous tensor, found strides {}",
                      scale_inv.strides().to_string());

  LinearWeight result;
  Impl& impl = *result.impl_;
  impl.out_features = block.num_rows;
  impl.in_features = block.num_cols;
  impl.fp8_block = true;
  impl.block = block;
  const int64_t row_stride = codes.strides()[0];
  impl.codes = AlignedBuffer(static_cast<size_t>(block.num_rows * block.num_cols));
  auto* dst = reinterpret_cast<uint8_t*>(impl.codes.data());
  for (int64_t i = 0; i < block.num_rows; ++i)
    std::memcpy(dst + i * block.num_cols, codes.data_as<const uint8_t>() + i * row_stride,
                static_cast<size_t>(block.num_cols));
  DZ_RETURN_IF_ERROR(formats::check_e4m3_codes(
      std::span<const uint8_t>(dst, static_cast<size_t>(block.num_rows * block.num_cols)),
      codes.shape()));

  const int64_t num_scales = expected_scale_shape.num_elems();
  impl.scale_inv = AlignedBuffer(static_cast<size_t>(num_scales) * sizeof(float));
  auto* scales = reinterpret_cast<float*>(impl.scale_inv.data());
  std::memcpy(scales, scale_inv.data(), static_cast<size_t>(num_scales) * sizeof(float));
  for (int64_t s = 0; s < num_scales; ++s) {
    if (!std::isfinite(scales[s]))
      return make_error(StatusCode::kCorrupt,
                        "FP8 weight scale_inv: non-finite value {} at index {} of {}", scales[s],
                        formats::unravel_index(s, expected_scale_shape),
                        expected_scale_shape.to_string());
  }
  // Power-of-two scales in [2^-100, 2^100] keep every decoded product a BF16 value (4 significant
  // bits, normal exponent) and every scale · 2^8 finite; the fast paths rely on both.
  impl.scales_pow2 = true;
  bool foldable = true;
  for (int64_t s = 0; s < num_scales; ++s) {
    int exponent = 0;
    const float mantissa = std::frexp(std::fabs(scales[s]), &exponent);
    if (scales[s] != 0.0f && (exponent < -100 || exponent > 100)) foldable = false;
    if (scales[s] != 0.0f && mantissa != 0.5f) impl.scales_pow2 = false;
  }
  impl.scales_pow2 = impl.scales_pow2 && foldable;
  impl.fp8_fast = foldable && cpu_features().avx512;
  impl.fp8_bf16 = impl.fp8_fast && cpu_features().avx512_vbmi && cpu_features().avx512_bf16 &&
                  detail::fp8_bf16_gemv_takes(block);
  return result;
}

Result<LinearWeight> LinearWeight::from_mxfp4(const TensorView& weight_packed,
                                              const TensorView& weight_scale) {
  DZ_RETURN_IF_ERROR(check_matrix(weight_packed, "MXFP4 weight_packed"));
  DZ_RETURN_IF_ERROR(check_matrix(weight_scale, "MXFP4 weight_scale"));
  if (weight_packed.dtype() != DType::kU8)
    return make_error(StatusCode::kUnsupported, "MXFP4 weight_packed: expected dtype U8, found {}",
                      dtype_name(weight_packed.dtype()));
  if (weight_scale.dtype() != DType::kU8 && weight_scale.dtype() != DType::kF8E8M0)
    return make_error(StatusCode::kUnsupported,
                      "MXFP4 weight_scale: expected dtype U8 or F8_E8M0, found {}",
                      dtype_name(weight_scale.dtype()));
  const int64_t out = weight_packed.dim(0), in = 2 * weight_packed.dim(1);
  if (in % 32 != 0)
    return make_error(StatusCode::kInvalidArgument,
                      "MXFP4 weight_packed: expected [out, in/2] with in a multiple of 32, found "
                      "shape {} (in = {})",
                      weight_packed.shape().to_string(), in);
  const Shape expected_scale_shape{out, in / 32};
  if (!(weight_scale.shape() == expected_scale_shape))
    return make_error(StatusCode::kInvalidArgument,
                      "MXFP4 weight_scale: expected shape {} (one code per 32 inputs) for "
                      "weight_packed {}, found {}",
                      expected_scale_shape.to_string(), weight_packed.shape().to_string(),
                      weight_scale.shape().to_string());

  LinearWeight result;
  Impl& impl = *result.impl_;
  impl.out_features = out;
  impl.in_features = in;
  impl.mxfp4 = true;
  const int64_t row_bytes = in / 2, num_blocks = in / 32;
  impl.packed = AlignedBuffer(static_cast<size_t>(out * row_bytes));
  impl.mx_scales = AlignedBuffer(static_cast<size_t>(out * num_blocks));
  auto* packed = reinterpret_cast<uint8_t*>(impl.packed.data());
  auto* scales = reinterpret_cast<uint8_t*>(impl.mx_scales.data());
  for (int64_t i = 0; i < out; ++i) {
    std::memcpy(packed + i * row_bytes,
                weight_packed.data_as<const uint8_t>() + i * weight_packed.strides()[0],
                static_cast<size_t>(row_bytes));
    std::memcpy(scales + i * num_blocks,
                weight_scale.data_as<const uint8_t>() + i * weight_scale.strides()[0],
                static_cast<size_t>(num_blocks));
  }
  Status scale_status = formats::check_e8m0_scales(
      std::span<const uint8_t>(scales, static_cast<size_t>(out * num_blocks)),
      expected_scale_shape);
  if (!scale_status.ok()) return std::move(scale_status).with_context("MXFP4 weight_scale");

  impl.mx_row_subnormal.assign(static_cast<size_t>(out), 0);
  int64_t num_low_blocks = 0;
  for (int64_t i = 0; i < out; ++i)
    for (int64_t b = 0; b < num_blocks; ++b) {
      if (scales[i * num_blocks + b] >= 2) continue;
      ++num_low_blocks;
      const uint8_t* block = packed + i * row_bytes + b * 16;
      for (int k = 0; k < 16; ++k)
        if ((block[k] & 0x77) != 0) impl.mx_row_subnormal[static_cast<size_t>(i)] = 1;
    }
  for (uint8_t flag : impl.mx_row_subnormal) impl.mx_any_subnormal = impl.mx_any_subnormal || flag;
  if (num_low_blocks > 0)
    spdlog::debug("MXFP4 weight [{}, {}]: {} blocks with scale code 0 or 1", out, in,
                  num_low_blocks);
  impl.mxfp4_fast = cpu_features().avx512 && cpu_features().avx512_bf16;
  return result;
}

LinearWeight LinearWeight::from_f32_as_bf16(const float* weight, int64_t out_features,
                                            int64_t in_features) {
  DZ_CHECK(out_features > 0 && in_features > 0, "empty linear weight [{}, {}]", out_features,
           in_features);
  TensorView view(const_cast<float*>(weight), DType::kF32, Shape{out_features, in_features});
  Result<LinearWeight> result = from_float(view);
  DZ_CHECK(result.ok(), "{}", result.status().to_string());
  return std::move(result).value();
}

LinearWeight::LinearWeight() : impl_(std::make_unique<Impl>()) {}
LinearWeight::~LinearWeight() = default;
LinearWeight::LinearWeight(LinearWeight&&) noexcept = default;
LinearWeight& LinearWeight::operator=(LinearWeight&&) noexcept = default;

int64_t LinearWeight::out_features() const {
  return impl_->out_features;
}
int64_t LinearWeight::in_features() const {
  return impl_->in_features;
}
bool LinearWeight::is_fp8_block() const {
  return impl_->fp8_block;
}
bool LinearWeight::is_mxfp4() const {
  return impl_->mxfp4;
}

int64_t LinearWeight::stored_bytes() const {
  const Impl& impl = *impl_;
  size_t bytes = impl.bf16.size_bytes() + impl.codes.size_bytes() + impl.scale_inv.size_bytes() +
                 impl.packed.size_bytes() + impl.mx_scales.size_bytes() +
                 impl.mx_row_subnormal.size();
  if (impl.weights_mem) bytes += impl.weights_desc.get_size();
  return static_cast<int64_t>(bytes);
}

size_t LinearWeight::mxfp4_workspace_bytes_per_thread() {
  return kMxfp4WorkspaceBytes;
}

void LinearWeight::forward(const ExecContext& ctx, const float* x, int64_t num_tokens,
                           float* y) const {
  const Impl& impl = *impl_;
  DZ_CHECK(impl.out_features > 0, "forward on an empty LinearWeight");
  if (num_tokens <= 0) return;
  OmpThreads threads(ctx.num_threads);
  if (impl.mxfp4) {
    if (!impl.mxfp4_fast)
      linear_mxfp4_ref(impl.packed_data(), impl.mx_scale_data(), impl.out_features,
                       impl.in_features, x, num_tokens, y);
    else if (num_tokens < kMxfp4GemmMinTokens || impl.mxfp4_tile_rows() == 0)
      impl.forward_mxfp4_gemv(ctx, x, num_tokens, y);
    else
      impl.forward_mxfp4_tiles(ctx, x, num_tokens, y);
  } else if (impl.fp8_block) {
    if (!impl.fp8_fast)
      linear_fp8_block_ref(impl.code_data(), impl.scale_data(), impl.block, x, num_tokens, y);
    else if (num_tokens < kFp8GemmMinTokens)
      impl.forward_fp8_gemv(ctx, x, num_tokens, y);
    else
      impl.forward_fp8_tiles(ctx, x, num_tokens, y);
  } else if (!impl.weights_mem) {
    linear_bf16_ref(reinterpret_cast<const uint16_t*>(impl.bf16.data()), impl.out_features,
                    impl.in_features, x, num_tokens, y);
  } else {
    impl.forward_bf16(ctx, x, num_tokens, y);
  }
}

CachedMatmul LinearWeight::Impl::matmul_for(int64_t num_tokens, int64_t tile_rows, bool f32) const {
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(num_tokens, tile_rows, f32);
  if (auto it = primitives.find(key); it != primitives.end()) return it->second;
  // Primitives still executing elsewhere live on in their callers' copies.
  if (primitives.size() >= kMaxCachedPrimitives) primitives.clear();
  const bool whole = tile_rows == 0;
  const int64_t cols = whole ? out_features : tile_rows;
  const memory::desc src({num_tokens, in_features}, f32 ? Dt::f32 : Dt::bf16, Tag::ab);
  const memory::desc weights = whole ? weights_desc : tile_weights_desc(in_features, cols, f32);
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(src, weights, dst_desc(num_tokens, cols, out_features)),
      user_scratchpad_attr(), cpu_engine());
  CachedMatmul entry{dnnl::matmul(pd), pd.scratchpad_desc().get_size()};
  return primitives.emplace(key, std::move(entry)).first->second;
}

void LinearWeight::Impl::forward_bf16(const ExecContext& ctx, const float* x, int64_t num_tokens,
                                      float* y) const {
  if (amx_panels && num_tokens <= kGemmSmallBf16MaxTokens) {
    gemm_small_bf16_amx(ctx, *amx_panels, x, num_tokens, y);
    return;
  }
  const int64_t num_elems = num_tokens * in_features;
  auto* x_bf16 = reinterpret_cast<uint16_t*>(
      ensure(t_scratch.x_bf16, static_cast<size_t>(num_elems) * sizeof(uint16_t)));
  round_activations(ctx, x, num_elems, x_bf16, nullptr);
  const CachedMatmul mm = matmul_for(num_tokens, 0, false);
  execute(mm, memory::desc({num_tokens, in_features}, Dt::bf16, Tag::ab), x_bf16, weights_desc,
          weights_mem.get_data_handle(), dst_desc(num_tokens, out_features, out_features), y);
}

void LinearWeight::Impl::forward_fp8_gemv(const ExecContext& ctx, const float* x,
                                          int64_t num_tokens, float* y) const {
  if (fp8_bf16) {
    // BF16 activations in the kernel's order; one contiguous range of rows per thread (one
    // sequential DRAM stream each, as the MXFP4 GEMV).
    const int64_t x_elems = detail::fp8_gemv_x_elems(in_features);
    auto* x_packed = reinterpret_cast<uint16_t*>(
        ensure(t_scratch.x_bf16, static_cast<size_t>(num_tokens * x_elems) * sizeof(uint16_t)));
    for (int64_t t = 0; t < num_tokens; ++t)
      detail::fp8_pack_x_avx512(x + t * in_features, in_features, x_packed + t * x_elems);
    const int64_t threads = std::max(ctx.num_threads, 1);
    const int64_t grain = std::max<int64_t>(4, (out_features + threads - 1) / threads);
    parallel_for(ctx, out_features, grain, [&](int64_t row_begin, int64_t row_end) {
      for (int64_t t = 0; t < num_tokens; t += detail::kFp8GemvMaxTokens) {
        const int64_t count = std::min(detail::kFp8GemvMaxTokens, num_tokens - t);
        detail::fp8_gemv_bf16_rows_avx512(code_data(), scale_data(), block, x_packed + t * x_elems,
                                          count, y + t * out_features, row_begin, row_end);
      }
    });
    return;
  }
  const int64_t num_elems = num_tokens * in_features;
  auto* x_f32 = reinterpret_cast<float*>(
      ensure(t_scratch.x_f32, static_cast<size_t>(num_elems) * sizeof(float)));
  round_activations(ctx, x, num_elems, nullptr, x_f32);
  // Rows in chunks that keep every thread busy without splitting below a few KiB of codes.
  const int64_t grain = std::max<int64_t>(
      4, std::min<int64_t>(64, out_features / (4 * std::max(ctx.num_threads, 1))));
  parallel_for(ctx, out_features, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t t = 0; t < num_tokens; t += detail::kFp8GemvMaxTokens) {
      const int64_t count = std::min(detail::kFp8GemvMaxTokens, num_tokens - t);
      detail::fp8_gemv_rows_avx512(code_data(), scale_data(), block, x_f32 + t * in_features, count,
                                   y + t * out_features, row_begin, row_end);
    }
  });
}

void LinearWeight::Impl::forward_fp8_tiles(const ExecContext& ctx, const float* x,
                                           int64_t num_tokens, float* y) const {
  const bool f32 = !scales_pow2;
  const int64_t num_elems = num_tokens * in_features;
  const void* src = nullptr;
  if (f32) {
    auto* x_f32 = reinterpret_cast<float*>(
        ensure(t_scratch.x_f32, static_cast<size_t>(num_elems) * sizeof(float)));
    round_activations(ctx, x, num_elems, nullptr, x_f32);
    src = x_f32;
  } else {
    auto* x_bf16 = reinterpret_cast<uint16_t*>(
        ensure(t_scratch.x_bf16, static_cast<size_t>(num_elems) * sizeof(uint16_t)));
    round_activations(ctx, x, num_elems, x_bf16, nullptr);
    src = x_bf16;
  }
  const size_t elem_bytes = f32 ? sizeof(float) : sizeof(uint16_t);
  const int64_t num_row_tiles = (out_features + kTileRows - 1) / kTileRows;
  const int64_t num_token_tiles = (num_tokens + kTileTokens - 1) / kTileTokens;
  // Task = (row tile, token tile), token tiles innermost so a thread's consecutive tasks tend to
  // share a row tile (it still dequantizes it once per task: cheap next to the GEMM).
  parallel_for(ctx, num_row_tiles * num_token_tiles, 1, [&](int64_t task_begin, int64_t task_end) {
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t row_begin = (task / num_token_tiles) * kTileRows;
      const int64_t rows = std::min(kTileRows, out_features - row_begin);
      const int64_t token_begin = (task % num_token_tiles) * kTileTokens;
      const int64_t tokens = std::min(kTileTokens, num_tokens - token_begin);
      std::byte* tile =
          ensure(t_scratch.tile, static_cast<size_t>(rows * in_features) * elem_bytes);
      if (f32)
        detail::fp8_dequantize_rows_f32_avx512(code_data(), scale_data(), block, row_begin,
                                               row_begin + rows, reinterpret_cast<float*>(tile));
      else if (fp8_bf16)
        detail::fp8_dequantize_rows_bf16_vbmi(code_data(), scale_data(), block, row_begin,
                                              row_begin + rows, reinterpret_cast<uint16_t*>(tile));
      else
        detail::fp8_dequantize_rows_bf16_avx512(code_data(), scale_data(), block, row_begin,
                                                row_begin + rows,
                                                reinterpret_cast<uint16_t*>(tile));
      const CachedMatmul mm = matmul_for(tokens, rows, f32);
      execute(mm, memory::desc({tokens, in_features}, f32 ? Dt::f32 : Dt::bf16, Tag::ab),
              static_cast<const std::byte*>(src) +
                  static_cast<size_t>(token_begin * in_features) * elem_bytes,
              tile_weights_desc(in_features, rows, f32), tile, dst_desc(tokens, rows, out_features),
              y + token_begin * out_features + row_begin);
    }
  });
}

int64_t LinearWeight::Impl::mxfp4_tile_rows() const {
  const size_t row_bytes =
      static_cast<size_t>(in_features) * (mx_any_subnormal ? sizeof(float) : sizeof(uint16_t));
  int64_t rows = std::min<int64_t>(
      {static_cast<int64_t>(kMxfp4WorkspaceBytes / row_bytes), kMxfp4MaxTileRows, out_features});
  if (rows >= 16) rows -= rows % 16;
  return rows;
}

void LinearWeight::Impl::forward_mxfp4_gemv(const ExecContext& ctx, const float* x,
                                            int64_t num_tokens, float* y) const {
  const int64_t x_elems = detail::mxfp4_gemv_x_elems(in_features);
  auto* x_packed = reinterpret_cast<uint16_t*>(
      ensure(t_scratch.x_bf16, static_cast<size_t>(num_tokens * x_elems) * sizeof(uint16_t)));
  for (int64_t t = 0; t < num_tokens; ++t)
    detail::mxfp4_pack_x_avx512(x + t * in_features, in_features, x_packed + t * x_elems);
  // One contiguous range of rows per thread: one sequential DRAM stream each.
  const int64_t threads = std::max(ctx.num_threads, 1);
  const int64_t grain = std::max<int64_t>(4, (out_features + threads - 1) / threads);
  parallel_for(ctx, out_features, grain, [&](int64_t row_begin, int64_t row_end) {
    for (int64_t t = 0; t < num_tokens; t += detail::kMxfp4GemvMaxTokens) {
      const int64_t count = std::min(detail::kMxfp4GemvMaxTokens, num_tokens - t);
      detail::mxfp4_gemv_rows_avx512(packed_data(), mx_scale_data(), in_features,
                                     x_packed + t * x_elems, count, y + t * out_features,
                                     out_features, row_begin, row_end);
    }
  });
}

void LinearWeight::Impl::forward_mxfp4_tiles(const ExecContext& ctx, const float* x,
                                             int64_t num_tokens, float* y) const {
  const int64_t num_elems = num_tokens * in_features;
  auto* x_bf16 = reinterpret_cast<uint16_t*>(
      ensure(t_scratch.x_bf16, static_cast<size_t>(num_elems) * sizeof(uint16_t)));
  float* x_f32 = nullptr;
  if (mx_any_subnormal)
    x_f32 = reinterpret_cast<float*>(
        ensure(t_scratch.x_f32, static_cast<size_t>(num_elems) * sizeof(float)));
  round_activations(ctx, x, num_elems, x_bf16, x_f32);
  const int64_t tile_rows = mxfp4_tile_rows();
  const int64_t num_row_tiles = (out_features + tile_rows - 1) / tile_rows;
  const int64_t num_token_tiles = (num_tokens + kTileTokens - 1) / kTileTokens;
  parallel_for(ctx, num_row_tiles * num_token_tiles, 1, [&](int64_t task_begin, int64_t task_end) {
    std::byte* tile = ensure(t_scratch.mxfp4_tile, kMxfp4WorkspaceBytes);
    for (int64_t task = task_begin; task < task_end; ++task) {
      const int64_t row_begin = (task / num_token_tiles) * tile_rows;
      const int64_t rows = std::min(tile_rows, out_features - row_begin);
      const int64_t token_begin = (task % num_token_tiles) * kTileTokens;
      const int64_t tokens = std::min(kTileTokens, num_tokens - token_begin);
      bool f32 = false;
      for (int64_t i = row_begin; i < row_begin + rows; ++i)
        f32 = f32 || mx_row_subnormal[static_cast<size_t>(i)] != 0;
      detail::mxfp4_dequantize_rows_avx512(packed_data(), mx_scale_data(), in_features, row_begin,
                                           row_begin + rows,
                                           f32 ? nullptr : reinterpret_cast<uint16_t*>(tile),
                                           f32 ? reinterpret_cast<float*>(tile) : nullptr);
      const void* src = f32 ? static_cast<const void*>(x_f32 + token_begin * in_features)
                            : static_cast<const void*>(x_bf16 + token_begin * in_features);
      const CachedMatmul mm = matmul_for(tokens, rows, f32);
      execute(mm, memory::desc({tokens, in_features}, f32 ? Dt::f32 : Dt::bf16, Tag::ab), src,
              tile_weights_desc(in_features, rows, f32), tile, dst_desc(tokens, rows, out_features),
              y + token_begin * out_features + row_begin);
    }
  });
}

void LinearWeight::dequantize(float* out) const {
  const Impl& impl = *impl_;
  const int64_t num_elems = impl.out_features * impl.in_features;
  if (impl.mxfp4) {
    formats::dequantize_mxfp4_packed(
        std::span<const uint8_t>(impl.packed_data(), static_cast<size_t>(num_elems / 2)),
        std::span<const uint8_t>(impl.mx_scale_data(), static_cast<size_t>(num_elems / 32)),
        impl.out_features, impl.in_features, std::span<float>(out, static_cast<size_t>(num_elems)));
    return;
  }
  if (impl.fp8_block) {
    formats::dequantize_fp8_block(
        std::span<const uint8_t>(impl.code_data(), static_cast<size_t>(num_elems)),
        std::span<const float>(impl.scale_data(), static_cast<size_t>(impl.block.num_scale_rows() *
                                                                      impl.block.num_scale_cols())),
        impl.block, std::span<float>(out, static_cast<size_t>(num_elems)));
    return;
  }
  AlignedBuffer plain_codes;
  const uint16_t* codes = reinterpret_cast<const uint16_t*>(impl.bf16.data());
  if (impl.weights_mem) {
    // Back from oneDNN's layout: Wᵀ [in, out] in "ba" is W [out, in] row-major.
    const dnnl::engine& engine = cpu_engine();
    plain_codes = AlignedBuffer(static_cast<size_t>(num_elems) * sizeof(uint16_t));
    memory plain(memory::desc({impl.in_features, impl.out_features}, Dt::bf16, Tag::ba), engine,
                 plain_codes.data());
    dnnl::stream stream(engine);
    memory weights = impl.weights_mem;
    dnnl::reorder(weights, plain).execute(stream, weights, plain);
    stream.wait();
    codes = reinterpret_cast<const uint16_t*>(plain_codes.data());
  }
  for (int64_t e = 0; e < num_elems; ++e) out[e] = formats::decode_bf16(codes[e]);
}

}  // namespace dz::kernels
