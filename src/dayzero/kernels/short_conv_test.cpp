// The KDA short convolution against its double-precision oracle (docs/models.md §4.3).
#include "dayzero/kernels/short_conv.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "dayzero/formats/codecs.h"

namespace dz::kernels {
namespace short_conv_test {

struct ConvInputs {
  int64_t channels = 0, width = 0, num_tokens = 0;
  std::vector<float> x, w;
  std::vector<uint16_t> state;
};

ConvInputs make_conv(int64_t channels, int64_t width, int64_t num_tokens, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ConvInputs in{channels, width, num_tokens, {}, {}, {}};
  in.x.resize(static_cast<size_t>(num_tokens * channels));
  for (auto& x : in.x)
    x = formats::round_to_bf16(normal(rng));  // BF16-valued, as the contract says
  in.w.resize(static_cast<size_t>(channels * width));
  for (auto& w : in.w) w = 0.5f * normal(rng);
  in.state.resize(static_cast<size_t>((width - 1) * channels));
  for (auto& s : in.state) s = formats::encode_bf16(normal(rng));
  return in;
}

double rel_rms(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (double{out[i]} - ref[i]) * (double{out[i]} - ref[i]);
    den += double{ref[i]} * ref[i];
  }
  return std::sqrt(num / den);
}

// FP32 accumulation of ≤ 8 taps and an FP32 SiLU against double: a few ulp, so 1e-6 relative RMS.
TEST(ShortConvTest, MatchesRef) {
  for (int64_t width : {1, 2, 4}) {
    for (int64_t tokens : {1, 2, 3, 7, 40}) {
      const ConvInputs in =
          make_conv(200, width, tokens, static_cast<uint32_t>(width * 100 + tokens));
      std::vector<float> y(in.x.size()), y_ref(in.x.size());
      std::vector<uint16_t> state = in.state, state_ref = in.state;
      short_conv_silu(ExecContext{2}, in.x.data(), tokens, 200, in.w.data(), width, state.data(),
                      y.data());
      short_conv_silu_ref(ExecContext{1}, in.x.data(), tokens, 200, in.w.data(), width,
                          state_ref.data(), y_ref.data());
      EXPECT_LT(rel_rms(y, y_ref), 1e-6) << "width " << width << " T " << tokens;
      EXPECT_EQ(state, state_ref) << "width " << width << " T " << tokens;  // exact BF16 copies
    }
  }
}

// Feeding the tokens in pieces continues through the BF16 state with no loss: x is BF16-valued,
// so the state holds it exactly and the outputs are bit-identical to one call.
TEST(ShortConvTest, SplitCallsEqualOneCall) {
  const ConvInputs in = make_conv(130, 4, 11, 5);
  std::vector<float> y_whole(in.x.size()), y_split(in.x.size());
  std::vector<uint16_t> state_whole = in.state, state_split = in.state;
  short_conv_silu(ExecContext{2}, in.x.data(), 11, 130, in.w.data(), 4, state_whole.data(),
                  y_whole.data());
  int64_t t0 = 0;
  for (int64_t piece : {1, 2, 1, 5, 2}) {
    short_conv_silu(ExecContext{2}, in.x.data() + t0 * 130, piece, 130, in.w.data(), 4,
                    state_split.data(), y_split.data() + t0 * 130);
    t0 += piece;
  }
  EXPECT_EQ(y_split, y_whole);
  EXPECT_EQ(state_split, state_whole);
  // The state is the last 3 input rows.
  for (int64_t j = 0; j < 3; ++j) {
    for (int64_t c = 0; c < 130; ++c) {
      EXPECT_EQ(formats::decode_bf16(state_whole[j * 130 + c]), in.x[(8 + j) * 130 + c]);
    }
  }
}

// w[:, W−1] multiplies the current token and w[:, 0] the oldest state row (PyTorch
// cross-correlation), checked with one-hot taps.
TEST(ShortConvTest, LastTapIsCurrentToken) {
  ConvInputs in = make_conv(70, 4, 3, 9);
  for (int64_t tap : {0, 3}) {
    std::vector<float> w(static_cast<size_t>(70 * 4), 0.0f);
    for (int64_t c = 0; c < 70; ++c) w[c * 4 + tap] = 1.0f;
    std::vector<float> y(in.x.size());
    std::vector<uint16_t> state = in.state;
    short_conv_silu(ExecContext{1}, in.x.data(), 3, 70, w.data(), 4, state.data(), y.data());
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t c = 0; c < 70; ++c) {
        const float xp = tap == 3 ? in.x[t * 70 + c] : formats::decode_bf16(in.state[t * 70 + c]);
        EXPECT_FLOAT_EQ(y[t * 70 + c], xp / (1.0f + std::exp(-xp))) << "tap " << tap;
      }
    }
  }
}

TEST(ShortConvDeathTest, RejectsWideKernel) {
  ConvInputs in = make_conv(4, 4, 1, 3);
  std::vector<float> y(4);
  EXPECT_DEATH(
      short_conv_silu(ExecContext{1}, in.x.data(), 1, 4, in.w.data(), 9, in.state.data(), y.data()),
      "short conv width 9 not in \\[1, 8\\]");
}

}  // namespace short_conv_test
}  // namespace dz::kernels
