// Sequence-parallel KDA under context parallelism (docs/parallel.md §9.3). A split sequence's
// pieces run on different ranks; a piece needs the W−1 pre-conv rows before it and the recurrent
// state before it. Both come from the other ranks as per-piece data whose size does not depend on
// the piece's length: the last W−1 pre-conv rows of each piece, and each piece's summary (P, ΔX).
//
// In the kernels' V-first layout X [d_v, d_k] (kernels/kda.h) one token maps X ↦ X·A_t + u-terms
// with A_t = Diag(e^{g_t})(I − β_t k_t k_tᵀ), so a piece maps its initial state X to
// X·P + ΔX with P = Π A_t (in token order) and ΔX its final state from zero. Running the chunked
// kernel from X = I with v = 0 yields P as its final state (d_v = d_k) and o^I_t = P_{≤t}·(q_t/√d)
// as its outputs; running it from zero yields ΔX and o^0. The true output is then
// o_t = o^0_t + X·o^I_t, and the state after the piece X·P + ΔX: two independent passes per piece,
// then one gather of 2·H·d² floats per piece. Every rank folds every piece's summary in sequence
// order with the same arithmetic, so the slot's final state has the same bits on every rank.
#include <algorithm>
#include <cstring>
#include <tuple>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/kda.h"
#include "dayzero/kernels/short_conv.h"
#include "dayzero/model/blocks/kda.h"
#include "dayzero/model/context_parallel.h"

namespace dz::model {
namespace {

// out [d, d] = x [d, d] · p [d, d] + dx [d, d], FP32 in a fixed order (same bits on every rank).
void compose(const float* x, const float* p, const float* dx, int64_t d, float* out) {
  for (int64_t i = 0; i < d; ++i) {
    float* row = out + i * d;
    std::copy_n(dx + i * d, d, row);
    for (int64_t k = 0; k < d; ++k) {
      const float a = x[i * d + k];
      const float* p_row = p + k * d;
      for (int64_t j = 0; j < d; ++j) row[j] += a * p_row[j];
    }
  }
}

}  // namespace

bool KdaBlock::runs_piece(const ForwardBatch& batch, size_t slice) {
  return batch.context != nullptr && batch.context->piece_of_slice(slice).has_value();
}

void KdaBlock::conv_pieces(const ExecContext& ctx, const ForwardBatch& batch, const float* hat,
                           const KdaLayerState& state, float* qkv, int layer_id) const {
  const ContextSplit& split = *batch.context;
  if (split.num_split() == 0) return;
  const int64_t T = batch.num_tokens(), hd = config_.num_heads * config_.head_dim;
  const int64_t W = config_.conv_width, halo = W - 1;
  const int64_t tail_floats =
      3 * halo * hd;  // [3 (q, k, v), W−1, H·d], the last rows, right-aligned

  // The last min(W−1, n) pre-conv rows of each of this rank's pieces.
  std::vector<float> tails(static_cast<size_t>(split.num_split() * 2 * tail_floats), 0.0f);
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const std::optional<ContextPiece> piece = split.piece_of_slice(i);
    if (!piece) continue;
    const SequenceSlice& seq = batch.sequences[i];
    float* tail = tails.data() + split.mine_index(*piece) * tail_floats;
    const int64_t rows = std::min(halo, seq.num_tokens);
    for (int m = 0; m < 3; ++m)
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(hat + m * T * hd + (seq.token_begin + seq.num_tokens - rows + r) * hd, hd,
                    tail + (m * halo + halo - rows + r) * hd);
  }
  const std::vector<float> all = split.gather_pieces(tails, tail_floats, layer_id);

  // rows_before(s, j): the W−1 pre-conv rows before piece j of split sequence s (j = 2C: after
  // the last), BF16 codes [3, W−1, H·d] as the conv state holds them.
  const auto rows_before = [&](int64_t s, int piece, const uint16_t* start) {
    std::vector<uint16_t> rows(static_cast<size_t>(tail_floats));
    for (int m = 0; m < 3; ++m) {
      int64_t need = halo;  // rows still to fill, from the back
      for (int j = piece - 1; j >= 0 && need > 0; --j) {
        const int64_t have = std::min(halo, split.piece_end(s, j) - split.piece_begin(s, j));
        const float* tail = all.data() + (s * split.num_pieces() + j) * tail_floats + m * halo * hd;
        for (int64_t r = 0; r < have && need > 0; ++r, --need)
          for (int64_t c = 0; c < hd; ++c)
            rows[static_cast<size_t>((m * halo + need - 1) * hd + c)] =
                formats::encode_bf16(tail[(halo - 1 - r) * hd + c]);
      }
      for (int64_t r = 0; r < need; ++r)  // the oldest from the rows before the step
        std::copy_n(start + (m * halo + halo - need + r) * hd, hd,
                    rows.data() + (m * halo + r) * hd);
    }
    return rows;
  };

  const float* conv_w[3] = {weights_.q_conv.data(), weights_.k_conv.data(), weights_.v_conv.data()};
  std::vector<uint16_t> zero_rows(static_cast<size_t>(tail_floats), 0);
  for (int64_t s = 0; s < split.num_split(); ++s) {
    const SequenceSlice& seq = split.split_sequence(s);
    const uint16_t* start = seq.pos_begin == 0 ? zero_rows.data() : state.conv_rows(seq.state_slot);
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      const std::optional<ContextPiece> piece = split.piece_of_slice(i);
      if (!piece || piece->sequence != s) continue;
      const SequenceSlice& mine = batch.sequences[i];
      std::vector<uint16_t> rows = rows_before(s, piece->piece, start);
      for (int m = 0; m < 3; ++m)
        kernels::short_conv_silu(ctx, hat + m * T * hd + mine.token_begin * hd, mine.num_tokens, hd,
                                 conv_w[m], W, rows.data() + m * halo * hd,
                                 qkv + m * T * hd + mine.token_begin * hd);
    }
    const std::vector<uint16_t> after = rows_before(s, split.num_pieces(), start);
    std::copy(after.begin(), after.end(), state.conv_rows(seq.state_slot));
  }
}

void KdaBlock::recur_pieces(const ExecContext& ctx, const ForwardBatch& batch, const float* q,
                            const float* k, const float* v, const float* g, const float* beta,
                            const KdaLayerState& state, float* core, Arena& scratch,
                            int layer_id) const {
  const ContextSplit& split = *batch.context;
  if (split.num_split() == 0) return;
  const int64_t H = config_.num_heads, d = config_.head_dim, hd = H * d, dd = d * d;
  const int64_t summary_floats = 2 * H * dd;  // [P | ΔX], each [H, d_v, d_k]
  const kernels::KdaDims dims{.num_heads = H, .head_dim = d};

  // o^I of this rank's pieces, by local token [T, H·d].
  std::vector<float> o_identity(static_cast<size_t>(batch.num_tokens() * hd));
  std::vector<float> summaries(static_cast<size_t>(split.num_split() * 2 * summary_floats));
  for (size_t i = 0; i < batch.sequences.size(); ++i) {
    const std::optional<ContextPiece> piece = split.piece_of_slice(i);
    if (!piece) continue;
    const SequenceSlice& seq = batch.sequences[i];
    const int64_t t0 = seq.token_begin, n = seq.num_tokens;
    float* p = summaries.data() + split.mine_index(*piece) * summary_floats;
    float* delta = p + H * dd;
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < d; ++c) p[h * dd + c * d + c] = 1.0f;
    const std::vector<float> no_values(static_cast<size_t>(n * hd), 0.0f);
    const bool recurrent =
        config_.path == KdaPath::kRecurrent || (config_.path == KdaPath::kAuto && n == 1);
    for (auto [values, s, out] : {std::tuple{v + t0 * hd, delta, core + t0 * hd},
                                  std::tuple{no_values.data(), p, o_identity.data() + t0 * hd}}) {
      if (recurrent) {
        kernels::kda_recurrent(ctx, dims, q + t0 * hd, k + t0 * hd, values, g + t0 * hd,
                               beta + t0 * H, n, s, out);
        continue;
      }
      const size_t mark = scratch.mark();
      kernels::kda_chunked(ctx, dims, q + t0 * hd, k + t0 * hd, values, g + t0 * hd, beta + t0 * H,
                           n, seq.pos_begin, config_.chunk_size, s, out, scratch);
      scratch.release(mark);
    }
  }
  const std::vector<float> all = split.gather_pieces(summaries, summary_floats, layer_id);

  std::vector<float> x(static_cast<size_t>(H * dd)), next(x.size());
  for (int64_t s = 0; s < split.num_split(); ++s) {
    const SequenceSlice& seq = split.split_sequence(s);
    if (seq.pos_begin == 0)
      std::fill(x.begin(), x.end(), 0.0f);
    else
      std::copy_n(state.state(seq.state_slot), H * dd, x.data());
    for (int piece = 0; piece < split.num_pieces(); ++piece) {
      if (split.owner(piece) == split.rank()) {  // o_t += X·o^I_t for this piece's tokens
        for (size_t i = 0; i < batch.sequences.size(); ++i) {
          const std::optional<ContextPiece> mine = split.piece_of_slice(i);
          if (!mine || mine->sequence != s || mine->piece != piece) continue;
          const SequenceSlice& slice = batch.sequences[i];
          parallel_for(ctx, slice.num_tokens * H, 16, [&](int64_t begin, int64_t end) {
            for (int64_t row = begin; row < end; ++row) {
              const int64_t t = slice.token_begin + row / H, h = row % H;
              const float* xh = x.data() + h * dd;
              const float* oi = o_identity.data() + t * hd + h * d;
              float* o = core + t * hd + h * d;
              for (int64_t r = 0; r < d; ++r) {
                float sum = 0;
                for (int64_t c = 0; c < d; ++c) sum += xh[r * d + c] * oi[c];
                o[r] += sum;
              }
            }
          });
        }
      }
      const float* p = all.data() + (s * split.num_pieces() + piece) * summary_floats;
      parallel_for(ctx, H, 1, [&](int64_t begin, int64_t end) {
        for (int64_t h = begin; h < end; ++h)
          compose(x.data() + h * dd, p + h * dd, p + H * dd + h * dd, d, next.data() + h * dd);
      });
      x.swap(next);
    }
    std::copy(x.begin(), x.end(), state.state(seq.state_slot));
  }
}

}  // namespace dz::model
