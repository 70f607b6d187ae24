#include "dayzero/runtime/single_sequence.h"

#include <algorithm>
#include <numeric>

namespace dz::runtime {

SingleSequence::SingleSequence(model::CausalLm& model, model::KvCache cache,
                               model::SequentialBlocks blocks, int64_t max_tokens)
    : model_(&model),
      cache_(std::move(cache)),
      blocks_(std::move(blocks)),
      max_tokens_(max_tokens) {}

Result<SingleSequence> SingleSequence::create(model::CausalLm& model, int64_t max_tokens,
                                              int64_t block_size) {
  if (max_tokens <= 0 || block_size <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "a sequence needs max_tokens > 0 and block_size > 0 (got {} and {})",
                      max_tokens, block_size);
  const int64_t num_blocks = (max_tokens + block_size - 1) / block_size;
  std::vector<model::LayerCacheSpec> layers = model.cache_layers();
  // One recurrent-state slot (slot 0) when the model has recurrent layers (KDA).
  const bool recurrent = std::any_of(layers.begin(), layers.end(),
                                     [](const auto& spec) { return spec.kda.num_heads > 0; });
  DZ_ASSIGN_OR_RETURN(model::KvCache cache,
                      model::KvCache::create(layers, num_blocks, block_size, recurrent ? 1 : 0));
  return SingleSequence(model, std::move(cache), model::SequentialBlocks(num_blocks, block_size),
                        max_tokens);
}

Status SingleSequence::extend(const ExecContext& ctx, std::span<const int32_t> token_ids,
                              bool all_logits, std::vector<float>& logits) {
  const auto num_tokens = static_cast<int64_t>(token_ids.size());
  if (num_tokens == 0) return make_error(StatusCode::kInvalidArgument, "no tokens to run");
  if (num_cached_ + num_tokens > max_tokens_)
    return make_error(StatusCode::kInvalidArgument,
                      "{} cached + {} new tokens exceed the sequence's room for {}", num_cached_,
                      num_tokens, max_tokens_);
  DZ_RETURN_IF_ERROR(blocks_.reserve(num_cached_ + num_tokens));
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  model::ForwardBatch batch = make_batch(token_ids, num_cached_, positions, slots);
  std::vector<int64_t> rows;
  if (all_logits) {
    rows.resize(static_cast<size_t>(num_tokens));
    std::iota(rows.begin(), rows.end(), int64_t{0});
  } else {
    rows.push_back(num_tokens - 1);
  }
  logits.resize(rows.size() * static_cast<size_t>(model_->vocab_size()));
  DZ_RETURN_IF_ERROR(model_->forward(ctx, batch, cache_, rows, logits.data(), nullptr));
  last_pos_begin_ = num_cached_;
  num_cached_ += num_tokens;
  return Status::ok_status();
}

model::ForwardBatch SingleSequence::make_batch(std::span<const int32_t> token_ids,
                                               int64_t pos_begin, std::vector<int32_t>& positions,
                                               std::vector<int64_t>& slots) const {
  const auto num_tokens = static_cast<int64_t>(token_ids.size());
  positions.resize(static_cast<size_t>(num_tokens));
  slots.resize(static_cast<size_t>(num_tokens));
  for (int64_t i = 0; i < num_tokens; ++i) {
    positions[static_cast<size_t>(i)] = static_cast<int32_t>(pos_begin + i);
    slots[static_cast<size_t>(i)] = blocks_.slot_of(pos_begin + i);
  }
  return model::ForwardBatch{
      .token_ids = token_ids,
      .positions = positions,
      .slot_mapping = slots,
      .sequences = {model::SequenceSlice{.token_begin = 0,
                                         .num_tokens = num_tokens,
                                         .pos_begin = pos_begin,
                                         .block_table = blocks_.block_table(),
                                         .state_slot = 0}},
      .block_size = cache_.block_size(),
  };
}

Status SingleSequence::extend_mtp(const ExecContext& ctx, std::span<const int32_t> next_token_ids,
                                  std::vector<float>& logits) {
  const auto num_tokens = static_cast<int64_t>(next_token_ids.size());
  if (num_tokens == 0 || last_pos_begin_ + num_tokens > num_cached_)
    return make_error(StatusCode::kInvalidArgument,
                      "MTP: {} tokens do not fit the last step's positions [{}, {})", num_tokens,
                      last_pos_begin_, num_cached_);
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  model::ForwardBatch batch = make_batch(next_token_ids, last_pos_begin_, positions, slots);
  std::vector<int64_t> rows(static_cast<size_t>(num_tokens));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  logits.resize(rows.size() * static_cast<size_t>(model_->vocab_size()));
  return model_->forward_mtp(ctx, batch, cache_, rows, logits.data(), nullptr);
}

}  // namespace dz::runtime
