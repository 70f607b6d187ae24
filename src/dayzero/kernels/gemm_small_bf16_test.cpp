// gemm_small_bf16 (few tokens; each body this CPU runs: AMX, AVX512-BF16) against an FP64
// reference on fresh random BF16 inputs, the panel layout against oneDNN's reorder, and
// LinearWeight::forward's dispatch to it.
#include "dayzero/kernels/gemm_small_bf16.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/linear.h"

namespace dz::kernels {
namespace gemm_small_bf16_test {

using dnnl::memory;

std::vector<uint16_t> random_codes(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<uint16_t> codes(static_cast<size_t>(n));
  for (uint16_t& c : codes) c = formats::encode_bf16(dist(rng));
  return codes;
}

std::vector<float> decode(const std::vector<uint16_t>& codes) {
  std::vector<float> out(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) out[i] = formats::decode_bf16(codes[i]);
  return out;
}

// Wᵀ in the layout oneDNN picks for a BF16 matmul with this weight (as linear_bf16.cpp asks).
memory onednn_weight(const std::vector<uint16_t>& w, int64_t out, int64_t in) {
  const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  const dnnl::matmul::primitive_desc pd(
      dnnl::matmul::desc(memory::desc({64, in}, memory::data_type::bf16, memory::format_tag::ab),
                         memory::desc({in, out}, memory::data_type::bf16, memory::format_tag::any),
                         memory::desc({64, out}, memory::data_type::f32, memory::format_tag::ab)),
      engine);
  memory plain(memory::desc({in, out}, memory::data_type::bf16, memory::format_tag::ba), engine,
               const_cast<uint16_t*>(w.data()));
  memory blocked(pd.weights_desc(), engine);
  dnnl::stream stream(engine);
  dnnl::reorder(plain, blocked).execute(stream, plain, blocked);
  stream.wait();
  return blocked;
}

// |y − Σ x·w| ≤ (K + 1) · 2⁻²⁴ · Σ |x·w| per output: BF16 products are exact in FP32, and each
// body adds them into FP32 in at most K + 1 rounded additions per output (AVX512-BF16: K / 2
// VDPBF16PS of two additions each, then two accumulator sets added; AMX fewer), each off by at
// most 2⁻²⁴ of the running magnitude, itself at most Σ |x·w|. A wrong element is off by O(1).
void expect_close(const std::vector<float>& y, const std::vector<float>& x,
                  const std::vector<float>& w, int64_t m, int64_t out, int64_t in) {
  for (int64_t t = 0; t < m; ++t)
    for (int64_t n = 0; n < out; ++n) {
      double sum = 0, abs_sum = 0;
      for (int64_t k = 0; k < in; ++k) {
        const double p = double{x[t * in + k]} * double{w[n * in + k]};
        sum += p;
        abs_sum += std::fabs(p);
      }
      ASSERT_LE(std::fabs(y[t * out + n] - sum), static_cast<double>(in + 1) * 0x1p-24 * abs_sum)
          << "token " << t << " column " << n << " of [" << m << ", " << out << ", " << in << "]";
    }
}

struct Body {
  const char* name;
  int64_t max_tokens;
  void (*run)(const ExecContext&, const Bf16PanelWeight&, const float*, int64_t, float*);
};

std::vector<Body> bodies_here() {
  std::vector<Body> bodies;
  if (gemm_small_bf16_amx_available())
    bodies.push_back({"AMX", kGemmSmallBf16AmxMaxTokens, gemm_small_bf16_amx});
  if (gemm_small_bf16_dpbf16_available())
    bodies.push_back({"AVX512-BF16", kGemmSmallBf16Dpbf16MaxTokens, gemm_small_bf16_dpbf16});
  return bodies;
}

TEST(GemmSmallBf16, PanelLayoutIsOneDnnsAndMatchesTheReference) {
  const std::vector<Body> bodies = bodies_here();
  if (bodies.empty()) GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 here";
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  // K and N multiples of the blocks or not (zero padding), one or several panels.
  for (const auto& [out, in] : {std::pair<int64_t, int64_t>{64, 64},
                                {100, 72},
                                {40, 96},
                                {192, 256},
                                {130, 48},
                                {64, 1000}}) {
    const std::vector<uint16_t> w = random_codes(rng, out * in);
    const memory blocked = onednn_weight(w, out, in);
    const std::optional<Bf16PanelWeight> view =
        bf16_panel_weight(blocked.get_desc(), blocked.get_data_handle(), in, out);
    ASSERT_TRUE(view.has_value()) << "oneDNN chose another layout for [" << out << ", " << in
                                  << "]: " << blocked.get_desc().get_size() << " bytes";
    std::vector<uint16_t> packed(static_cast<size_t>(view->padded_in * view->padded_out));
    pack_bf16_panels(w.data(), out, in, packed.data());
    ASSERT_EQ(packed.size() * 2, blocked.get_desc().get_size());
    const auto* onednn_codes = static_cast<const uint16_t*>(blocked.get_data_handle());
    ASSERT_TRUE(std::equal(packed.begin(), packed.end(), onednn_codes)) << out << " x " << in;
    const std::vector<float> wf = decode(w);
    for (const Body& body : bodies)
      for (int64_t m : {1, 2, 3, 5, 6, 7, 8, 13, 16, 17, 32, 45, 64, 65, 97, 200, 512}) {
        if (m > body.max_tokens) continue;
        for (int threads : {1, 2}) {
          SCOPED_TRACE(::testing::Message() << body.name << ", M " << m << ", threads " << threads);
          const std::vector<float> x = decode(random_codes(rng, m * in));
          std::vector<float> y(static_cast<size_t>(m * out), std::nanf(""));
          body.run({.num_threads = threads}, *view, x.data(), m, y.data());
          expect_close(y, x, wf, m, out, in);
        }
      }
  }
}

// The AVX512-BF16 body sums each token in one order whatever the row's token count, so a
// speculative verification row scores its tokens exactly as one-token decode steps do.
TEST(GemmSmallBf16, Dpbf16TokensEqualTheirOneTokenForwardBitForBit) {
  if (!gemm_small_bf16_dpbf16_available()) GTEST_SKIP() << "no AVX512-BF16 here";
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t out = 200, in = 328;
  const std::vector<uint16_t> w = random_codes(rng, out * in);
  const memory blocked = onednn_weight(w, out, in);
  const std::optional<Bf16PanelWeight> view =
      bf16_panel_weight(blocked.get_desc(), blocked.get_data_handle(), in, out);
  ASSERT_TRUE(view.has_value());
  for (int64_t m : {2, 3, 4, 5, 7, 16, 64, 100, 512}) {
    SCOPED_TRACE(::testing::Message() << "M " << m);
    const std::vector<float> x = decode(random_codes(rng, m * in));
    std::vector<float> y(static_cast<size_t>(m * out)), one(static_cast<size_t>(out));
    gemm_small_bf16_dpbf16({.num_threads = 2}, *view, x.data(), m, y.data());
    for (int64_t t = 0; t < m; ++t) {
      gemm_small_bf16_dpbf16({.num_threads = 1}, *view, x.data() + t * in, 1, one.data());
      for (int64_t n = 0; n < out; ++n)
        ASSERT_EQ(y[t * out + n], one[n]) << "token " << t << " column " << n;
    }
  }
}

TEST(GemmSmallBf16, OtherLayoutsAreRefused) {
  if (!gemm_small_bf16_available()) GTEST_SKIP() << "neither AMX-BF16 nor AVX512-BF16 here";
  std::vector<uint16_t> codes(64 * 64);
  const memory::desc plain({64, 64}, memory::data_type::bf16, memory::format_tag::ba);
  EXPECT_FALSE(bf16_panel_weight(plain, codes.data(), 64, 64).has_value());
  const memory::desc f32({64, 64}, memory::data_type::f32, memory::format_tag::any);
  EXPECT_FALSE(bf16_panel_weight(f32, codes.data(), 64, 64).has_value());
}

// LinearWeight::forward on BF16 weights: few tokens take this kernel, more take oneDNN with AMX
// (this kernel without); both against the FP64 reference.
TEST(GemmSmallBf16, LinearForwardDispatchMatchesTheReference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t out = 136, in = 200;
  const std::vector<float> w = decode(random_codes(rng, out * in));
  const LinearWeight weight = LinearWeight::from_f32_as_bf16(w.data(), out, in);
  for (int64_t m : {1, 2, 7, 16, 17, 33, 64, 65, 513}) {
    SCOPED_TRACE(::testing::Message() << "M " << m);
    const std::vector<float> x = decode(random_codes(rng, m * in));
    std::vector<float> y(static_cast<size_t>(m * out));
    weight.forward({.num_threads = 2}, x.data(), m, y.data());
    expect_close(y, x, w, m, out, in);
  }
}

}  // namespace gemm_small_bf16_test
}  // namespace dz::kernels
