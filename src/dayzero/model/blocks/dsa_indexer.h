#pragma once
// The DSA lightning indexer, docs/models.md §3.1–3.3: index q from c_q, k from x with LayerNorm,
// RoPE (rotate-half by default: the §3.5 erratum), Hadamard, FP8 act_quant with power-of-two
// scales, keys appended to the paged FP8 index cache (docs/formats.md §5.4), then for each token
// the top k_t = min(index_topk, visible) positions by I[t,s] = sk(s)·Σ_h
// w_h(t)·ReLU(q8_h(t)·k8(s)), computed in one streaming pass over the cached keys (no L×L score
// matrix).

#include <cstdint>
#include <span>
#include <vector>

#include "dayzero/core/arena.h"
#include "dayzero/core/parallel.h"
#include "dayzero/kernels/linear.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/kernels/rope.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/taps.h"
#include "dayzero/model/tensor_visitor.h"

namespace dz::model {

struct DsaIndexerConfig {
  int64_t hidden_size = 0;
  int64_t q_lora_rank = 0;
  int64_t index_n_heads = 0;      // n_I
  int64_t index_head_dim = 0;     // d_I (128)
  int64_t index_topk = 0;         // K
  kernels::RopeFrequencies rope;  // qk_rope_head_dim wide, same YaRN frequencies as MLA
  kernels::RopeLayout rope_layout = kernels::RopeLayout::kRotateHalf;  // indexer_rope_interleave
  float k_norm_eps = 1e-6f;
};

struct DsaIndexerWeights {
  kernels::LinearWeight wq_b;          // [n_I·d_I, r_q]
  kernels::LinearWeight wk;            // [d_I, d]
  std::vector<float> k_norm_weight;    // [d_I]
  std::vector<float> k_norm_bias;      // [d_I]
  kernels::LinearWeight weights_proj;  // [n_I, d]
};

// The indexer's tensors under its prefix ("self_attn.indexer."). All replicated: a key's score
// sums over every index head before the top-k, so splitting the heads would cost an all-reduce
// of the scores per key. k_norm's dtype is (unverified): any float is accepted.
void visit_dsa_indexer_tensors(TensorVisitor& v, const DsaIndexerConfig& c, DsaIndexerWeights& w);

struct IndexLayerCache {
  kernels::IndexCacheLayout layout;
  std::byte* pool = nullptr;
};

class DsaIndexer {
 public:
  DsaIndexer(DsaIndexerConfig config, DsaIndexerWeights weights);

  const DsaIndexerConfig& config() const { return config_; }

  // x [num_tokens, d] (attention input after input_layernorm), c_q [num_tokens, r_q]. Appends each
  // token's key at batch.slot_mapping, then fills selection [num_tokens, index_topk] with the
  // chosen positions (ties: higher score first, then lower position), −1 padded when fewer are
  // visible.
  void select(const ExecContext& ctx, const ForwardBatch& batch, const float* x, const float* c_q,
              const IndexLayerCache& cache, std::span<int32_t> selection, Arena& scratch,
              TapSink* taps, int layer_id) const;
  // What select() takes from `scratch` for a step of at most max_tokens tokens whose sequences
  // reach at most max_range cached positions.
  size_t scratch_bytes(const ExecContext& ctx, int64_t max_tokens, int64_t max_range) const;

 private:
  // Context parallelism, the decode rows (docs/parallel.md §9.4): each rank scores only the keys
  // it owns, and the ranks' top-K (score, position) candidates are merged into each row's
  // selection.
  void select_sharded(const ExecContext& ctx, const ForwardBatch& batch, const uint8_t* q_codes,
                      const float* head_weights, const IndexLayerCache& cache,
                      std::span<int32_t> selection, float* scores, int layer_id) const;

  DsaIndexerConfig config_;
  DsaIndexerWeights weights_;
};

}  // namespace dz::model
