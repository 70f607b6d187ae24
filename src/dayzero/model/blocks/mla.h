#pragma once
// Multi-head latent attention, docs/models.md §2: projections (§2.1), the prefill form with
// up-projected keys and values (§2.2) and the decode form with weight absorption over the cached
// latent (§2.3), over a paged latent cache (docs/formats.md §5.2–5.3). Dense causal attention, or
// sparse attention over per-token selections from the DSA indexer (docs/models.md §3.4).

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "dayzero/core/aligned_buffer.h"
#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/kernels/mla_attention.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/kernels/rope.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/taps.h"
#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

struct MlaConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;
  int64_t q_lora_rank = 0;  // 0: no q LoRA, q = Linear(x; q_proj) (Kimi-Linear)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  float softmax_scale = 0;    // (d_n + d_r)^(−1/2) · M², docs/models.md §1.3
  float q_norm_eps = 1e-6f;   // q_a_layernorm
  float kv_norm_eps = 1e-6f;  // kv_a_layernorm
  std::optional<kernels::RopeFrequencies> rope;  // interleaved; nullopt for NoPE (Kimi)
  bool output_gate = false;  // K3: o_h ⊙ σ(Linear(x; g_proj))_h before o_proj
  // Tensor parallelism (docs/parallel.md §1): num_heads are this rank's heads, and o_proj's output
  // is a partial sum the caller all-reduces and then rounds; forward() leaves it in FP32.
  bool output_is_partial = false;
};

struct MlaWeights {
  std::optional<kernels::LinearWeight> q_a_proj;  // [r_q, d]          (q LoRA)
  std::vector<float> q_a_layernorm;               // [r_q]
  kernels::LinearWeight q_b_proj;                 // [H·(d_n+d_r), r_q] or q_proj [H·(d_n+d_r), d]
  kernels::LinearWeight kv_a_proj_with_mqa;       // [r_kv + d_r, d]
  std::vector<float> kv_a_layernorm;              // [r_kv]
  kernels::LinearWeight kv_b_proj;                // [H·(d_n+d_v), r_kv]
  kernels::LinearWeight o_proj;                   // [d, H·d_v]
  std::optional<kernels::LinearWeight> g_proj;    // [H·d_v, d] (output gate)
};

// The MLA tensors under the attention prefix ("self_attn."), as published: heads split by
// column (q_b, kv_b, g), o_proj by row; the LoRA down-projections and their norms replicated.
void visit_mla_tensors(TensorVisitor& v, const MlaConfig& c, MlaWeights& w);

// Per-token selections from the indexer: [num_tokens, width] positions (0-based in the sequence),
// −1 padded. Empty (width 0) means dense causal attention.
struct TokenSelection {
  std::span<const int32_t> positions;
  int64_t width = 0;
};

// Where one MLA layer's latent records live.
struct MlaLayerCache {
  kernels::MlaCacheLayout layout;
  std::byte* pool = nullptr;  // num_blocks · block_size records
};

// FLOPs of the two attention forms for one query chunk of a sequence (docs/models.md §2.2–2.3; the
// projections and the per-(query, key) scores and values, not softmax): the absorbed form applies
// W_UK/W_UV once per query, the prefill form once per key it up-projects (the causal range, or
// the 64-key blocks a selection touches) and then works in the smaller head dims. forward() runs
// each chunk in the cheaper form: decode rows and short chunks over a long cached context
// (prefix hits, chunked prefill) absorbed, long fresh chunks in the prefill form.
struct MlaFormFlops {
  double absorbed = 0;
  double prefill = 0;
};
MlaFormFlops mla_form_flops(const MlaConfig& config, const kernels::MlaQueryKeys& keys);

class MlaBlock {
 public:
  // Repacks what the forms need once (W_UK, W_UV per head from kv_b_proj).
  MlaBlock(MlaConfig config, MlaWeights weights);

  const MlaConfig& config() const { return config_; }

  // c_q [num_tokens, r_q] = RMSNorm_qa(Linear(x; q_a_proj)), BF16-valued; the DSA indexer reads it.
  // Requires q_lora_rank > 0.
  void q_latent(const ExecContext& ctx, const float* x, int64_t num_tokens, float* c_q) const;

  // x: [num_tokens, d] normalized attention input (BF16-valued); c_q as from q_latent (nullptr
  // without q LoRA). Writes every token's latent record into the cache at batch.slot_mapping, then
  // attends each token to its allowed keys (causal prefix of its sequence, or `selection`) and
  // writes out [num_tokens, d] (FP32, before the residual add). Runs each query chunk of a
  // sequence in the form with fewer FLOPs (mla_form_flops); both read keys from the cache.
  // An upper bound of what forward() takes from `scratch` for a step of at most max_tokens tokens
  // and selections of at most max_selection_width (0: dense).
  size_t scratch_bytes(const ExecContext& ctx, int64_t max_tokens,
                       int64_t max_selection_width) const;

  void forward(const ExecContext& ctx, const ForwardBatch& batch, const float* x, const float* c_q,
               const MlaLayerCache& cache, const TokenSelection& selection, float* out,
               Arena& scratch, TapSink* taps, int layer_id) const;

 private:
  // Context parallelism, the decode rows (docs/parallel.md §9.4): attention over the keys this
  // rank owns (of the selection, or of the causal prefix), the ranks' partial outputs merged by
  // log-sum-exp; writes those rows of o [T, H, d_v].
  void attend_sharded(const ExecContext& ctx, const ForwardBatch& batch, const float* q,
                      const MlaLayerCache& cache, const TokenSelection& selection, float* o,
                      std::span<std::byte> workspace, int layer_id) const;

  const uint16_t* w_uk() const { return reinterpret_cast<const uint16_t*>(w_uk_.data()); }
  const uint16_t* w_uv() const { return reinterpret_cast<const uint16_t*>(w_uv_.data()); }

  MlaConfig config_;
  MlaWeights weights_;
  AlignedBuffer w_uk_;  // [H, d_n, r_kv] BF16 codes
  AlignedBuffer w_uv_;  // [H, d_v, r_kv] BF16 codes
};

}  // namespace dz::model
