#pragma once
// One sequence through a CausalLm, for the CLI (`dayzero logits`, `dayzero generate`) until the
// engine of the runtime issue schedules many: a KV cache sized for max_tokens, the trivial block
// allocator, and one ForwardBatch per call to extend().

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/model/kv_cache.h"

namespace dz::runtime {

class SingleSequence {
 public:
  // Room for max_tokens positions in blocks of block_size tokens.
  static Result<SingleSequence> create(model::CausalLm& model, int64_t max_tokens,
                                       int64_t block_size);

  int64_t num_cached() const { return num_cached_; }

  // Runs `token_ids` at positions num_cached() … as one batch (a prefill chunk, or one decode
  // token) and appends them to the cache. logits receives [token_ids.size(), vocab] when
  // all_logits, else the last row only [1, vocab].
  Status extend(const ExecContext& ctx, std::span<const int32_t> token_ids, bool all_logits,
                std::vector<float>& logits);
  // The MTP head right after extend(): next_token_ids[i] follows the token extend() ran at its
  // position i (at most as many). logits receives [next_token_ids.size(), vocab], row i predicting
  // the token after next_token_ids[i].
  Status extend_mtp(const ExecContext& ctx, std::span<const int32_t> next_token_ids,
                    std::vector<float>& logits);

 private:
  model::ForwardBatch make_batch(std::span<const int32_t> token_ids, int64_t pos_begin,
                                 std::vector<int32_t>& positions,
                                 std::vector<int64_t>& slots) const;

  SingleSequence(model::CausalLm& model, model::KvCache cache, model::SequentialBlocks blocks,
                 int64_t max_tokens);

  model::CausalLm* model_;
  model::KvCache cache_;
  model::SequentialBlocks blocks_;
  int64_t max_tokens_;
  int64_t num_cached_ = 0;
  int64_t last_pos_begin_ = 0;  // where the last extend() started
};

}  // namespace dz::runtime
