// KDA block, docs/models.md §4 with the numerics of docs/models.md §0, §4.1 (steps 1–8). The state
// pool holds FP32 recurrent states and BF16 pre-conv rows; both are reset for a sequence that
// starts at position 0, so a recycled slot never leaks into a new sequence.
#include "dayzero/model/blocks/kda.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/activations.h"
#include "dayzero/kernels/fast_math.h"
#include "dayzero/kernels/kda.h"
#include "dayzero/kernels/norms.h"
#include "dayzero/kernels/short_conv.h"

namespace dz::model {
namespace {

// Elementwise loops over tokens run in ranges of this many tokens.
constexpr int64_t kTokenGrain = 16;

// softplus(f) = log(1 + e^f), linear above 20 (PyTorch's threshold) where log1p(e^f) = f in FP32.
float softplus(float f) {
  return f > 20.0f ? f : std::log1p(std::exp(f));
}

int64_t low_rank_width(const KdaWeights& w) {
  return std::max(w.f_a_proj.out_features(), w.g_a_proj ? w.g_a_proj->out_features() : 0);
}

// FP32 buffers of forward(): pre-conv q̂ k̂ v̂ (once the conv has read them: g, the recurrence output
// and the gate logits z), q k v (once the recurrence has read q: y), the low-rank intermediate, β.
int64_t buffer_floats(const KdaConfig& c, const KdaWeights& w, int64_t num_tokens) {
  const int64_t hd = c.num_heads * c.head_dim;
  return num_tokens * (6 * hd + low_rank_width(w) + c.num_heads);
}

// The conv rows each snapshot slot of `seq` holds after its token (ForwardBatch's snapshot_slots):
// the last W−1 rows of [the slot's rows before the step; the slice's pre-conv rows up to that
// token]. Runs before the conv replaces the slot's rows. hat: [3, T, H·d], BF16-valued.
void snapshot_conv_rows(const SequenceSlice& seq, const float* hat, int64_t T,
                        const KdaLayerState& state) {
  const int64_t hd = state.layout.num_heads * state.layout.head_dim;
  const int64_t rows = state.layout.conv_width - 1;
  const uint16_t* before = state.conv_rows(seq.state_slot);
  const auto num_snapshots = static_cast<int64_t>(seq.snapshot_slots.size());
  for (int64_t j = 0; j < num_snapshots; ++j) {
    const int64_t token = seq.num_tokens - 1 - num_snapshots + j;  // within the slice
    uint16_t* out = state.conv_rows(seq.snapshot_slots[static_cast<size_t>(j)]);
    for (int64_t m = 0; m < 3; ++m)
      for (int64_t r = 0; r < rows; ++r) {
        // Row r (oldest first) is row token + 1 + r of [before; slice].
        const int64_t i = token + 1 + r;
        uint16_t* dst = out + (m * rows + r) * hd;
        if (i < rows) {
          std::copy_n(before + (m * rows + i) * hd, hd, dst);
          continue;
        }
        const float* src = hat + m * T * hd + (seq.token_begin + i - rows) * hd;
        for (int64_t e = 0; e < hd; ++e) dst[e] = formats::encode_bf16(src[e]);
      }
  }
}

void check_linear(const kernels::LinearWeight& w, const char* name, int64_t out, int64_t in) {
  DZ_CHECK(w.out_features() == out && w.in_features() == in, "KDA {} is [{}, {}], want [{}, {}]",
           name, w.out_features(), w.in_features(), out, in);
}

}  // namespace

void visit_kda_tensors(TensorVisitor& v, const KdaConfig& c, KdaWeights& w) {
  const int64_t H = c.num_heads, d = c.head_dim, hd = H * d, hidden = c.hidden_size;
  const bool bounded = c.gate_lower_bound.has_value();
  const DType small = bounded ? DType::kF32 : DType::kBF16;
  constexpr auto kYes = Quantizable::kYes;
  struct Input {  // q, k, v: a projection and its short conv
    const char* name;
    kernels::LinearWeight& proj;
    std::vector<float>& conv;
  };
  for (const Input& in : {Input{"q", w.q_proj, w.q_conv}, Input{"k", w.k_proj, w.k_conv},
                          Input{"v", w.v_proj, w.v_conv}}) {
    v.linear(fmt::format("{}_proj", in.name), hd, hidden, Split::kColumn, kYes, in.proj);
    v.floats(fmt::format("{}_conv1d.weight", in.name), {hd, 1, c.conv_width}, small, Split::kColumn,
             in.conv);
  }
  v.linear("f_a_proj", d, hidden, Split::kReplicated, kYes, w.f_a_proj);
  v.linear("f_b_proj", hd, d, Split::kColumn, kYes, w.f_b_proj);
  v.linear("b_proj", H, hidden, Split::kColumn, kYes, w.b_proj);
  // Whole on every rank (a few hundred bytes, padded in K3): each rank reads its heads' values.
  v.floats("A_log", bounded ? Shape{d} : Shape{1, 1, H, 1}, DType::kF32, Split::kReplicated,
           w.a_log);
  v.floats("dt_bias", {hd}, DType::kF32, Split::kColumn, w.dt_bias);
  if (c.full_rank_gate) {
    v.linear("g_proj", hd, hidden, Split::kColumn, kYes, w.g_proj.emplace());
  } else {
    v.linear("g_a_proj", d, hidden, Split::kReplicated, kYes, w.g_a_proj.emplace());
    v.linear("g_b_proj", hd, d, Split::kColumn, kYes, w.g_b_proj.emplace());
  }
  v.floats("o_norm.weight", {d}, small, Split::kReplicated, w.o_norm);
  v.linear("o_proj", hidden, hd, Split::kRow, kYes, w.o_proj);
}

KdaBlock::KdaBlock(KdaConfig config, KdaWeights weights)
    : config_(std::move(config)), weights_(std::move(weights)) {
  const KdaConfig& c = config_;
  const KdaWeights& w = weights_;
  const int64_t H = c.num_heads, d = c.head_dim, hd = H * d, hidden = c.hidden_size;
  DZ_CHECK(H > 0 && d > 0 && hidden > 0 && c.conv_width >= 1 &&
               c.conv_width <= kernels::kMaxShortConvWidth && c.chunk_size > 0 &&
               c.chunk_size <= 64,
           "KDA config: heads {}, head_dim {}, hidden {}, conv width {}, chunk {}", H, d, hidden,
           c.conv_width, c.chunk_size);
  check_linear(w.q_proj, "q_proj", hd, hidden);
  check_linear(w.k_proj, "k_proj", hd, hidden);
  check_linear(w.v_proj, "v_proj", hd, hidden);
  for (const auto* conv : {&w.q_conv, &w.k_conv, &w.v_conv})
    DZ_CHECK(static_cast<int64_t>(conv->size()) == hd * c.conv_width,
             "KDA conv weight has {} values, want {}", conv->size(), hd * c.conv_width);
  check_linear(w.f_a_proj, "f_a_proj", w.f_a_proj.out_features(), hidden);
  check_linear(w.f_b_proj, "f_b_proj", hd, w.f_a_proj.out_features());
  check_linear(w.b_proj, "b_proj", H, hidden);
  DZ_CHECK(static_cast<int64_t>(w.a_log.size()) >= c.head_offset + H,
           "KDA A_log has {} values, want >= {}", w.a_log.size(), c.head_offset + H);
  DZ_CHECK(static_cast<int64_t>(w.dt_bias.size()) == hd, "KDA dt_bias has {} values, want {}",
           w.dt_bias.size(), hd);
  const bool low_rank = w.g_a_proj.has_value() && w.g_b_proj.has_value();
  DZ_CHECK(low_rank != w.g_proj.has_value() && w.g_a_proj.has_value() == w.g_b_proj.has_value(),
           "KDA output gate needs g_a_proj + g_b_proj or g_proj, not both or neither");
  if (low_rank) {
    check_linear(*w.g_a_proj, "g_a_proj", w.g_a_proj->out_features(), hidden);
    check_linear(*w.g_b_proj, "g_b_proj", hd, w.g_a_proj->out_features());
  } else {
    check_linear(*w.g_proj, "g_proj", hd, hidden);
  }
  DZ_CHECK(static_cast<int64_t>(w.o_norm.size()) == d, "KDA o_norm has {} values, want {}",
           w.o_norm.size(), d);
  check_linear(w.o_proj, "o_proj", hidden, hd);
}

size_t KdaBlock::scratch_bytes(const ExecContext& ctx, int64_t max_tokens) const {
  const kernels::KdaDims dims{.num_heads = config_.num_heads, .head_dim = config_.head_dim};
  const size_t chunked = kernels::kda_chunked_scratch_bytes(ctx, dims, config_.chunk_size);
  // The chunked calls run one after another, each releasing its workspace (Arena::release).
  return static_cast<size_t>(buffer_floats(config_, weights_, max_tokens)) * 4 +
         8 * kBufferAlignment + chunked + kBufferAlignment;
}

void KdaBlock::forward(const ExecContext& ctx, const ForwardBatch& batch, const float* x,
                       const KdaLayerState& state, float* out, Arena& scratch, TapSink* taps,
                       int layer_id) const {
  const KdaConfig& c = config_;
  const KdaWeights& w = weights_;
  const int64_t T = batch.num_tokens(), H = c.num_heads, d = c.head_dim, hd = H * d;
  const int64_t W = c.conv_width;
  DZ_CHECK(
      state.layout.num_heads == H && state.layout.head_dim == d && state.layout.conv_width == W,
      "KDA state slots hold [{}, {}] width {}, block wants [{}, {}] width {}",
      state.layout.num_heads, state.layout.head_dim, state.layout.conv_width, H, d, W);
  for (const SequenceSlice& seq : batch.sequences)
    DZ_CHECK(seq.num_tokens == 0 || (seq.state_slot >= 0 && seq.state_slot < state.num_slots),
             "KDA layer {}: sequence at token {} has state slot {}, the pool has {}", layer_id,
             seq.token_begin, seq.state_slot, state.num_slots);
  if (T == 0) return;

  // 1. q̂, k̂, v̂ = projections rounded to BF16: hat [3, T, H·d].
  float* hat = scratch.allocate_floats(3 * T * hd);
  const kernels::LinearWeight* proj[3] = {&w.q_proj, &w.k_proj, &w.v_proj};
  for (int i = 0; i < 3; ++i) proj[i]->forward(ctx, x, T, hat + i * T * hd);
  kernels::round_to_bf16(hat, 3 * T * hd);

  // 2. q, k, v = SiLU(conv) rounded to BF16, per sequence over its slot's conv rows.
  float* qkv = scratch.allocate_floats(3 * T * hd);
  const float* conv_w[3] = {w.q_conv.data(), w.k_conv.data(), w.v_conv.data()};
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& seq = batch.sequences[i];
    if (seq.num_tokens == 0 || runs_piece(batch, i)) continue;
    if (seq.pos_begin == 0) {  // a new sequence: zero state and zero rows before it
      std::fill_n(state.state(seq.state_slot), state.layout.state_floats(), 0.0f);
      std::fill_n(state.conv_rows(seq.state_slot), state.layout.conv_elems(), uint16_t{0});
    }
    DZ_CHECK(static_cast<int64_t>(seq.snapshot_slots.size()) < seq.num_tokens,
             "KDA layer {}: {} snapshots of a {}-token slice", layer_id, seq.snapshot_slots.size(),
             seq.num_tokens);
    if (!seq.snapshot_slots.empty()) snapshot_conv_rows(seq, hat, T, state);
    for (int m = 0; m < 3; ++m)
      kernels::short_conv_silu(ctx, hat + m * T * hd + seq.token_begin * hd, seq.num_tokens, hd,
                               conv_w[m], W, state.conv_rows(seq.state_slot) + m * (W - 1) * hd,
                               qkv + m * T * hd + seq.token_begin * hd);
  }
  if (batch.context != nullptr) conv_pieces(ctx, batch, hat, state, qkv, layer_id);
  kernels::round_to_bf16(qkv, 3 * T * hd);
  tap(taps, layer_id, "kda_qkv", qkv, Shape{3, T, hd});
  float* q = qkv;
  float* k = qkv + T * hd;
  const float* v = qkv + 2 * T * hd;

  // 3. L2 norm per head, FP32 (not rounded afterwards).
  kernels::l2_normalize(ctx, qkv, 2 * T * H, d, 1e-6f);
  tap(taps, layer_id, "kda_q", q, Shape{T, hd});
  tap(taps, layer_id, "kda_k", k, Shape{T, hd});
  tap(taps, layer_id, "kda_v", v, Shape{T, hd});

  // 4. g = gate(round(f_b(round(f_a(x)))) + dt_bias), FP32.
  float* low = scratch.allocate_floats(T * low_rank_width(w));
  float* g = hat;  // q̂ is consumed
  const int64_t r_f = w.f_a_proj.out_features();
  w.f_a_proj.forward(ctx, x, T, low);
  kernels::round_to_bf16(low, T * r_f);
  w.f_b_proj.forward(ctx, low, T, g);
  kernels::round_to_bf16(g, T * hd);
  parallel_for(ctx, T, kTokenGrain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const float decay = std::exp(w.a_log[static_cast<size_t>(c.head_offset + h)]);
        float* gh = g + t * hd + h * d;
        const float* bias = w.dt_bias.data() + h * d;
        if (c.gate_lower_bound) {
          kernels::scaled_sigmoid(gh, bias, d, decay, *c.gate_lower_bound);
        } else {
          for (int64_t i = 0; i < d; ++i) gh[i] = -decay * softplus(gh[i] + bias[i]);
        }
      }
    }
  });
  tap(taps, layer_id, "kda_g", g, Shape{T, hd});

  // 5. β = σ(round(b_proj(x))), [T, H].
  float* beta = scratch.allocate_floats(T * H);
  w.b_proj.forward(ctx, x, T, beta);
  for (int64_t i = 0; i < T * H; ++i)
    beta[i] = kernels::sigmoid_fast(formats::round_to_bf16(beta[i]));
  tap(taps, layer_id, "kda_beta", beta, Shape{T, H});

  // 6. The recurrence per sequence, on its slot's state.
  float* core = hat + T * hd;  // k̂ is consumed
  const kernels::KdaDims dims{.num_heads = H, .head_dim = d};
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const SequenceSlice& seq = batch.sequences[i];
    if (seq.num_tokens == 0 || runs_piece(batch, i)) continue;
    float* s = state.state(seq.state_slot);
    // Tokens [t0, t0 + n) from state `from` into state `to`: the recurrence for a few (reading
    // `from` directly), chunks for more (in place, after a copy).
    const auto run = [&](int64_t t0, int64_t n, int64_t pos, const float* from, float* to) {
      if (c.path == KdaPath::kRecurrent ||
          (c.path == KdaPath::kAuto && n <= kKdaRecurrentMaxTokens)) {
        kernels::kda_recurrent(ctx, dims, q + t0 * hd, k + t0 * hd, v + t0 * hd, g + t0 * hd,
                               beta + t0 * H, n, to, core + t0 * hd, from);
        return;
      }
      if (from != to) std::copy_n(from, state.layout.state_floats(), to);
      const size_t mark = scratch.mark();
      kernels::kda_chunked(ctx, dims, q + t0 * hd, k + t0 * hd, v + t0 * hd, g + t0 * hd,
                           beta + t0 * H, n, pos, c.chunk_size, to, core + t0 * hd, scratch);
      scratch.release(mark);
    };
    // With snapshots (a verified row): up to the token before the first snapshot in place, then
    // token by token, each writing the state after it into its snapshot slot, the last one back
    // into the live slot (the recurrence per token is a decode step's, so verified tokens match
    // decode bit for bit).
    const auto num_snapshots = static_cast<int64_t>(seq.snapshot_slots.size());
    if (num_snapshots == 0) {
      run(seq.token_begin, seq.num_tokens, seq.pos_begin, s, s);
      continue;
    }
    const int64_t last_in_place = seq.num_tokens - num_snapshots - 1;  // ≥ 0 (checked above)
    run(seq.token_begin, last_in_place, seq.pos_begin, s, s);
    const float* from = s;
    for (int64_t j = 0; j <= num_snapshots; ++j) {
      float* to = j < num_snapshots ? state.state(seq.snapshot_slots[static_cast<size_t>(j)]) : s;
      run(seq.token_begin + last_in_place + j, 1, seq.pos_begin + last_in_place + j, from, to);
      from = to;
    }
  }
  if (batch.context != nullptr)
    recur_pieces(ctx, batch, q, k, v, g, beta, state, core, scratch, layer_id);
  tap(taps, layer_id, "kda_core", core, Shape{T, hd});

  // 7. z = output gate logits (into v̂'s rows), y = RMSNorm_d(o_h) ⊙ σ(z_h) rounded (into q's).
  float* z = hat + 2 * T * hd;
  float* y = q;
  if (w.g_proj) {
    w.g_proj->forward(ctx, x, T, z);
  } else {
    const int64_t r_g = w.g_a_proj->out_features();
    w.g_a_proj->forward(ctx, x, T, low);
    kernels::round_to_bf16(low, T * r_g);
    w.g_b_proj->forward(ctx, low, T, z);
  }
  kernels::round_to_bf16(z, T * hd);
  kernels::rms_norm(ctx, core, d, w.o_norm.data(), y, d, T * H, d, c.o_norm_eps);
  parallel_for(ctx, T, kTokenGrain, [&](int64_t begin, int64_t end) {
    kernels::sigmoid_product_bf16(y + begin * hd, z + begin * hd, (end - begin) * hd);
  });
  tap(taps, layer_id, "kda_y", y, Shape{T, hd});

  // 8. out = o_proj(y) rounded to BF16.
  w.o_proj.forward(ctx, y, T, out);
  if (c.output_is_partial) return;
  kernels::round_to_bf16(out, T * c.hidden_size);
  tap(taps, layer_id, "attn_out", out, Shape{T, c.hidden_size});
}

}  // namespace dz::model
