#include "dayzero/runtime/engine_core.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <utility>

#include "dayzero/cache/cache_coordinator.h"
#include "dayzero/core/check.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/kv_cache.h"
#include "dayzero/model/vision/vision_encoder.h"
#include "dayzero/runtime/encoder_cache.h"
#include "dayzero/runtime/ngram_proposer.h"
#include "dayzero/runtime/request.h"
#include "dayzero/runtime/scheduler.h"

namespace dz::runtime {

// What a ForwardBatch points into (outside the anonymous namespace: EngineCore::Impl holds two).
struct BatchBuffers {
  std::vector<int32_t> token_ids;
  std::vector<int32_t> positions;
  std::vector<int64_t> slot_mapping;
};

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// The encoder budget of one step: as configured, else enough for the step's tokens and for the
// largest image the model's processor makes (so that every image can be encoded in some step).
int64_t max_num_encoder_tokens(const EngineConfig& c, const model::CausalLm& model) {
  if (c.max_num_encoder_tokens > 0) return c.max_num_encoder_tokens;
  const model::VisionEncoder* vision = model.vision();
  const int64_t largest = vision != nullptr ? vision->processor().max_tokens() : 0;
  return std::max(c.max_num_batched_tokens, largest);
}

// The cache format in every block's extra keys: a block computed under another layout or block
// size must never be served (docs/serving.md §1.4).
std::string cache_format(std::span<const model::LayerCacheSpec> layers, int64_t block_size) {
  std::string format = "kv";
  for (const model::LayerCacheSpec& spec : layers) {
    if (spec.mla.latent_dim > 0)
      format += fmt::format(":mla{}+{}{}", spec.mla.latent_dim, spec.mla.rope_dim,
                            spec.mla.dtype == kernels::KvCacheDtype::kFp8 ? "fp8" : "bf16");
    if (spec.index_key_dim > 0) format += fmt::format(":idx{}", spec.index_key_dim);
    if (spec.kda.num_heads > 0) format += ":kda";
  }
  return format + fmt::format(";B={}", block_size);
}

// The MTP head drafts one token from the trunk and one more chained on its own output (the
// lookahead slot holds the record of the chained position).
constexpr int64_t kMaxMtpDrafts = 2;

Status check_config(const EngineConfig& c, int64_t vocab_size) {
  auto bad = [](std::string_view field, int64_t value, std::string_view want) {
    return make_error(StatusCode::kInvalidArgument, "engine config: {} = {} (want {})", field,
                      value, want);
  };
  if (c.max_num_seqs < 1) return bad("max_num_seqs", c.max_num_seqs, ">= 1");
  if (c.max_num_batched_tokens < 1)
    return bad("max_num_batched_tokens", c.max_num_batched_tokens, ">= 1");
  if (c.max_queued_requests < 0) return bad("max_queued_requests", c.max_queued_requests, ">= 0");
  if (c.long_prefill_threshold < 0)
    return bad("long_prefill_threshold", c.long_prefill_threshold, ">= 0");
  if (c.max_long_partial_prefills < 1)
    return bad("max_long_partial_prefills", c.max_long_partial_prefills, ">= 1");
  if (c.block_size < 1) return bad("block_size", c.block_size, ">= 1");
  if (c.num_blocks < 0 || c.num_blocks == 1)
    return bad("num_blocks", c.num_blocks, "0 (from kv_cache_bytes) or >= 2");
  if (c.num_blocks == 0 && c.kv_cache_bytes <= 0)
    return bad("kv_cache_bytes", c.kv_cache_bytes, "> 0 when num_blocks is 0");
  if (c.reserve_blocks < -1) return bad("reserve_blocks", c.reserve_blocks, ">= -1");
  if (c.max_model_len < 2) return bad("max_model_len", c.max_model_len, ">= 2");
  if (c.max_num_encoder_tokens < 0)
    return bad("max_num_encoder_tokens", c.max_num_encoder_tokens, ">= 0 (0: automatic)");
  if (c.max_state_checkpoints < -1)
    return bad("max_state_checkpoints", c.max_state_checkpoints, ">= -1");
  if (c.state_checkpoint_interval < 1 || c.state_checkpoint_interval % c.block_size != 0)
    return bad("state_checkpoint_interval", c.state_checkpoint_interval,
               fmt::format("a positive multiple of block_size {}", c.block_size));
  for (const int32_t id : c.eos_token_ids)
    if (id < 0 || id >= vocab_size)
      return bad("eos_token_ids", id, fmt::format("in [0, {})", vocab_size));
  if (c.speculative.method == SpeculativeMethod::kMtp &&
      c.speculative.num_speculative_tokens() > kMaxMtpDrafts)
    return make_error(StatusCode::kUnsupported,
                      "--speculative-config: num_speculative_tokens = {} with method \"mtp\": the "
                      "MTP head drafts at most {} tokens (it is chained once)",
                      c.speculative.num_speculative_tokens(), kMaxMtpDrafts);
  if (c.speculative.enabled()) DZ_RETURN_IF_ERROR(validate_ngram_config(c.speculative.ngram));
  return Status::ok_status();
}

// Positions [begin, begin + num_tokens) of one request in a forward batch.
struct BatchSpan {
  const Request* request = nullptr;
  int64_t begin = 0;
  int64_t num_tokens = 0;
  std::span<const int32_t> snapshot_slots{};  // SequenceSlice::snapshot_slots
};

// The one place a ForwardBatch of requests is made, for the main model and the MTP head alike:
// token_at(span index, position) is the id fed at that position.
template <typename TokenAt>
model::ForwardBatch make_batch(std::span<const BatchSpan> spans, int64_t block_size,
                               const TokenAt& token_at, BatchBuffers& buffers) {
  size_t num_tokens = 0;
  for (const BatchSpan& s : spans) num_tokens += static_cast<size_t>(s.num_tokens);
  buffers.token_ids.resize(num_tokens);
  buffers.positions.resize(num_tokens);
  buffers.slot_mapping.resize(num_tokens);
  model::ForwardBatch batch;
  batch.block_size = block_size;
  int64_t t = 0;
  for (size_t s = 0; s < spans.size(); ++s) {
    const BatchSpan& span = spans[s];
    const Request& r = *span.request;
    for (int64_t i = 0; i < span.num_tokens; ++i) {
      const auto k = static_cast<size_t>(t + i);
      buffers.token_ids[k] = token_at(s, span.begin + i);
      buffers.positions[k] = static_cast<int32_t>(span.begin + i);
      buffers.slot_mapping[k] = model::slot_of(r.cache.block_table, block_size, span.begin + i);
    }
    batch.sequences.push_back(model::SequenceSlice{.token_begin = t,
                                                   .num_tokens = span.num_tokens,
                                                   .pos_begin = span.begin,
                                                   .block_table = r.cache.block_table,
                                                   .state_slot = r.cache.state_slot,
                                                   .snapshot_slots = span.snapshot_slots});
    t += span.num_tokens;
  }
  batch.token_ids = buffers.token_ids;
  batch.positions = buffers.positions;
  batch.slot_mapping = buffers.slot_mapping;
  return batch;
}

// One scheduled chunk of a step: where its rows sit in the step's logits, and its output.
struct StepChunk {
  Request* request = nullptr;
  int64_t begin = 0;  // its first position
  int64_t num_tokens = 0;
  int64_t num_drafts = 0;       // the chunk's last num_drafts tokens are drafts to verify
  int64_t first_token = 0;      // its first row in the forward batch
  int64_t first_row = 0;        // in the main model's logits: prompt rows, then the sampled one
  int64_t num_prompt_rows = 0;  // return_prompt_logits
  bool sampled = false;     // the chunk reaches the last token: its last 1 + num_drafts rows sample
  int32_t next_token = -1;  // the sampled (or forced) token
  int64_t first_mtp_row = 0;
  int64_t num_mtp_rows = 0;
  RequestOutput out;
};

}  // namespace

struct EngineCore::Impl {
  model::CausalLm* model = nullptr;
  ExecContext ctx;
  int64_t vocab_size = 0;
  int64_t num_blocks = 0;  // null block included
  int64_t reserve_blocks = 0;
  model::KvCache cache;
  std::optional<cache::CacheCoordinator> coordinator;
  std::optional<Scheduler> scheduler;

  std::vector<RequestOutput> pending;  // aborted requests, reported by the next step
  int64_t generation_tokens = 0;
  int64_t num_steps = 0;

  // Speculative decoding on a recurrent model: the first of the max_num_seqs · k state slots that
  // keep, for each live slot, its state after each of a verified row's first k tokens (0: no
  // recurrent layers or no speculation), and their ids in order (live slot s owns the run of k
  // from (s − 1) · k), which a row's SequenceSlice::snapshot_slots views.
  int32_t rollback_slot_base = 0;
  int64_t num_speculative_tokens = 0;
  std::vector<int32_t> snapshot_ids;
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;

  // Gives the running requests that are decoding their drafts for this step (none when the
  // batch is larger than disable_by_batch_size: `drafting_this_step` says which).
  void propose_drafts(const EngineConfig& config);
  bool drafting_this_step = false;
  // The slot holding the state of r's verified row after its last non-draft token and `accepted`
  // drafts (accepted < the row's drafts).
  int32_t rollback_slot(const Request& r, int64_t accepted) const {
    return rollback_slot_base +
           static_cast<int32_t>((r.cache.state_slot - 1) * num_speculative_tokens + accepted);
  }
  // The slots keeping r's states after its row's last non-draft token and each of its first
  // num_drafts − 1 drafts (empty without recurrent layers).
  std::span<const int32_t> snapshot_slots(const Request& r, int64_t num_drafts) const {
    if (rollback_slot_base == 0 || num_drafts == 0) return {};
    return std::span(snapshot_ids)
        .subspan(static_cast<size_t>(rollback_slot(r, 0) - rollback_slot_base),
                 static_cast<size_t>(num_drafts));
  }
  // After a chunk's verification: commits the accepted drafts and, when a draft was rejected,
  // restores the recurrent state kept after the last accepted one.
  void commit_drafts(const StepChunk& c);
  // Speculative method "mtp": the MTP head over the whole batch that just ran (its cache records
  // for every position, as the head needs its own history), then a greedy draft from the row of
  // each sampled request's last computed position, for the token after the one just sampled,
  // and with num_drafts 2 one more from the head chained on its own output.
  Status run_mtp_drafts(std::span<StepChunk> chunks, int64_t num_drafts);

  // The MTP head over the step's first chunks (those of requests with return_mtp_logits), right
  // after the forward pass that kept the main model's state; fills their new_mtp_logits.
  Status run_mtp(std::span<StepChunk> chunks);

  // Images (docs/vision.md §4): embeddings by content hash, and the ones this step uses.
  std::optional<EncoderCache> encoder_cache;
  std::vector<ImageEmbeddings> step_images;
  std::vector<model::GivenEmbedding> given_embeddings;
  int64_t images_encoded = 0;
  int64_t image_tokens_encoded = 0;
  int64_t image_encode_steps = 0;
  double image_encode_seconds = 0.0;
  int64_t images_preprocessed = 0;
  double image_preprocess_seconds = 0.0;
  // One image's pixels from its file (at submission, and again if they were released before an
  // eviction from the encoder cache), counted in the metrics.
  Result<std::shared_ptr<const model::ProcessedImage>> preprocess(const PromptImage& image);
  // Preprocesses a request's images (the refusal names a bad one).
  Result<std::vector<std::shared_ptr<const model::ProcessedImage>>> process_images(
      const GenerationRequest& request);
  // The encoder step: encodes the images the chunks reach that the cache lacks (all of them in
  // one pass of the tower), then points given_embeddings at the rows of every placeholder token
  // of the batch.
  void embed_images(std::span<const StepChunk> chunks);

  // Scratch of one step.
  BatchBuffers batch_buffers;
  BatchBuffers mtp_batch_buffers;
  std::vector<int64_t> logits_rows;
  std::vector<float> logits;
  std::vector<float> mtp_logits;
};

Result<std::shared_ptr<const model::ProcessedImage>> EngineCore::Impl::preprocess(
    const PromptImage& image) {
  const auto start = std::chrono::steady_clock::now();
  const auto* bytes = reinterpret_cast<const uint8_t*>(image.data->data());
  DZ_ASSIGN_OR_RETURN(model::ProcessedImage processed,
                      model->vision()->process(std::span(bytes, image.data->size())));
  ++images_preprocessed;
  image_preprocess_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return std::make_shared<const model::ProcessedImage>(std::move(processed));
}

Result<std::vector<std::shared_ptr<const model::ProcessedImage>>> EngineCore::Impl::process_images(
    const GenerationRequest& request) {
  std::vector<std::shared_ptr<const model::ProcessedImage>> out;
  for (size_t i = 0; i < request.images.size(); ++i) {
    const PromptImage& image = request.images[i];
    Result<std::shared_ptr<const model::ProcessedImage>> processed = preprocess(image);
    if (!processed.ok()) return processed.status().with_context(fmt::format("images[{}]", i));
    if ((*processed)->num_tokens != image.num_tokens)
      return make_error(StatusCode::kInvalidArgument,
                        "images[{}]: the prompt holds {} placeholders for it, the image gives {} "
                        "tokens",
                        i, image.num_tokens, (*processed)->num_tokens);
    out.push_back(std::move(*processed));
  }
  return out;
}

void EngineCore::Impl::embed_images(std::span<const StepChunk> chunks) {
  step_images.clear();
  given_embeddings.clear();
  const model::VisionEncoder* vision = model->vision();
  if (vision == nullptr) return;
  auto reaches = [](const StepChunk& c, const PromptImage& image) {
    return image.offset < c.begin + c.num_tokens && image.offset + image.num_tokens > c.begin;
  };
  // Every image the chunks reach, each once: its rows taken from the cache now (inserting this
  // step's new ones below may evict them), or queued for the encoder.
  std::vector<cache::BlockHash> hashes;
  std::vector<const model::ProcessedImage*> batch;
  std::vector<size_t> batch_slots;  // where each encoded image goes in step_images
  std::vector<std::shared_ptr<const model::ProcessedImage>> keep;
  for (const StepChunk& c : chunks) {
    Request& r = *c.request;
    for (size_t i = 0; i < r.images.size(); ++i) {
      const PromptImage& image = r.images[i];
      if (!reaches(c, image) || std::find(hashes.begin(), hashes.end(), image.hash) != hashes.end())
        continue;
      hashes.push_back(image.hash);
      step_images.push_back(encoder_cache->find(image.hash));
      if (step_images.back() != nullptr) continue;
      if (r.processed_images[i] == nullptr) {  // released, then evicted: preprocess again
        Result<std::shared_ptr<const model::ProcessedImage>> again = preprocess(image);
        DZ_CHECK(again.ok(), "request {}: image {} preprocessed once, not again: {}", r.id, i,
                 again.status().message());
        r.processed_images[i] = std::move(*again);
      }
      keep.push_back(r.processed_images[i]);
      batch.push_back(keep.back().get());
      batch_slots.push_back(step_images.size() - 1);
    }
  }
  const int64_t hidden = vision->hidden_size();
  if (!batch.empty()) {  // one pass of the tower; each image attends only to itself
    const auto start = std::chrono::steady_clock::now();
    const std::vector<float> rows = vision->encode(ctx, batch);
    image_encode_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    int64_t at = 0;
    for (size_t k = 0; k < batch.size(); ++k) {
      const int64_t n = batch[k]->num_tokens * hidden;
      auto entry =
          std::make_shared<const std::vector<float>>(rows.begin() + at, rows.begin() + at + n);
      step_images[batch_slots[k]] = entry;  // this step's, even if the cache cannot hold it
      encoder_cache->insert(hashes[batch_slots[k]], std::move(entry));
      image_tokens_encoded += batch[k]->num_tokens;
      at += n;
    }
    images_encoded += static_cast<int64_t>(batch.size());
    ++image_encode_steps;
  }
  for (const StepChunk& c : chunks) {
    Request& r = *c.request;
    for (size_t i = 0; i < r.images.size(); ++i) {
      const PromptImage& image = r.images[i];
      if (!reaches(c, image)) continue;
      const auto k =
          static_cast<size_t>(std::find(hashes.begin(), hashes.end(), image.hash) - hashes.begin());
      const ImageEmbeddings& rows = step_images[k];
      r.processed_images[i].reset();  // encoded: its pixels are no longer needed
      const int64_t from = std::max(c.begin, image.offset);
      const int64_t to = std::min(c.begin + c.num_tokens, image.offset + image.num_tokens);
      for (int64_t p = from; p < to; ++p)
        given_embeddings.push_back({.token = c.first_token + p - c.begin,
                                    .row = rows->data() + (p - image.offset) * hidden});
    }
  }
}

EngineCore::EngineCore(EngineConfig config, std::unique_ptr<Impl> impl)
    : config_(std::move(config)), impl_(std::move(impl)) {}

EngineCore::~EngineCore() = default;

Result<std::unique_ptr<EngineCore>> EngineCore::create(model::CausalLm& model,
                                                       const ExecContext& ctx,
                                                       const EngineConfig& config) {
  const int64_t vocab_size = model.vocab_size();
  DZ_RETURN_IF_ERROR(check_config(config, vocab_size));
  if (config.speculative.method == SpeculativeMethod::kMtp && !model.has_mtp())
    return make_error(StatusCode::kInvalidArgument,
                      "--speculative-config: method \"mtp\" needs a model with an MTP head, and "
                      "this checkpoint has none (num_nextn_predict_layers 0); use \"ngram\"");
  const bool mtp_chain = config.speculative.method == SpeculativeMethod::kMtp &&
                         config.speculative.num_speculative_tokens() > 1;
  if (mtp_chain && model.cache_shard().count > 1)
    return make_error(StatusCode::kUnsupported,
                      "--speculative-config: the chained MTP head (num_speculative_tokens > 1) is "
                      "not built under --cp; use num_speculative_tokens 1");
  const std::vector<model::LayerCacheSpec> layers = model.cache_layers();
  const bool recurrent = std::any_of(layers.begin(), layers.end(),
                                     [](const auto& spec) { return spec.kda.num_heads > 0; });
  const int64_t max_checkpoints = !recurrent                          ? 0
                                  : config.max_state_checkpoints >= 0 ? config.max_state_checkpoints
                                                                      : 2 * config.max_num_seqs;
  // Speculation on a hybrid model keeps k more states per running request (rollback).
  const int64_t num_rollback_slots =
      recurrent && config.speculative.enabled()
          ? config.max_num_seqs * config.speculative.num_speculative_tokens()
          : 0;
  const int64_t num_state_slots =
      recurrent ? 1 + config.max_num_seqs + max_checkpoints + num_rollback_slots : 0;

  int64_t num_blocks = config.num_blocks;
  if (num_blocks == 0) {
    // The bytes of one token over every paged layer, from a one-block probe cache.
    DZ_ASSIGN_OR_RETURN(model::KvCache probe,
                        model::KvCache::create(layers, 1, config.block_size, recurrent ? 1 : 0));
    const int64_t block_bytes = probe.bytes_per_token() * config.block_size;
    // No paged layer (a purely recurrent model): blocks are bookkeeping only, enough for every
    // running request's whole context.
    // kv_cache_bytes is per rank: a rank that stores a share of the blocks (context parallelism)
    // makes the pool that many times larger.
    num_blocks = block_bytes > 0
                     ? config.kv_cache_bytes / block_bytes * model.cache_shard().count
                     : 1 + config.max_num_seqs * ceil_div(config.max_model_len, config.block_size);
    if (num_blocks < 2)
      return make_error(
          StatusCode::kInvalidArgument,
          "engine config: kv_cache_bytes = {} holds {} blocks of {} bytes (want >= 2)",
          config.kv_cache_bytes, num_blocks, block_bytes);
  }
  // Default reserve: one block per running decode (docs/serving.md §1.5), at least 1% of the pool,
  // and at most half of it, so that a small pool still admits.
  int64_t reserve = config.reserve_blocks;
  if (reserve < 0) {
    reserve = std::max(config.max_num_seqs, (num_blocks - 1) / 100);
    reserve = std::min(reserve, (num_blocks - 1) / 2);
  } else if (reserve > num_blocks - 2) {
    return make_error(StatusCode::kInvalidArgument,
                      "engine config: reserve_blocks = {} leaves no block of {} for admissions",
                      reserve, num_blocks - 1);
  }

  auto impl = std::make_unique<Impl>();
  impl->model = &model;
  impl->ctx = ctx;
  impl->vocab_size = vocab_size;
  impl->num_blocks = num_blocks;
  impl->reserve_blocks = reserve;
  if (num_rollback_slots > 0) {
    impl->rollback_slot_base = static_cast<int32_t>(1 + config.max_num_seqs + max_checkpoints);
    impl->num_speculative_tokens = config.speculative.num_speculative_tokens();
    impl->snapshot_ids.resize(static_cast<size_t>(num_rollback_slots));
    std::iota(impl->snapshot_ids.begin(), impl->snapshot_ids.end(), impl->rollback_slot_base);
  }
  impl->spec_accepted_per_position.assign(
      static_cast<size_t>(config.speculative.enabled() ? config.speculative.num_speculative_tokens()
                                                       : 0),
      0);
  DZ_ASSIGN_OR_RETURN(impl->cache, model::KvCache::create(layers, num_blocks, config.block_size,
                                                          num_state_slots, model.cache_shard()));
  model.cache_created(impl->cache);
  DZ_ASSIGN_OR_RETURN(cache::BlockPool blocks,
                      cache::BlockPool::create(num_blocks, config.block_size, reserve));
  blocks.set_shard_count(model.cache_shard().count);
  // Cache edits go through the model, which repeats them on every rank of a plan.
  model::KvCache* kv = &impl->cache;
  std::optional<cache::StatePool> states;
  if (recurrent) {
    DZ_ASSIGN_OR_RETURN(states, cache::StatePool::create(static_cast<int32_t>(num_state_slots),
                                                         static_cast<int32_t>(config.max_num_seqs),
                                                         static_cast<int32_t>(max_checkpoints),
                                                         [&model, kv](int32_t from, int32_t to) {
                                                           model.copy_state_slot(*kv, from, to);
                                                         }));
  }
  impl->coordinator.emplace(
      std::move(blocks), std::move(states),
      [&model, kv](int32_t from, int32_t to, int64_t rows) {
        model.copy_block_rows(*kv, from, to, rows);
      },
      cache::CacheCoordinatorConfig{
          .enable_prefix_caching = config.enable_prefix_caching,
          .state_checkpoint_interval = config.state_checkpoint_interval,
          .seed = cache::model_seed_hash(config.model_identity),
          .cache_format = cache_format(layers, config.block_size),
      });
  const SchedulerConfig scheduler_config{
      .max_num_seqs = config.max_num_seqs,
      .max_num_batched_tokens = config.max_num_batched_tokens,
      .long_prefill_threshold = config.long_prefill_threshold > 0
                                    ? config.long_prefill_threshold
                                    : std::max<int64_t>(1, config.max_num_batched_tokens / 2),
      .max_long_partial_prefills = config.max_long_partial_prefills,
      .max_model_len = config.max_model_len,
      .num_lookahead_slots = mtp_chain ? 1 : 0,
      .max_num_encoder_tokens = max_num_encoder_tokens(config, model),
  };
  impl->encoder_cache.emplace(config.encoder_cache_bytes);
  impl->scheduler.emplace(scheduler_config, *impl->coordinator, &*impl->encoder_cache);
  return std::unique_ptr<EngineCore>(new EngineCore(config, std::move(impl)));
}

Status EngineCore::validate_images(const GenerationRequest& request) const {
  if (request.images.empty()) return Status::ok_status();
  const model::VisionEncoder* vision = impl_->model->vision();
  if (vision == nullptr)
    return make_error(StatusCode::kInvalidArgument, "images: this model takes no images");
  if (!impl_->model->takes_given_embeddings())
    return make_error(StatusCode::kInvalidArgument,
                      "images: not supported yet under context parallelism (--cp)");
  if (request.return_mtp_logits)
    return make_error(StatusCode::kInvalidArgument, "images: not with return_mtp_logits");
  int64_t end = 0;
  for (size_t i = 0; i < request.images.size(); ++i) {
    const PromptImage& image = request.images[i];
    if (image.data == nullptr || image.num_tokens < 1 || image.offset < end ||
        image.offset + image.num_tokens > static_cast<int64_t>(request.prompt_token_ids.size()))
      return make_error(StatusCode::kInvalidArgument,
                        "images[{}]: {} tokens at {} do not fit the prompt of {} after the images "
                        "before it",
                        i, image.num_tokens, image.offset, request.prompt_token_ids.size());
    for (int64_t p = image.offset; p < image.offset + image.num_tokens; ++p)
      if (request.prompt_token_ids[static_cast<size_t>(p)] != vision->placeholder_token_id())
        return make_error(StatusCode::kInvalidArgument,
                          "images[{}]: prompt token {} is {}, not the image placeholder {}", i, p,
                          request.prompt_token_ids[static_cast<size_t>(p)],
                          vision->placeholder_token_id());
    end = image.offset + image.num_tokens;
    const int64_t budget = impl_->scheduler->config().max_num_encoder_tokens;
    if (image.num_tokens > budget)
      return make_error(StatusCode::kInvalidArgument,
                        "images[{}]: {} tokens, more than the {} the encoder makes in one step "
                        "(max_num_encoder_tokens)",
                        i, image.num_tokens, budget);
  }
  return Status::ok_status();
}

Status EngineCore::validate_request(const GenerationRequest& request) const {
  const auto num_prompt = static_cast<int64_t>(request.prompt_token_ids.size());
  if (num_prompt == 0)
    return make_error(StatusCode::kInvalidArgument, "prompt_token_ids: the prompt is empty");
  for (size_t i = 0; i < request.prompt_token_ids.size(); ++i) {
    const int32_t id = request.prompt_token_ids[i];
    if (id < 0 || id >= impl_->vocab_size)
      return make_error(StatusCode::kInvalidArgument,
                        "prompt_token_ids[{}]: token {} is outside the vocabulary [0, {})", i, id,
                        impl_->vocab_size);
  }
  DZ_RETURN_IF_ERROR(validate_sampling_params(request.sampling, impl_->vocab_size));
  if (request.max_tokens < 1)
    return make_error(StatusCode::kInvalidArgument, "max_tokens: {} (want >= 1)",
                      request.max_tokens);
  if (num_prompt + request.max_tokens > config_.max_model_len)
    return make_error(StatusCode::kInvalidArgument,
                      "max_tokens: a prompt of {} tokens + max_tokens {} exceeds max_model_len {}",
                      num_prompt, request.max_tokens, config_.max_model_len);
  const auto num_resumed = static_cast<int64_t>(request.resumed_output_token_ids.size());
  if (num_resumed >= request.max_tokens)
    return make_error(StatusCode::kInvalidArgument,
                      "resumed_output_token_ids: {} tokens leave nothing of max_tokens {}",
                      num_resumed, request.max_tokens);
  for (size_t i = 0; i < request.resumed_output_token_ids.size(); ++i) {
    const int32_t id = request.resumed_output_token_ids[i];
    if (id < 0 || id >= impl_->vocab_size)
      return make_error(StatusCode::kInvalidArgument,
                        "resumed_output_token_ids[{}]: token {} is outside the vocabulary [0, {})",
                        i, id, impl_->vocab_size);
  }
  if (num_resumed > 0 && (request.return_logits || request.return_prompt_logits ||
                          request.return_mtp_logits || !request.forced_output_token_ids.empty()))
    return make_error(StatusCode::kInvalidArgument,
                      "resumed_output_token_ids: a resumed request cannot return logits or force "
                      "tokens");
  if (static_cast<int64_t>(request.forced_output_token_ids.size()) > request.max_tokens)
    return make_error(StatusCode::kInvalidArgument,
                      "forced_output_token_ids: {} tokens exceed max_tokens {}",
                      request.forced_output_token_ids.size(), request.max_tokens);
  for (size_t i = 0; i < request.forced_output_token_ids.size(); ++i) {
    const int32_t id = request.forced_output_token_ids[i];
    if (id < 0 || id >= impl_->vocab_size)
      return make_error(StatusCode::kInvalidArgument,
                        "forced_output_token_ids[{}]: token {} is outside the vocabulary [0, {})",
                        i, id, impl_->vocab_size);
  }
  if (request.return_mtp_logits && !impl_->model->has_mtp())
    return make_error(StatusCode::kUnsupported, "return_mtp_logits: the model has no MTP head");
  if (request.return_mtp_logits && config_.speculative.method == SpeculativeMethod::kMtp)
    return make_error(StatusCode::kInvalidArgument,
                      "return_mtp_logits: not with the speculative method \"mtp\", whose head runs "
                      "over every step");
  // A prefix-cache hit computes no logits (and no MTP head records) for the positions it serves.
  if (request.return_prompt_logits && config_.enable_prefix_caching)
    return make_error(StatusCode::kInvalidArgument,
                      "return_prompt_logits needs prefix caching off (a hit computes no logits "
                      "for the positions it serves)");
  if (request.return_mtp_logits && config_.enable_prefix_caching)
    return make_error(StatusCode::kInvalidArgument,
                      "return_mtp_logits needs prefix caching off (the MTP head's cache records "
                      "exist only for positions the request computed)");
  DZ_RETURN_IF_ERROR(validate_images(request));
  if (!request.sampling.stop.empty() && !config_.token_bytes)
    return make_error(StatusCode::kInvalidArgument,
                      "stop: stop strings need the engine's token_bytes (no tokenizer given)");
  // A request the cache can never hold would wait forever: its prompt must fit beside the reserve
  // and its whole context in the pool.
  const int64_t usable = impl_->num_blocks - 1;
  const int64_t prompt_blocks = ceil_div(num_prompt + num_resumed, config_.block_size);
  const int64_t context_blocks = ceil_div(num_prompt + request.max_tokens - 1, config_.block_size);
  if (prompt_blocks > usable - impl_->reserve_blocks || context_blocks > usable)
    return make_error(StatusCode::kInvalidArgument,
                      "max_tokens: {} prompt + {} new tokens need {} KV blocks of {} ({} for the "
                      "prompt); the cache has {}, {} of them reserved",
                      num_prompt + num_resumed, request.max_tokens, context_blocks,
                      config_.block_size, prompt_blocks, usable, impl_->reserve_blocks);
  return Status::ok_status();
}

namespace {

// A request made of its GenerationRequest, its resumed output (if any) run through the text
// stream as if generated here: the UTF-8 and stop-string state continue where the earlier worker
// left them, and nothing of it is shown again.
std::unique_ptr<Request> make_request(int64_t request_id, GenerationRequest request,
                                      const EngineConfig& config) {
  auto r = std::make_unique<Request>(request_id, std::move(request), config.eos_token_ids);
  if (config.token_bytes)
    for (const int32_t token : r->output())
      if (const std::optional<std::string> bytes = config.token_bytes(token))
        static_cast<void>(r->stop_matcher.push(r->utf8.push(*bytes)));
  return r;
}

}  // namespace

Status EngineCore::add_request(int64_t request_id, GenerationRequest request) {
  DZ_RETURN_IF_ERROR(validate_request(request));
  Scheduler& scheduler = *impl_->scheduler;
  if (scheduler.find(request_id) != nullptr)
    return make_error(StatusCode::kAlreadyExists, "request id {} is already in use", request_id);
  DZ_ASSIGN_OR_RETURN(auto processed, impl_->process_images(request));
  std::unique_ptr<Request> r = make_request(request_id, std::move(request), config_);
  r->processed_images = std::move(processed);
  scheduler.add(std::move(r));
  return Status::ok_status();
}

Status EngineCore::add_choices(std::span<const int64_t> request_ids, GenerationRequest request) {
  if (request_ids.empty())
    return make_error(StatusCode::kInvalidArgument, "add_choices: no request ids");
  DZ_RETURN_IF_ERROR(validate_request(request));
  if (request.return_prompt_logits || request.return_mtp_logits ||
      !request.forced_output_token_ids.empty() || !request.resumed_output_token_ids.empty())
    return make_error(StatusCode::kInvalidArgument,
                      "add_choices: scoring options (prompt or MTP logits, forced tokens) and "
                      "resumed output are for one choice");
  Scheduler& scheduler = *impl_->scheduler;
  for (size_t c = 0; c < request_ids.size(); ++c) {
    if (scheduler.find(request_ids[c]) != nullptr ||
        std::find(request_ids.begin(), request_ids.begin() + static_cast<std::ptrdiff_t>(c),
                  request_ids[c]) != request_ids.begin() + static_cast<std::ptrdiff_t>(c))
      return make_error(StatusCode::kAlreadyExists, "request id {} is already in use",
                        request_ids[c]);
  }
  Request* parent = nullptr;
  DZ_ASSIGN_OR_RETURN(const auto processed, impl_->process_images(request));
  for (size_t c = 0; c < request_ids.size(); ++c) {
    GenerationRequest choice = request;
    choice.choice_index = static_cast<uint32_t>(c);
    auto r = std::make_unique<Request>(request_ids[c], std::move(choice), config_.eos_token_ids);
    r->processed_images = processed;
    if (parent == nullptr)
      parent = &scheduler.add(std::move(r));
    else
      scheduler.add_fork(std::move(r), *parent);
  }
  return Status::ok_status();
}

namespace {

RequestOutput make_output(const Request& r) {
  RequestOutput out;
  out.request_id = r.id;
  out.num_prompt_tokens = r.num_prompt_tokens;
  out.num_cached_tokens = r.num_cached_tokens;
  out.num_output_tokens = r.num_output_tokens();
  out.num_preemptions = r.num_preemptions;
  out.first_scheduled = r.first_scheduled;
  return out;
}

}  // namespace

bool EngineCore::abort_request(int64_t request_id) {
  Scheduler& scheduler = *impl_->scheduler;
  Request* r = scheduler.find(request_id);
  if (r == nullptr) return false;
  RequestOutput out = make_output(*r);
  out.finished = true;
  out.aborted = true;
  scheduler.finish(request_id);
  impl_->pending.push_back(std::move(out));
  return true;
}

bool EngineCore::has_unfinished_requests() const {
  return impl_->scheduler->num_waiting() + impl_->scheduler->num_running() > 0 ||
         !impl_->pending.empty();
}

namespace {

// Appends one token's text to r's stream; returns what may be shown now.
std::string push_text(Request& r, const TokenBytesFn& token_bytes, int32_t token) {
  if (!token_bytes) return {};
  const std::optional<std::string> bytes = token_bytes(token);
  if (!bytes) return {};
  return r.stop_matcher.push(r.utf8.push(*bytes));
}

// Flushes the held-back text at the end of a completion that did not stop on a string.
std::string flush_text(Request& r, const TokenBytesFn& token_bytes) {
  if (!token_bytes || r.stop_matcher.stopped()) return {};
  std::string text = r.stop_matcher.push(r.utf8.finish());
  if (!r.stop_matcher.stopped()) text += r.stop_matcher.finish();
  return text;
}

// The logits rows of [from, to) within a span whose first position is `begin` and first batch
// row `first_token`; the number of rows (0 for an empty range).
int64_t push_rows(std::vector<int64_t>& rows, int64_t first_token, int64_t begin, int64_t from,
                  int64_t to) {
  for (int64_t p = from; p < to; ++p) rows.push_back(first_token + p - begin);
  return std::max<int64_t>(0, to - from);
}

}  // namespace

namespace {

// kInternal naming the non-finite values of a request's logits row: a fault of the model or the
// hardware, not of the request, and not of the other requests of the step.
Status check_logits_row(const Request& r, std::span<const float> logits) {
  int64_t nan = 0, inf = 0;
  for (float x : logits) {
    nan += std::isnan(x) ? 1 : 0;
    inf += std::isinf(x) ? 1 : 0;
  }
  if (nan == 0 && inf == 0) return Status::ok_status();
  return make_error(StatusCode::kInternal,
                    "the model's logits for output token {} of this request are not finite ({} "
                    "NaN, {} infinite of {}); the request is stopped, the others go on",
                    r.num_output_tokens(), nan, inf, logits.size());
}

}  // namespace

std::vector<RequestOutput> EngineCore::step() {
  Impl& m = *impl_;
  Scheduler& scheduler = *m.scheduler;
  std::vector<RequestOutput> outputs = std::move(m.pending);
  m.pending.clear();
  if (scheduler.num_waiting() + scheduler.num_running() == 0) return outputs;

  m.propose_drafts(config_);
  SchedulerOutput plan = scheduler.schedule();
  ++m.num_steps;
  if (plan.chunks.empty()) return outputs;
  const auto now = std::chrono::steady_clock::now();
  for (const ScheduledChunk& c : plan.chunks)
    if (!c.request->first_scheduled) c.request->first_scheduled = now;
  // Decode rows first, then prefill chunks (docs/serving.md §2.2), each group in scheduling order;
  // requests scored by the MTP head ahead of both, as the head's batch is a prefix of this one.
  std::stable_partition(plan.chunks.begin(), plan.chunks.end(), [](const ScheduledChunk& c) {
    return c.num_tokens == 1 && c.request->num_computed_tokens >= c.request->num_prompt_tokens;
  });
  std::stable_partition(plan.chunks.begin(), plan.chunks.end(),
                        [](const ScheduledChunk& c) { return c.request->return_mtp_logits; });

  std::vector<StepChunk> chunks;
  std::vector<BatchSpan> spans;
  m.logits_rows.clear();
  int64_t first_token = 0;
  for (const ScheduledChunk& c : plan.chunks) {
    Request& r = *c.request;
    StepChunk chunk;
    chunk.request = &r;
    chunk.begin = r.num_computed_tokens;
    chunk.num_tokens = c.num_tokens;
    chunk.num_drafts = r.num_drafts();
    chunk.first_token = first_token;
    chunk.first_row = static_cast<int64_t>(m.logits_rows.size());
    const int64_t end = chunk.begin + c.num_tokens;
    if (r.return_prompt_logits) {
      const int64_t from = std::max(chunk.begin, r.num_prompt_logits_sent);
      const int64_t to = std::min(end, r.num_prompt_tokens - 1);
      chunk.num_prompt_rows = push_rows(m.logits_rows, first_token, chunk.begin, from, to);
      r.num_prompt_logits_sent = std::max(r.num_prompt_logits_sent, to);
    }
    chunk.sampled = end - chunk.num_drafts == r.num_tokens();
    if (chunk.sampled)
      push_rows(m.logits_rows, first_token, chunk.begin, end - 1 - chunk.num_drafts, end);
    // The recurrent states after the last non-draft token and each draft but the last, kept by
    // the forward for a rollback.
    spans.push_back({.request = &r,
                     .begin = chunk.begin,
                     .num_tokens = c.num_tokens,
                     .snapshot_slots = m.snapshot_slots(r, chunk.num_drafts)});
    chunks.push_back(std::move(chunk));
    first_token += c.num_tokens;
  }
  model::ForwardBatch batch = make_batch(
      spans, config_.block_size,
      [&](size_t s, int64_t pos) {
        const Request& r = *spans[s].request;
        const auto p = static_cast<size_t>(pos);
        return p < r.tokens.size() ? r.tokens[p] : r.draft_tokens[p - r.tokens.size()];
      },
      m.batch_buffers);
  m.embed_images(chunks);
  batch.given_embeddings = m.given_embeddings;
  const auto vocab = static_cast<size_t>(m.vocab_size);
  m.logits.resize(m.logits_rows.size() * vocab);

  const Status forward =
      m.model->forward(m.ctx, batch, m.cache, m.logits_rows, m.logits.data(), nullptr);
  if (!forward.ok()) {
    // The batch's requests fail; the engine and every other request carry on.
    for (const ScheduledChunk& c : plan.chunks) {
      RequestOutput out = make_output(*c.request);
      out.finished = true;
      out.error = forward;
      scheduler.finish(c.request->id);
      outputs.push_back(std::move(out));
    }
    if (config_.check_invariants) {
      const Status inv = check_invariants();
      DZ_CHECK(inv.ok(), "after a failed step: {}", inv.message());
    }
    return outputs;
  }
  scheduler.advance(plan);
  // n > 1: the other choices fork from a prompt just computed and sample from its logits row.
  for (size_t i = 0, num_chunks = chunks.size(); i < num_chunks; ++i) {
    if (!chunks[i].sampled || chunks[i].request->pending_forks.empty()) continue;
    const int64_t row = chunks[i].first_row + chunks[i].num_prompt_rows;
    for (Request* child : scheduler.fork_pending(*chunks[i].request)) {
      StepChunk fork;
      fork.request = child;
      fork.begin = chunks[i].begin;
      fork.first_row = row;
      fork.sampled = true;
      chunks.push_back(std::move(fork));
    }
  }

  // Requests finish (their blocks freed) only after the MTP head has run over them.
  for (StepChunk& c : chunks) {
    Request& r = *c.request;
    c.out = make_output(r);
    if (c.num_prompt_rows > 0) {
      const float* first = m.logits.data() + static_cast<size_t>(c.first_row) * vocab;
      c.out.new_prompt_logits.assign(first, first + static_cast<size_t>(c.num_prompt_rows) * vocab);
    }
    if (!c.sampled) continue;
    // Row i samples output token num_output + i; a draft is accepted when the sample equals it,
    // so the tokens are plain decoding's, draw for draw (docs/serving.md §4).
    RequestOutput& out = c.out;
    for (int64_t i = 0; i <= c.num_drafts; ++i) {
      float* row =
          m.logits.data() + static_cast<size_t>(c.first_row + c.num_prompt_rows + i) * vocab;
      if (config_.nan_logits_seed == r.sampler.params().seed)  // the test hook: one bad value
        row[static_cast<size_t>(r.num_output_tokens()) % vocab] = std::nanf("");
      if (config_.crash_seed == r.sampler.params().seed) {  // the test hook: a crashing request
        std::fprintf(stderr, "dayzero: --fault-crash-seed %llu: aborting\n",
                     static_cast<unsigned long long>(*config_.crash_seed));
        std::abort();
      }
      const std::span<const float> logits(row, vocab);
      const auto num_output = static_cast<size_t>(r.num_output_tokens());
      const bool forced = num_output < r.forced_output_token_ids.size();
      // A model fault that shows in one request's row fails that request alone.
      if (const Status fault = check_logits_row(r, logits); !fault.ok()) {
        out.finished = true;
        out.error = fault;
        break;
      }
      const SampleResult sample =
          forced ? SampleResult{.token = r.forced_output_token_ids[num_output],
                                .logprob = 0.0f,
                                .top_logprobs = {}}
                 : r.sampler.sample(logits, r.num_output_tokens(), r.prompt(), r.output());
      c.next_token = sample.token;
      if (!forced && r.sampler.is_stop_token(sample.token)) {
        // EOS and stop ids end the completion and are not part of it.
        r.finish_reason = FinishReason::kStop;
      } else {
        r.tokens.push_back(sample.token);
        ++m.generation_tokens;
        out.new_token_ids.push_back(sample.token);
        out.new_samples.push_back(sample);
        if (r.return_logits) out.new_logits.emplace_back(logits.begin(), logits.end());
        out.new_text += push_text(r, config_.token_bytes, sample.token);
        if (r.stop_matcher.stopped())
          r.finish_reason = FinishReason::kStop;
        else if (r.num_output_tokens() >= r.max_tokens || r.num_tokens() >= config_.max_model_len)
          r.finish_reason = FinishReason::kLength;
      }
      if (r.finish_reason != FinishReason::kNone) {
        out.new_text += flush_text(r, config_.token_bytes);
        if (r.stop_matcher.stopped()) r.finish_reason = FinishReason::kStop;
        out.finished = true;
        out.finish_reason = r.finish_reason;
        break;
      }
      if (i == c.num_drafts || sample.token != r.draft_tokens[static_cast<size_t>(i)]) break;
    }
  }
  if (config_.speculative.method == SpeculativeMethod::kMtp && !m.drafting_this_step) {
    // Backed off: no drafts this step, and no head pass either (it would cost a layer and the
    // head per step for drafts nobody makes); these requests draft no more with the head.
    for (size_t i = 0; i < spans.size(); ++i) chunks[i].request->mtp_records_complete = false;
  } else if (config_.speculative.method == SpeculativeMethod::kMtp) {
    // Before the commits trim the tables: the head's batch is the one that ran, drafts included.
    const Status mtp = m.run_mtp_drafts(std::span<StepChunk>(chunks).first(spans.size()),
                                        config_.speculative.num_speculative_tokens());
    if (!mtp.ok())
      for (size_t i = 0; i < spans.size(); ++i) {
        chunks[i].out.finished = true;
        chunks[i].out.error = mtp;
      }
  }
  for (const StepChunk& c : chunks)
    if (c.num_drafts > 0) m.commit_drafts(c);
  if (chunks.front().request->return_mtp_logits) {
    const Status mtp = m.run_mtp(chunks);
    if (!mtp.ok())
      for (StepChunk& c : chunks)
        if (c.request->return_mtp_logits) {
          c.out.finished = true;
          c.out.error = mtp;
        }
  }
  for (StepChunk& c : chunks) {
    const bool scored = !c.out.new_prompt_logits.empty() || !c.out.new_mtp_logits.empty();
    if (!c.sampled && !scored && c.out.error.ok()) continue;  // a prefill chunk with no news
    c.out.num_output_tokens = c.request->num_output_tokens();
    if (c.out.finished) scheduler.finish(c.request->id);
    outputs.push_back(std::move(c.out));
  }
  if (config_.check_invariants) {
    const Status inv = check_invariants();
    DZ_CHECK(inv.ok(), "after step {}: {}", m.num_steps, inv.message());
  }
  return outputs;
}

void EngineCore::Impl::propose_drafts(const EngineConfig& config) {
  const SpeculativeConfig& spec = config.speculative;
  drafting_this_step = spec.enabled() && scheduler->num_running() <= spec.disable_by_batch_size;
  if (!drafting_this_step) return;
  for (Request* r : scheduler->running()) {
    // Decode rows only: not a prefill, not a scoring request.
    if (r->num_computed_tokens < r->num_prompt_tokens || r->return_prompt_logits ||
        r->return_mtp_logits ||
        r->num_output_tokens() < static_cast<int64_t>(r->forced_output_token_ids.size()))
      continue;
    // Room for every draft and the token after them.
    int64_t max_drafts =
        std::min({spec.num_speculative_tokens(), r->max_tokens - r->num_output_tokens() - 1,
                  config.max_model_len - r->num_tokens() - 1});
    if (max_drafts <= 0) continue;
    if (config.propose_drafts_for_test) {
      r->draft_tokens = config.propose_drafts_for_test(r->tokens, max_drafts);
    } else if (spec.method == SpeculativeMethod::kMtp) {
      if (r->mtp_records_complete && r->mtp_draft_position == r->num_tokens())
        r->draft_tokens = r->mtp_drafts;
    } else {
      NgramConfig ngram = spec.ngram;
      ngram.num_speculative_tokens = static_cast<int32_t>(max_drafts);
      r->draft_tokens = propose_ngram(r->tokens, ngram);
    }
    if (r->num_drafts() > max_drafts) r->draft_tokens.resize(static_cast<size_t>(max_drafts));
    for (const int32_t id : r->draft_tokens)
      DZ_CHECK(id >= 0 && id < vocab_size, "draft token {} outside the vocabulary", id);
  }
}

void EngineCore::Impl::commit_drafts(const StepChunk& c) {
  Request& r = *c.request;
  // The position after the last token that is not a draft.
  const int64_t first_draft = c.begin + c.num_tokens - c.num_drafts;
  int64_t accepted = 0;
  while (accepted < c.num_drafts && first_draft + accepted < r.num_tokens() &&
         r.tokens[static_cast<size_t>(first_draft + accepted)] ==
             r.draft_tokens[static_cast<size_t>(accepted)])
    ++accepted;
  ++spec_num_drafts;
  spec_num_draft_tokens += c.num_drafts;
  spec_num_accepted_tokens += accepted;
  for (int64_t j = 0; j < accepted; ++j) ++spec_accepted_per_position[static_cast<size_t>(j)];
  // The state has consumed rejected drafts: back to the one after the last accepted token.
  if (rollback_slot_base > 0 && accepted < c.num_drafts)
    model->copy_state_slot(cache, rollback_slot(r, accepted), r.cache.state_slot);
  // A block boundary the row crossed before its end takes its checkpoint from the kept states.
  scheduler->commit_verified(
      r, first_draft + accepted,
      {.first_position = first_draft, .slots = snapshot_slots(r, c.num_drafts)});
}

Status EngineCore::Impl::run_mtp_drafts(std::span<StepChunk> chunks, int64_t num_drafts) {
  std::vector<BatchSpan> spans;
  std::vector<int64_t> rows;
  std::vector<Request*> drafting;
  for (const StepChunk& c : chunks) {
    Request& r = *c.request;
    spans.push_back({.request = &r, .begin = c.begin, .num_tokens = c.num_tokens});
    if (!c.sampled || c.out.finished) continue;
    // The row of the position before the token just sampled predicts the token after it.
    const int64_t position = r.num_tokens() - 2;
    DZ_CHECK(position >= c.begin && position < c.begin + c.num_tokens,
             "request {}: MTP draft row {} outside its chunk", r.id, position);
    rows.push_back(c.first_token + position - c.begin);
    drafting.push_back(&r);
  }
  // Position p feeds its successor; past the committed tokens (rejected drafts, an eos id) any
  // valid id does, as those records are written again before anything reads them.
  const model::ForwardBatch mtp_batch = make_batch(
      spans, coordinator->block_size(),
      [&](size_t s, int64_t pos) {
        const std::vector<int32_t>& tokens = spans[s].request->tokens;
        const auto next = static_cast<size_t>(pos + 1);
        return next < tokens.size() ? tokens[next] : std::max(chunks[s].next_token, 0);
      },
      mtp_batch_buffers);
  const auto vocab = static_cast<size_t>(vocab_size);
  mtp_logits.resize(rows.size() * vocab);
  DZ_RETURN_IF_ERROR(model->forward_mtp(ctx, mtp_batch, cache, rows, mtp_logits.data(), nullptr));
  auto greedy = [](const float* row, size_t n) {
    return static_cast<int32_t>(std::max_element(row, row + n) - row);
  };
  for (size_t i = 0; i < drafting.size(); ++i) {
    drafting[i]->mtp_drafts = {greedy(mtp_logits.data() + i * vocab, vocab)};
    drafting[i]->mtp_draft_position = drafting[i]->num_tokens();
  }
  if (drafting.empty() || num_drafts < 2) return Status::ok_status();
  // Once more, chained: the first draft fed at the position of the token just sampled (its slot
  // is the scheduler's lookahead slot when the row ended there).
  std::vector<BatchSpan> chain;
  for (Request* r : drafting)
    chain.push_back({.request = r, .begin = r->num_tokens() - 1, .num_tokens = 1});
  const model::ForwardBatch chain_batch = make_batch(
      chain, coordinator->block_size(),
      [&](size_t s, int64_t) { return drafting[s]->mtp_drafts[0]; }, mtp_batch_buffers);
  DZ_RETURN_IF_ERROR(model->forward_mtp_chain(ctx, chain_batch, cache, mtp_logits.data(), nullptr));
  for (size_t i = 0; i < drafting.size(); ++i)
    drafting[i]->mtp_drafts.push_back(greedy(mtp_logits.data() + i * vocab, vocab));
  return Status::ok_status();
}

Status EngineCore::Impl::run_mtp(std::span<StepChunk> chunks) {
  std::vector<BatchSpan> spans;
  std::vector<int64_t> rows;
  int64_t first_token = 0;
  for (StepChunk& c : chunks) {
    Request& r = *c.request;
    if (!r.return_mtp_logits) break;  // they come first
    const int64_t from = std::max(c.begin, r.num_mtp_logits_sent);
    const int64_t to = std::min(c.begin + c.num_tokens, r.num_given_tokens() - 1);
    c.first_mtp_row = static_cast<int64_t>(rows.size());
    c.num_mtp_rows = push_rows(rows, first_token, c.begin, from, to);
    r.num_mtp_logits_sent = std::max(r.num_mtp_logits_sent, to);
    spans.push_back({.request = &r, .begin = c.begin, .num_tokens = c.num_tokens});
    first_token += c.num_tokens;
  }
  // The last span's final position may go when its successor was sampled at the end of the
  // request: no row is wanted and no later step reads its record of the head's cache.
  const StepChunk& tail = chunks[spans.size() - 1];
  if (tail.out.finished && tail.begin + tail.num_tokens >= tail.request->num_given_tokens() &&
      --spans.back().num_tokens == 0)
    spans.pop_back();
  if (spans.empty()) return Status::ok_status();
  // Position p feeds its successor: the next token of the request, or the one just sampled (an
  // eos id is not appended).
  const model::ForwardBatch mtp_batch = make_batch(
      spans, coordinator->block_size(),
      [&](size_t s, int64_t pos) {
        const std::vector<int32_t>& tokens = spans[s].request->tokens;
        const auto next = static_cast<size_t>(pos + 1);
        return next < tokens.size() ? tokens[next] : chunks[s].next_token;
      },
      mtp_batch_buffers);
  const auto vocab = static_cast<size_t>(vocab_size);
  mtp_logits.resize(rows.size() * vocab);
  DZ_RETURN_IF_ERROR(model->forward_mtp(ctx, mtp_batch, cache, rows, mtp_logits.data(), nullptr));
  for (StepChunk& c : chunks) {
    if (c.num_mtp_rows == 0) continue;
    const float* first = mtp_logits.data() + static_cast<size_t>(c.first_mtp_row) * vocab;
    c.out.new_mtp_logits.assign(first, first + static_cast<size_t>(c.num_mtp_rows) * vocab);
  }
  return Status::ok_status();
}

EngineMetrics EngineCore::metrics() const {
  const Scheduler& scheduler = *impl_->scheduler;
  const cache::BlockPoolMetrics pool = impl_->coordinator->block_metrics();
  EngineMetrics m;
  m.num_running = scheduler.num_running();
  m.num_waiting = scheduler.num_waiting();
  m.num_blocks = pool.num_blocks - 1;
  m.num_used_blocks = pool.used;
  m.num_cached_free_blocks = pool.cached;
  m.kv_cache_usage =
      m.num_blocks == 0 ? 0.0 : static_cast<double>(pool.used) / static_cast<double>(m.num_blocks);
  m.prefix_query_tokens = scheduler.counters().prefix_query_tokens;
  m.prefix_hit_tokens = scheduler.counters().prefix_hit_tokens;
  m.prompt_tokens = scheduler.counters().prompt_tokens;
  m.generation_tokens = impl_->generation_tokens;
  m.num_preemptions = scheduler.counters().num_preemptions;
  m.num_steps = impl_->num_steps;
  m.spec_num_drafts = impl_->spec_num_drafts;
  m.spec_num_draft_tokens = impl_->spec_num_draft_tokens;
  m.spec_num_accepted_tokens = impl_->spec_num_accepted_tokens;
  m.spec_accepted_per_position = impl_->spec_accepted_per_position;
  m.images_preprocessed = impl_->images_preprocessed;
  m.image_preprocess_seconds = impl_->image_preprocess_seconds;
  m.images_encoded = impl_->images_encoded;
  m.image_tokens_encoded = impl_->image_tokens_encoded;
  m.image_encode_steps = impl_->image_encode_steps;
  m.image_encode_seconds = impl_->image_encode_seconds;
  if (impl_->rollback_slot_base > 0)
    m.spec_rollback_bytes =
        static_cast<int64_t>(impl_->snapshot_ids.size()) * impl_->cache.state_bytes_per_slot();
  for (const Request* r : scheduler.running()) {
    m.live_tokens += r->num_computed_tokens;
    m.allocated_slots += static_cast<int64_t>(r->cache.block_table.size()) * config_.block_size;
  }
  if (const dist::CommStats* comm = impl_->model->comm_stats()) m.comm = comm->by_key();
  return m;
}

Status EngineCore::check_invariants() const {
  return impl_->scheduler->check_invariants();
}

}  // namespace dz::runtime
