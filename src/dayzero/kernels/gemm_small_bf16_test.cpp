// gemm_small_bf16 (AMX, few tokens) against an FP64 reference on fresh random BF16 inputs, the
// panel layout against oneDNN's reorder, and LinearWeight::forward's dispatch to it.
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

// |y − Σ x·w| ≤ 1e-5 · Σ |x·w| per output (FP32 accumulation of ≤ 2048 BF16 products).
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
      ASSERT_LE(std::fabs(y[t * out + n] - sum), 1e-5 * abs_sum + 1e-30)
          << "token " << t << " column " << n << " of [" << m << ", " << out << ", " << in << "]";
    }
}

TEST(GemmSmallBf16, PanelLayoutIsOneDnnsAndMatchesTheReference) {
  if (!gemm_small_bf16_amx_available()) GTEST_SKIP() << "no AMX-BF16 here";
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
    const std::optional<AmxPanelWeight> view =
        amx_panel_weight(blocked.get_desc(), blocked.get_data_handle(), in, out);
    ASSERT_TRUE(view.has_value()) << "oneDNN chose another layout for [" << out << ", " << in
                                  << "]: " << blocked.get_desc().get_size() << " bytes";
    std::vector<uint16_t> packed(static_cast<size_t>(view->padded_in * view->padded_out));
    pack_amx_panels(w.data(), out, in, packed.data());
    ASSERT_EQ(packed.size() * 2, blocked.get_desc().get_size());
    const auto* onednn_codes = static_cast<const uint16_t*>(blocked.get_data_handle());
    ASSERT_TRUE(std::equal(packed.begin(), packed.end(), onednn_codes)) << out << " x " << in;
    const std::vector<float> wf = decode(w);
    for (int64_t m : {1, 3, 16, 17, 32, 45, 64}) {
      for (int threads : {1, 2}) {
        SCOPED_TRACE(::testing::Message() << "M " << m << ", threads " << threads);
        const std::vector<float> x = decode(random_codes(rng, m * in));
        std::vector<float> y(static_cast<size_t>(m * out), std::nanf(""));
        gemm_small_bf16_amx({.num_threads = threads}, *view, x.data(), m, y.data());
        expect_close(y, x, wf, m, out, in);
      }
    }
  }
}

TEST(GemmSmallBf16, OtherLayoutsAreRefused) {
  if (!gemm_small_bf16_amx_available()) GTEST_SKIP() << "no AMX-BF16 here";
  std::vector<uint16_t> codes(64 * 64);
  const memory::desc plain({64, 64}, memory::data_type::bf16, memory::format_tag::ba);
  EXPECT_FALSE(amx_panel_weight(plain, codes.data(), 64, 64).has_value());
  const memory::desc f32({64, 64}, memory::data_type::f32, memory::format_tag::any);
  EXPECT_FALSE(amx_panel_weight(f32, codes.data(), 64, 64).has_value());
}

// LinearWeight::forward on BF16 weights: few tokens take this kernel, more take oneDNN; both
// against the FP64 reference.
TEST(GemmSmallBf16, LinearForwardDispatchMatchesTheReference) {
  const unsigned seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  const int64_t out = 136, in = 200;
  const std::vector<float> w = decode(random_codes(rng, out * in));
  const LinearWeight weight = LinearWeight::from_f32_as_bf16(w.data(), out, in);
  for (int64_t m : {1, 7, 33, 64, 65}) {
    SCOPED_TRACE(::testing::Message() << "M " << m);
    const std::vector<float> x = decode(random_codes(rng, m * in));
    std::vector<float> y(static_cast<size_t>(m * out));
    weight.forward({.num_threads = 2}, x.data(), m, y.data());
    expect_close(y, x, w, m, out, in);
  }
}

}  // namespace gemm_small_bf16_test
}  // namespace dz::kernels
