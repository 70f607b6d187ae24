// LinearWeight (kernels/linear.h) cases. Shapes from bench/linear_fp8_bench.cpp (FP8 block,
// [2048, 7168]: a DeepSeek-V3 expert's gate/up) and bench/linear_mxfp4_bench.cpp (MXFP4,
// [3072, 3584]: a Kimi-K3 expert's w1/w3). GEMV cases rotate through a >= 1 GiB set of matrices so
// every call reads its weights from DRAM and are judged by weight bytes per second against the
// DRAM read bandwidth; many-token cases by FLOP/s against the BF16 GEMM peak (they dequantize tiles
// for oneDNN's BF16 GEMM). The prefill GEMM runs the limit's own shape (1024 × 4096 × 4096)
// through LinearWeight, so its fraction is what the layer keeps of oneDNN's raw BF16 matmul.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dayzero/core/tensor_view.h"
#include "dayzero/kernels/linear.h"
#include "ops.h"

namespace dz::bench::ops {
namespace {

using kernels::LinearWeight;

enum class Format { kBf16, kFp8, kMxfp4 };

struct LinearShape {
  int64_t out = 0, in = 0;
};

// Bytes one forward reads of the weight itself, as stored: 2 per BF16 weight; one E4M3 code per
// weight plus an FP32 scale per 128 × 128 block; 4 bits per MXFP4 weight plus an E8M0 scale per 32.
double weight_bytes(Format format, LinearShape s) {
  const double n = static_cast<double>(s.out) * static_cast<double>(s.in);
  switch (format) {
    case Format::kBf16:
      return 2 * n;
    case Format::kFp8:
      return n + 4.0 * static_cast<double>(((s.out + 127) / 128) * ((s.in + 127) / 128));
    case Format::kMxfp4:
      return n / 2 + n / 32;
  }
  return 0;
}

LinearWeight make_weight(Format format, LinearShape s, uint64_t& state) {
  const auto n = static_cast<size_t>(s.out * s.in);
  if (format == Format::kBf16) {
    std::vector<float> values(n);
    for (float& v : values) v = random_unit(state) * 0.05f;
    return LinearWeight::from_f32_as_bf16(values.data(), s.out, s.in);
  }
  if (format == Format::kFp8) {
    std::vector<uint8_t> codes(n);
    for (size_t e = 0; e < n; e += 8) {
      const uint64_t r = next_random(state);
      for (size_t b = 0; b < 8 && e + b < n; ++b) {
        const auto c = static_cast<uint8_t>(r >> (8 * b));
        codes[e + b] = (c & 0x7F) == 0x7F ? 0x7E : c;  // 0x7F / 0xFF are NaN in E4M3
      }
    }
    const int64_t rows = (s.out + 127) / 128, cols = (s.in + 127) / 128;
    std::vector<float> scales(static_cast<size_t>(rows * cols));
    for (float& v : scales) v = next_random(state) % 2 ? 1.0f / 256 : 1.0f / 512;
    return LinearWeight::from_fp8_block(
               TensorView(codes.data(), DType::kF8E4M3, Shape{s.out, s.in}),
               TensorView(scales.data(), DType::kF32, Shape{rows, cols}), 128, 128)
        .value();
  }
  std::vector<uint8_t> packed(n / 2), scales(n / 32);
  for (size_t e = 0; e < packed.size(); e += 8) {
    const uint64_t r = next_random(state);
    for (size_t b = 0; b < 8 && e + b < packed.size(); ++b)
      packed[e + b] = static_cast<uint8_t>(r >> (8 * b));
  }
  for (uint8_t& v : scales) v = static_cast<uint8_t>(118 + next_random(state) % 8);  // as trained
  return LinearWeight::from_mxfp4(TensorView(packed.data(), DType::kU8, Shape{s.out, s.in / 2}),
                                  TensorView(scales.data(), DType::kU8, Shape{s.out, s.in / 32}))
      .value();
}

// Enough matrices to hold set_bytes (at least two): each call reads the next one, so by the time a
// matrix comes round again the others have pushed it out of the L3.
std::vector<LinearWeight> make_set(Format format, LinearShape s, double set_bytes) {
  const auto count =
      std::max<int64_t>(2, static_cast<int64_t>(std::ceil(set_bytes / weight_bytes(format, s))));
  std::vector<LinearWeight> set;
  uint64_t state = 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(format);
  for (int64_t m = 0; m < count; ++m) set.push_back(make_weight(format, s, state));
  return set;
}

const char* format_name(Format format) {
  return format == Format::kBf16 ? "bf16" : format == Format::kFp8 ? "fp8" : "mxfp4";
}

std::string mib(double bytes) {
  return std::to_string(static_cast<int64_t>(bytes / 1048576.0 + 0.5)) + " MiB";
}

void add_linear(std::vector<OpCase>& cases, Format format, LinearShape s, int64_t tokens,
                double set_bytes, bool gemv) {
  const std::string group = std::string("linear.") + format_name(format);
  OpCase op;
  op.name = group + (gemv ? ".gemv" : "") + ".t" + std::to_string(tokens);
  op.shape = std::to_string(tokens) + " x [" + std::to_string(s.out) + ", " + std::to_string(s.in) +
             "] " + format_name(format) + (set_bytes > 0 ? ", " + mib(set_bytes) + " set" : "");
  op.group = group + (set_bytes > 0 ? ".set" : ".one");
  op.limit = gemv ? LimitKind::kDram : LimitKind::kGemmBf16;
  op.setup = [=, key = op.group](const OpsOptions& options, Fixtures& fixtures) {
    const auto& set = fixtures.get<std::vector<LinearWeight>>(
        key, [&] { return make_set(format, s, set_bytes); });
    auto x = std::make_shared<std::vector<float>>(
        random_activations(static_cast<size_t>(tokens * s.in), 0x51ED + tokens));
    auto y = std::make_shared<std::vector<float>>(static_cast<size_t>(tokens * s.out));
    const ExecContext ctx{options.num_threads};
    PreparedCase p;
    p.body = [&set, x, y, ctx, tokens, next = size_t{0}]() mutable {
      set[next].forward(ctx, x->data(), tokens, y->data());
      next = (next + 1) % set.size();
    };
    p.bytes = weight_bytes(format, s) + 4.0 * static_cast<double>(tokens * (s.in + s.out));
    p.flops = 2.0 * static_cast<double>(tokens) * static_cast<double>(s.out * s.in);
    return p;
  };
  cases.push_back(std::move(op));
}

}  // namespace

void add_linear_cases(bool quick, std::vector<OpCase>& cases, std::vector<RatioSpec>& /*ratios*/) {
  const double set_bytes = quick ? 8.0 * 1048576 : 1073741824.0;
  const LinearShape fp8 = quick ? LinearShape{256, 512} : LinearShape{2048, 7168};
  const LinearShape mxfp4 = quick ? LinearShape{256, 512} : LinearShape{3072, 3584};
  const LinearShape gemm = quick ? LinearShape{256, 256} : LinearShape{4096, 4096};
  // The peer path: the same FP8 shape with BF16 weights (oneDNN GEMV).
  add_linear(cases, Format::kBf16, fp8, 1, set_bytes, true);
  add_linear(cases, Format::kFp8, fp8, 1, set_bytes, true);
  add_linear(cases, Format::kFp8, fp8, 64, set_bytes, false);
  add_linear(cases, Format::kFp8, fp8, 256, set_bytes, false);
  add_linear(cases, Format::kMxfp4, mxfp4, 1, set_bytes, true);
  add_linear(cases, Format::kMxfp4, mxfp4, 64, set_bytes, false);
  add_linear(cases, Format::kMxfp4, mxfp4, 255, set_bytes, false);
  // Prefill GEMM: one matrix (compute-bound; cache residency does not matter).
  add_linear(cases, Format::kBf16, gemm, quick ? 64 : 1024, 0, false);
}

}  // namespace dz::bench::ops
