#pragma once
// Kimi Delta Attention, docs/models.md §4, with the numerics policy of docs/models.md §0, §4.1:
// projections and the conv output rounded to BF16, L2 norm, gate, β and the recurrence in FP32,
// gated RMSNorm rounded to BF16 before o_proj. The recurrent state and the conv rows live in a slot
// of the recurrent-state pool (docs/serving.md §1.6, docs/formats.md §5.5), one slot per sequence.

#include <cstdint>
#include <optional>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/taps.h"
#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

// Per-slot state of one KDA layer. num_heads 0: the layer has no KDA state.
struct KdaStateLayout {
  int64_t num_heads = 0;
  int64_t head_dim = 0;    // d_k = d_v
  int64_t conv_width = 0;  // W

  // H·d·d FP32: [H, d_v, d_k], V-first (docs/formats.md §5.5).
  int64_t state_floats() const { return num_heads * head_dim * head_dim; }
  // 3·(W−1)·H·d BF16 codes: [3 (q, k, v)][W−1 rows, oldest first][H·d], the pre-conv rows.
  int64_t conv_elems() const { return 3 * (conv_width - 1) * num_heads * head_dim; }
  int64_t slot_bytes() const { return state_floats() * 4 + conv_elems() * 2; }
};

// Where one KDA layer's slots live (KvCache::kda_layer).
struct KdaLayerState {
  KdaStateLayout layout{};
  float* states = nullptr;   // [num_slots, H, d_v, d_k]
  uint16_t* conv = nullptr;  // [num_slots, 3, W−1, H·d]
  int32_t num_slots = 0;     // KdaBlock::forward checks every sequence's slot against it

  float* state(int32_t slot) const { return states + slot * layout.state_floats(); }
  uint16_t* conv_rows(int32_t slot) const { return conv + slot * layout.conv_elems(); }
};

// kAuto: sequences with at most kKdaRecurrentMaxTokens new tokens (a decode step, a speculative
// verification row) run the recurrent kernel, longer ones the chunked one. The forced paths exist
// for tests and benchmarks; all three compute the same function.
enum class KdaPath : unsigned char { kAuto, kRecurrent, kChunked };
inline constexpr int64_t kKdaRecurrentMaxTokens = 8;

struct KdaConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t conv_width = 0;                   // short_conv_kernel_size
  std::optional<float> gate_lower_bound{};  // set: bounded gate lb·σ(e^A·f) (K3); else unbounded
  bool full_rank_gate = false;              // output gate g_proj; else g_a_proj · g_b_proj
  float o_norm_eps = 1e-5f;                 // rms_norm_eps
  int64_t chunk_size = 16;  // chunks aligned to absolute positions (docs/models.md §4.7)
  KdaPath path = KdaPath::kAuto;
  // Tensor parallelism (docs/parallel.md §1): num_heads are this rank's heads, the first being
  // global head head_offset (A_log is read whole), and o_proj's output is a partial sum the caller
  // all-reduces and then rounds; forward() leaves it in FP32.
  int64_t head_offset = 0;
  bool output_is_partial = false;
};

struct KdaWeights {
  kernels::LinearWeight q_proj{}, k_proj{}, v_proj{};  // [H·d, hidden] each
  std::vector<float> q_conv{}, k_conv{}, v_conv{};  // [H·d, W] FP32, tap W−1 on the current token
  kernels::LinearWeight f_a_proj{};                 // [r_f, hidden]
  kernels::LinearWeight f_b_proj{};                 // [H·d, r_f]
  kernels::LinearWeight b_proj{};                   // [H, hidden]
  std::vector<float> a_log{};    // [≥ H] FP32 of every head (K3 pads to 128; first H used)
  std::vector<float> dt_bias{};  // [H·d] FP32, h-major
  // Output gate: low rank (g_a_proj [r_g, hidden], g_b_proj [H·d, r_g]) or full rank g_proj
  // [H·d, hidden]; exactly one of the two forms.
  std::optional<kernels::LinearWeight> g_a_proj{}, g_b_proj{}, g_proj{};
  std::vector<float> o_norm{};     // [d], shared by all heads
  kernels::LinearWeight o_proj{};  // [hidden, H·d]
};

// The KDA tensors under the attention prefix ("self_attn."), as published: everything per head
// split with its heads, o_proj by row; the low-rank down-projections (rank d) and the shared
// o_norm replicated. K3's bounded-gate KDA ships conv, A_log, dt_bias and o_norm in F32 and pads
// A_log to d (first H used); Kimi-Linear only A_log and dt_bias. Any float dtype is accepted.
void visit_kda_tensors(TensorVisitor& v, const KdaConfig& c, KdaWeights& w);

class KdaBlock {
 public:
  // Checks the weight shapes against the config (DZ_CHECK: a recipe bug, not a request error).
  KdaBlock(KdaConfig config, KdaWeights weights);

  const KdaConfig& config() const { return config_; }

  // An upper bound of what forward() takes from `scratch` for a step of at most max_tokens tokens.
  size_t scratch_bytes(const ExecContext& ctx, int64_t max_tokens) const;

  // x: [T, hidden] normalized layer input (BF16-valued). Each sequence of `batch` reads and
  // updates the state slot seq.state_slot of `state`; a sequence with pos_begin == 0 starts from
  // zero state and zero conv rows whatever the slot held. out [T, hidden] = o_proj output rounded
  // to BF16. Taps (layer_id): kda_qkv [3, T, H·d] (SiLU(conv) rounded, before the L2 norm), kda_q,
  // kda_k, kda_v, kda_g [T, H·d], kda_beta [T, H], kda_core [T, H·d], kda_y [T, H·d] (o_proj's
  // input), attn_out [T, hidden].
  void forward(const ExecContext& ctx, const ForwardBatch& batch, const float* x,
               const KdaLayerState& state, float* out, Arena& scratch, TapSink* taps,
               int layer_id) const;

 private:
  // Context parallelism (docs/parallel.md §9.3): the pieces of split sequences this rank runs.
  // conv_pieces: q, k, v of the pieces, each piece's conv reading the last W−1 pre-conv rows
  // before it (gathered from the ranks that ran them), and the slots' conv rows after the step.
  void conv_pieces(const ExecContext& ctx, const ForwardBatch& batch, const float* hat,
                   const KdaLayerState& state, float* qkv, int layer_id) const;
  // recur_pieces: each piece from a zero state and from the identity (its summary: the state
  // after it is X·P + ΔX for a state X before it), the summaries of all pieces gathered, then
  // each piece's output corrected by its true initial state and the slots' final states folded.
  void recur_pieces(const ExecContext& ctx, const ForwardBatch& batch, const float* q,
                    const float* k, const float* v, const float* g, const float* beta,
                    const KdaLayerState& state, float* core, Arena& scratch, int layer_id) const;
  // Whether slice i of batch is a piece of a split sequence (run by the two functions above).
  static bool runs_piece(const ForwardBatch& batch, size_t slice);

  KdaConfig config_;
  KdaWeights weights_;
};

}  // namespace dz::model
