#include "dayzero/model/hybrid_model.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "dayzero/core/check.h"
#include "dayzero/kernels/norms.h"
#include "dayzero/model/blocks/attn_res.h"

namespace dz::model {
namespace {

// x ← round_bf16(x + delta): the plain residual add in FP32, stored BF16 (docs/models.md §0).
void add_residual(float* x, const float* delta, int64_t num_elems) {
  for (int64_t i = 0; i < num_elems; ++i) x[i] += delta[i];
  kernels::round_to_bf16(x, num_elems);
}

// The AttnRes state of one forward (docs/models.md §5): completed block sums and the running
// prefix, FP32 and never rounded. Lives for one forward only: nothing crosses steps.
class AttnResStack {
 public:
  AttnResStack(int64_t num_tokens, int64_t dim, float eps)
      : num_elems_(num_tokens * dim), num_tokens_(num_tokens), dim_(dim), eps_(eps) {}

  float* prefix() { return prefix_.data(); }
  void start(const float* embedding) { prefix_.assign(embedding, embedding + num_elems_); }
  // out [T, d] = mix(bank ++ [P]) with the given folded query.
  void mix(const ExecContext& ctx, const std::vector<float>& query, float* out) const {
    std::vector<const float*> rows;
    for (const std::vector<float>& row : bank_) rows.push_back(row.data());
    rows.push_back(prefix_.data());
    attn_res_mix(ctx, rows, query.data(), num_tokens_, dim_, eps_, out);
  }
  // A write layer: the running prefix becomes a bank row and restarts at zero.
  void write() {
    bank_.push_back(prefix_);
    std::fill(prefix_.begin(), prefix_.end(), 0.0f);
  }
  void add(const float* delta) {
    for (int64_t i = 0; i < num_elems_; ++i) prefix_[static_cast<size_t>(i)] += delta[i];
  }

 private:
  int64_t num_elems_, num_tokens_, dim_;
  float eps_;
  std::vector<std::vector<float>> bank_;  // each [T, d]
  std::vector<float> prefix_;             // P [T, d]
};

}  // namespace

void visit_model_globals(TensorVisitor& v, int64_t vocab_size, int64_t hidden_size,
                         bool tie_word_embeddings, HybridModelParts& parts) {
  using Scope = TensorVisitor::Scope;
  {
    Scope embedding(v, {.component = Component::kEmbedding});
    v.embedding("model.embed_tokens.weight", vocab_size, hidden_size, parts.embed_tokens);
  }
  {
    Scope norms(v, {.component = Component::kNorms});
    v.floats("model.norm.weight", {hidden_size}, DType::kBF16, Split::kReplicated,
             parts.final_norm);
  }
  Scope head(v, {.component = Component::kLmHead});
  if (tie_word_embeddings)
    v.tied_linear("model.embed_tokens", parts.lm_head);
  else
    v.linear("lm_head", vocab_size, hidden_size, Split::kByVocab, Quantizable::kNo, parts.lm_head);
}

HybridModel::HybridModel(HybridModelParts parts) : parts_(std::move(parts)) {
  const int64_t d = parts_.hidden_size;
  DZ_CHECK(!parts_.layers.empty(), "a model needs layers");
  DZ_CHECK(static_cast<int64_t>(parts_.final_norm.size()) == d, "final norm has {} values for {}",
           parts_.final_norm.size(), d);
  const int ranks = parts_.comm != nullptr ? parts_.comm->size() : 1;
  DZ_CHECK(parts_.lm_head.in_features() == d &&
               parts_.lm_head.out_features() * ranks == parts_.vocab_size,
           "lm_head [{}, {}] for vocab {} over {} rank(s) and hidden {}",
           parts_.lm_head.out_features(), parts_.lm_head.in_features(), parts_.vocab_size, ranks,
           d);
  for (const DecoderLayer& layer : parts_.layers) {
    DZ_CHECK(layer.hidden_size == d, "layer {} hidden size {}", layer.layer_id, layer.hidden_size);
    DZ_CHECK((layer.mla != nullptr) != (layer.kda != nullptr), "layer {}: one token mixer",
             layer.layer_id);
    DZ_CHECK(layer.dense_mlp.has_value() != (layer.moe != nullptr), "layer {}: one FFN",
             layer.layer_id);
    DZ_CHECK(has_attn_res() == !layer.attn_res_query.empty() &&
                 has_attn_res() == !layer.ffn_res_query.empty(),
             "layer {}: AttnRes queries must match the model's", layer.layer_id);
    has_recurrent_state_ = has_recurrent_state_ || layer.kda != nullptr;
  }
  DZ_CHECK(parts_.mtp == nullptr || parts_.mtp->layer.kda == nullptr,
           "the MTP layer must not carry recurrent state");
  DZ_CHECK(!has_attn_res() || parts_.layers[0].attn_res_write,
           "AttnRes: layer 0 must write the embedding into the bank");
}

// The step forward_context_parallel() ran, owned: its ContextSplit refers to the batch.
struct HybridModel::KeptStep {
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int64_t> slot_mapping;
  std::vector<std::vector<int32_t>> block_tables;
  ForwardBatch batch;
  std::unique_ptr<ContextSplit> split;
  std::vector<float> local_final;  // this rank's final-norm rows [local tokens, d]

  explicit KeptStep(const ForwardBatch& from)
      : token_ids(from.token_ids.begin(), from.token_ids.end()),
        positions(from.positions.begin(), from.positions.end()),
        slot_mapping(from.slot_mapping.begin(), from.slot_mapping.end()) {
    batch.token_ids = token_ids;
    batch.positions = positions;
    batch.slot_mapping = slot_mapping;
    batch.block_size = from.block_size;
    batch.sequences = from.sequences;
    block_tables.reserve(from.sequences.size());
    for (SequenceSlice& seq : batch.sequences) {
      block_tables.emplace_back(seq.block_table.begin(), seq.block_table.end());
      seq.block_table = block_tables.back();
    }
  }
};

HybridModel::~HybridModel() = default;

const DecoderLayer& HybridModel::layer(int layer_id) const {
  DZ_CHECK(layer_id >= 0 && layer_id < num_layers(), "layer {} of {}", layer_id, num_layers());
  return parts_.layers[static_cast<size_t>(layer_id)];
}

std::vector<LayerCacheSpec> HybridModel::cache_layers() const {
  std::vector<LayerCacheSpec> specs;
  for (const DecoderLayer& layer : parts_.layers)
    specs.push_back(layer.cache_spec(parts_.kv_cache_dtype));
  if (parts_.mtp != nullptr)  // the MTP layer's caches follow the main layers'
    specs.push_back(parts_.mtp->layer.cache_spec(parts_.kv_cache_dtype));
  return specs;
}

Status HybridModel::check_batch(const ForwardBatch& batch, const KvCache& cache) const {
  const int64_t num_tokens = batch.num_tokens();
  if (static_cast<int64_t>(batch.positions.size()) != num_tokens ||
      static_cast<int64_t>(batch.slot_mapping.size()) != num_tokens)
    return make_error(StatusCode::kInvalidArgument,
                      "batch: {} tokens but {} positions and {} slots", num_tokens,
                      batch.positions.size(), batch.slot_mapping.size());
  if (batch.block_size != cache.block_size())
    return make_error(StatusCode::kInvalidArgument,
                      "batch: block size {} differs from the cache's {}", batch.block_size,
                      cache.block_size());
  if (cache.num_layers() < static_cast<int64_t>(cache_layers().size()))
    return make_error(StatusCode::kInvalidArgument, "KV cache has {} layers, the model needs {}",
                      cache.num_layers(), cache_layers().size());
  for (int64_t i = 0; i < num_tokens; ++i) {
    int32_t id = batch.token_ids[static_cast<size_t>(i)];
    if (id < 0 || id >= parts_.vocab_size)
      return make_error(StatusCode::kInvalidArgument,
                        "token id {} at index {} is outside the vocabulary [0, {})", id, i,
                        parts_.vocab_size);
  }
  for (const GivenEmbedding& given : batch.given_embeddings)
    if (given.token < 0 || given.token >= num_tokens || given.row == nullptr)
      return make_error(StatusCode::kInvalidArgument, "batch: a given embedding for token {} of {}",
                        given.token, num_tokens);
  if (!batch.given_embeddings.empty() && context_parallel())
    return make_error(StatusCode::kUnsupported,
                      "images are not supported under context parallelism");
  int64_t covered = 0;
  std::vector<int32_t> state_slots;
  for (const SequenceSlice& seq : batch.sequences) {
    if (seq.token_begin != covered || seq.num_tokens <= 0 || seq.pos_begin < 0)
      return make_error(StatusCode::kInvalidArgument,
                        "batch: sequences must tile the tokens in order (sequence at {} with {} "
                        "tokens, expected start {})",
                        seq.token_begin, seq.num_tokens, covered);
    covered += seq.num_tokens;
    if (has_recurrent_state_) {
      if (seq.state_slot < 0 || seq.state_slot >= cache.num_state_slots())
        return make_error(StatusCode::kInvalidArgument,
                          "batch: the sequence at token {} has state slot {}, the cache has {} "
                          "recurrent-state slots",
                          seq.token_begin, seq.state_slot, cache.num_state_slots());
      if (std::find(state_slots.begin(), state_slots.end(), seq.state_slot) != state_slots.end())
        return make_error(StatusCode::kInvalidArgument,
                          "batch: state slot {} is used by two sequences", seq.state_slot);
      state_slots.push_back(seq.state_slot);
      if (static_cast<int64_t>(seq.snapshot_slots.size()) >= seq.num_tokens)
        return make_error(StatusCode::kInvalidArgument,
                          "batch: {} snapshot slots for a sequence of {} tokens (at most {})",
                          seq.snapshot_slots.size(), seq.num_tokens, seq.num_tokens - 1);
      for (const int32_t slot : seq.snapshot_slots) {
        if (slot < 0 || slot >= cache.num_state_slots())
          return make_error(StatusCode::kInvalidArgument,
                            "batch: snapshot slot {} outside the cache's {} recurrent-state slots",
                            slot, cache.num_state_slots());
        if (std::find(state_slots.begin(), state_slots.end(), slot) != state_slots.end())
          return make_error(StatusCode::kInvalidArgument,
                            "batch: state slot {} is used twice (a snapshot slot)", slot);
        state_slots.push_back(slot);
      }
    } else if (!seq.snapshot_slots.empty()) {
      return make_error(StatusCode::kInvalidArgument,
                        "batch: snapshot slots on a model without recurrent layers");
    }
    const int64_t blocks_needed =
        (seq.num_cached_after() + batch.block_size - 1) / batch.block_size;
    if (static_cast<int64_t>(seq.block_table.size()) < blocks_needed)
      return make_error(StatusCode::kInvalidArgument,
                        "batch: {} cached positions need {} blocks, the block table has {}",
                        seq.num_cached_after(), blocks_needed, seq.block_table.size());
    for (int32_t block_id : seq.block_table.first(static_cast<size_t>(blocks_needed)))
      if (block_id < 0 || block_id >= cache.num_blocks())
        return make_error(StatusCode::kInvalidArgument, "batch: block id {} outside [0, {})",
                          block_id, cache.num_blocks());
    for (int64_t i = 0; i < seq.num_tokens; ++i) {
      const auto t = static_cast<size_t>(seq.token_begin + i);
      if (batch.positions[t] != seq.pos_begin + i ||
          batch.slot_mapping[t] != slot_of(seq.block_table, batch.block_size, seq.pos_begin + i))
        return make_error(StatusCode::kInvalidArgument,
                          "batch: token {} has position {} and slot {}, its sequence implies {} "
                          "and {}",
                          t, batch.positions[t], batch.slot_mapping[t], seq.pos_begin + i,
                          slot_of(seq.block_table, batch.block_size, seq.pos_begin + i));
    }
  }
  if (covered != num_tokens)
    return make_error(StatusCode::kInvalidArgument, "batch: sequences cover {} of {} tokens",
                      covered, num_tokens);
  return Status::ok_status();
}

void HybridModel::ensure_scratch(const ExecContext& ctx, const ForwardBatch& batch) {
  const int64_t T = batch.num_tokens();
  int64_t max_range = 0;
  for (const SequenceSlice& seq : batch.sequences)
    max_range = std::max(max_range, seq.num_cached_after());
  size_t bytes = 64 * 1024;
  for (const DecoderLayer& layer : parts_.layers)
    bytes = std::max(bytes, layer.scratch_bytes(ctx, T, max_range));
  if (parts_.mtp != nullptr)
    bytes = std::max(bytes, parts_.mtp->layer.scratch_bytes(ctx, T, max_range));
  if (scratch_ == nullptr || scratch_->capacity_bytes() < bytes)
    scratch_ = std::make_unique<Arena>(bytes);
}

Arena& HybridModel::block_scratch(const ExecContext& ctx, const ForwardBatch& batch) {
  ensure_scratch(ctx, batch);
  return *scratch_;
}

void HybridModel::run_plain(const ExecContext& ctx, const DecoderLayer& layer,
                            const ForwardBatch& batch, KvCache& cache, float* x, TapSink* taps) {
  const int64_t T = batch.num_tokens();
  const int64_t d = parts_.hidden_size;
  std::vector<float> normed(static_cast<size_t>(T * d));  // [T, d]
  std::vector<float> delta(static_cast<size_t>(T * d));   // [T, d] sublayer output
  layer.attention_norm(ctx, x, T, normed.data());
  tap(taps, layer.layer_id, "attn_norm", normed.data(), {T, d});
  layer.attention(ctx, batch, cache, normed.data(), delta.data(), *scratch_, taps);
  add_residual(x, delta.data(), T * d);
  layer.ffn_norm(ctx, x, T, normed.data());
  tap(taps, layer.layer_id, "ffn_norm", normed.data(), {T, d});
  layer.ffn(ctx, normed.data(), T, delta.data(), *scratch_, taps);
  add_residual(x, delta.data(), T * d);
  tap(taps, layer.layer_id, "layer_out", x, {T, d});
}

void HybridModel::embed(const Embedding& table, std::span<const int32_t> ids, float* out) const {
  table.lookup(ids, out);  // BF16 values: already BF16-valued
  // Vocabulary split: each row came from one rank and is zero on the others, so the sum is exact.
  if (parts_.comm != nullptr)
    parts_.comm->all_reduce_sum(std::span(out, ids.size() * static_cast<size_t>(hidden_size())),
                                -1);
}

Status HybridModel::forward_hidden(const ExecContext& ctx, const ForwardBatch& batch,
                                   KvCache& cache, float* out, TapSink* taps) {
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  run_layers(ctx, batch, cache, out, taps);
  return Status::ok_status();
}

void HybridModel::run_layers(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                             float* out, TapSink* taps) {
  ensure_scratch(ctx, batch);
  const int64_t T = batch.num_tokens();
  const int64_t d = parts_.hidden_size;
  if (T == 0) {  // this rank's group has no sequences this step; the others' tokens may come
    for (const DecoderLayer& layer : parts_.layers) layer.ffn_without_tokens(ctx, *scratch_);
    return;
  }
  embed(parts_.embed_tokens, batch.token_ids, out);
  for (const GivenEmbedding& given : batch.given_embeddings)
    std::copy(given.row, given.row + d, out + given.token * d);
  if (!has_attn_res()) {
    for (const DecoderLayer& layer : parts_.layers) run_plain(ctx, layer, batch, cache, out, taps);
    return;
  }

  // Block AttnRes (docs/models.md §5): the sublayers read mixes of the bank and the running prefix
  // P; their outputs only ever add to P.
  AttnResStack stack(T, d, parts_.attn_res_eps);
  stack.start(out);
  std::vector<float> h(static_cast<size_t>(T * d));       // [T, d] the mix
  std::vector<float> normed(static_cast<size_t>(T * d));  // [T, d]
  std::vector<float> delta(static_cast<size_t>(T * d));   // [T, d]
  for (const DecoderLayer& layer : parts_.layers) {
    const int id = layer.layer_id;
    stack.mix(ctx, layer.attn_res_query, h.data());  // before the bank write (§5)
    tap(taps, id, "attn_mix", h.data(), {T, d});
    if (layer.attn_res_write) stack.write();
    layer.attention_norm(ctx, h.data(), T, normed.data());
    tap(taps, id, "attn_norm", normed.data(), {T, d});
    layer.attention(ctx, batch, cache, normed.data(), delta.data(), *scratch_, taps);
    stack.add(delta.data());
    stack.mix(ctx, layer.ffn_res_query, h.data());
    tap(taps, id, "ffn_mix", h.data(), {T, d});
    layer.ffn_norm(ctx, h.data(), T, normed.data());
    tap(taps, id, "ffn_norm", normed.data(), {T, d});
    layer.ffn(ctx, normed.data(), T, delta.data(), *scratch_, taps);
    stack.add(delta.data());
    tap(taps, id, "layer_out", stack.prefix(), {T, d});
  }
  stack.mix(ctx, parts_.final_attn_res_query, out);
  tap(taps, -1, "final_mix", out, {T, d});
}

void HybridModel::final_norm(const ExecContext& ctx, const float* hidden, int64_t num_tokens,
                             float* out) const {
  const int64_t d = parts_.hidden_size;
  kernels::rms_norm(ctx, hidden, d, parts_.final_norm.data(), out, d, num_tokens, d,
                    parts_.final_norm_eps);
  kernels::round_to_bf16(out, num_tokens * d);
}

void HybridModel::lm_head(const ExecContext& ctx, const float* normed,
                          std::span<const int64_t> rows, float* logits) const {
  const int64_t d = parts_.hidden_size;
  const auto num_rows = static_cast<int64_t>(rows.size());
  std::vector<float> picked(static_cast<size_t>(num_rows * d));  // [rows, d]
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(picked.data() + r * d, normed + rows[static_cast<size_t>(r)] * d,
                static_cast<size_t>(d) * sizeof(float));
  head_logits(ctx, parts_.lm_head, picked.data(), num_rows, logits);
}

void HybridModel::head_logits(const ExecContext& ctx, const kernels::LinearWeight& head,
                              const float* normed, int64_t num_rows, float* logits) const {
  if (parts_.comm == nullptr) {
    head.forward(ctx, normed, num_rows, logits);
    return;
  }
  // Vocabulary split: this rank's columns of every row, then all ranks' columns side by side.
  const int ranks = parts_.comm->size();
  const int64_t local = head.out_features();
  std::vector<float> mine(static_cast<size_t>(num_rows * local));
  head.forward(ctx, normed, num_rows, mine.data());
  std::vector<float> all(static_cast<size_t>(num_rows * local * ranks));  // [rank, rows, local]
  const std::vector<int64_t> counts(static_cast<size_t>(ranks), num_rows * local);
  parts_.comm->all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                          counts, dist::WireType::kF32, -1);
  for (int r = 0; r < ranks; ++r)
    for (int64_t row = 0; row < num_rows; ++row)
      std::memcpy(logits + row * local * ranks + r * local,
                  all.data() + (r * num_rows + row) * local,
                  static_cast<size_t>(local) * sizeof(float));
}

Status HybridModel::forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                            std::span<const int64_t> logits_rows, float* out_logits,
                            TapSink* taps) {
  const int64_t T = batch.num_tokens();
  const int64_t d = parts_.hidden_size;
  for (int64_t row : logits_rows)
    if (row < 0 || row >= T)
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, T);
  if (context_parallel())
    return forward_context_parallel(ctx, batch, cache, logits_rows, out_logits, taps);
  std::vector<float> hidden(static_cast<size_t>(T * d));
  DZ_RETURN_IF_ERROR(forward_hidden(ctx, batch, cache, hidden.data(), taps));
  if (T == 0) return Status::ok_status();
  final_norm(ctx, hidden.data(), T, hidden.data());
  tap(taps, -1, "final_norm", hidden.data(), {T, d});
  lm_head(ctx, hidden.data(), logits_rows, out_logits);
  tap(taps, -1, "logits", out_logits,
      {static_cast<int64_t>(logits_rows.size()), parts_.vocab_size});
  if (has_mtp()) {
    kept_step_.reset();
    last_final_ = std::move(hidden);
    last_positions_.assign(batch.positions.begin(), batch.positions.end());
  }
  return Status::ok_status();
}

BlockShard HybridModel::cache_shard() const {
  if (!context_parallel()) return {};
  return {.count = parts_.cp_comm->size(), .index = parts_.cp_comm->rank()};
}

void HybridModel::copy_block_rows(KvCache& cache, int32_t from_block, int32_t to_block,
                                  int64_t num_rows) {
  if (context_parallel()) {
    copy_block_rows_between_ranks(cache, *parts_.cp_comm, from_block, to_block, num_rows);
  } else {
    cache.copy_block_rows(from_block, to_block, num_rows);
  }
}

Status HybridModel::forward_context_parallel(const ExecContext& ctx, const ForwardBatch& batch,
                                             KvCache& cache, std::span<const int64_t> logits_rows,
                                             float* out_logits, TapSink* taps) {
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  if (cache.shard() != cache_shard())
    return make_error(StatusCode::kInvalidArgument,
                      "context parallelism over {} ranks needs a cache made with cache_shard() "
                      "(this one stores shard {} of {})",
                      parts_.cp_comm->size(), cache.shard().index, cache.shard().count);
  const int64_t d = parts_.hidden_size;
  // With an MTP layer the step and its split are kept for forward_mtp(), so they live on the heap.
  std::unique_ptr<KeptStep> kept = has_mtp() ? std::make_unique<KeptStep>(batch) : nullptr;
  std::optional<ContextSplit> own_split;
  if (kept != nullptr)
    kept->split = std::make_unique<ContextSplit>(kept->batch, *parts_.cp_comm, parts_.cp_layout);
  else
    own_split.emplace(batch, *parts_.cp_comm, parts_.cp_layout);
  const ContextSplit& split = kept != nullptr ? *kept->split : *own_split;
  const ForwardBatch& local = split.local();
  std::vector<float> hidden(static_cast<size_t>(local.num_tokens() * d));
  run_layers(ctx, local, cache, hidden.data(), taps);  // taps see this rank's tokens
  final_norm(ctx, hidden.data(), local.num_tokens(), hidden.data());
  // The asked rows from the ranks that ran them; every rank then computes the same logits.
  const std::vector<float> picked = split.gather_rows(logits_rows, hidden.data(), d, -1);
  head_logits(ctx, parts_.lm_head, picked.data(), static_cast<int64_t>(logits_rows.size()),
              out_logits);
  if (kept != nullptr) {
    kept->local_final = std::move(hidden);
    kept_step_ = std::move(kept);
    last_final_.clear();
    last_positions_.assign(batch.positions.begin(), batch.positions.end());
  }
  return Status::ok_status();
}

}  // namespace dz::model
