#pragma once
// The engine's state of one request (docs/serving.md §2): its tokens (prompt then output), how many
// of them the cache holds, its place in the queues, what it holds in the cache
// (cache::SequenceCache) and its sampling and text-streaming state. There is no prefill or decode
// phase: each step lets num_computed_tokens catch up with tokens.size(), and chunked prefill,
// prefix hits and recompute after preemption follow from that.

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dayzero/cache/cache_coordinator.h"
#include "dayzero/model/vision/image_processor.h"
#include "dayzero/runtime/engine_types.h"
#include "dayzero/runtime/sampler.h"
#include "dayzero/runtime/stop_strings.h"
#include "dayzero/runtime/utf8_stream.h"

namespace dz::runtime {

// kForkPending: a choice of an n > 1 request, waiting for its first sibling's prompt to be computed
// so that it can fork from it.
enum class RequestStatus : uint8_t { kWaiting, kForkPending, kRunning, kFinished };

inline std::vector<cache::ImagePlacement> placements_of(const std::vector<PromptImage>& images) {
  std::vector<cache::ImagePlacement> out;
  for (const PromptImage& image : images)
    out.push_back({.offset = image.offset, .num_tokens = image.num_tokens, .hash = image.hash});
  return out;
}

struct Request {
  Request(int64_t request_id, GenerationRequest request, std::span<const int32_t> eos_token_ids)
      : id(request_id),
        tokens(std::move(request.prompt_token_ids)),
        num_prompt_tokens(static_cast<int64_t>(tokens.size())),
        priority(request.priority),
        max_tokens(request.max_tokens),
        cache_salt(std::move(request.cache_salt)),
        return_logits(request.return_logits),
        return_prompt_logits(request.return_prompt_logits),
        return_mtp_logits(request.return_mtp_logits),
        forced_output_token_ids(std::move(request.forced_output_token_ids)),
        images(std::move(request.images)),
        sampler(request.sampling, eos_token_ids, request.choice_index),
        stop_matcher(request.sampling.stop, request.sampling.include_stop_str_in_output) {
    tokens.insert(tokens.end(), request.resumed_output_token_ids.begin(),
                  request.resumed_output_token_ids.end());
  }

  int64_t id = 0;
  std::vector<int32_t> tokens;  // prompt + output
  int64_t num_prompt_tokens = 0;
  int64_t num_computed_tokens = 0;  // tokens whose cache records are written
  int64_t num_cached_tokens = 0;    // prefix-cache hit at the last admission
  int32_t priority = 0;             // lower runs first
  uint64_t arrival_seq = 0;         // FCFS among equal priorities; kept across preemptions
  RequestStatus status = RequestStatus::kWaiting;

  // The block table covers [0, num_computed_tokens + scheduled).
  cache::SequenceCache cache;
  // n > 1: the choices that fork from this request once its prompt is computed.
  std::vector<Request*> pending_forks;
  Request* fork_parent = nullptr;  // while kForkPending

  int64_t max_tokens = 0;
  std::string cache_salt;
  bool return_logits = false;
  bool return_prompt_logits = false;
  bool return_mtp_logits = false;
  std::vector<int32_t> forced_output_token_ids;
  std::vector<PromptImage> images;  // in prompt order
  // The same images as the prefix cache keys them (filled from `images` on construction).
  std::vector<cache::ImagePlacement> image_placements = placements_of(images);
  // Each image preprocessed at submission, until its embeddings are encoded (then released).
  std::vector<std::shared_ptr<const model::ProcessedImage>> processed_images;
  // Speculative decoding (docs/serving.md §4): the drafts proposed to follow tokens in this step,
  // scheduled after the last token and verified by its logits; cleared by the step.
  std::vector<int32_t> draft_tokens;
  // The MTP head's drafts from position mtp_draft_position on (speculative method "mtp"), from
  // the step that made that position the next one; stale once the tokens moved on.
  std::vector<int32_t> mtp_drafts;
  int64_t mtp_draft_position = -1;
  // Whether the MTP head ran over every position this request computed: a step while speculation
  // is backed off skips the head, and the request drafts no more with it (its attention would
  // read holes).
  bool mtp_records_complete = true;
  // Positions below these were scored already (a recompute after preemption repeats none).
  int64_t num_prompt_logits_sent = 0;
  int64_t num_mtp_logits_sent = 0;
  Sampler sampler;
  StopMatcher stop_matcher;
  Utf8Stream utf8;
  int64_t num_preemptions = 0;
  std::optional<std::chrono::steady_clock::time_point> first_scheduled;
  FinishReason finish_reason = FinishReason::kNone;

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
  int64_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt() const {
    return std::span<const int32_t>(tokens).first(static_cast<size_t>(num_prompt_tokens));
  }
  cache::SequenceTokens cache_tokens() const {
    return {.tokens = tokens,
            .num_prompt_tokens = num_prompt_tokens,
            .cache_salt = cache_salt,
            .images = image_placements};
  }
  std::span<const int32_t> output() const {
    return std::span<const int32_t>(tokens).subspan(static_cast<size_t>(num_prompt_tokens));
  }
  // Prompt and forced tokens: the positions before the last of them have a given successor.
  int64_t num_given_tokens() const {
    return num_prompt_tokens + static_cast<int64_t>(forced_output_token_ids.size());
  }
  // Tokens still to run through the model (the last sampled one included; not the drafts).
  int64_t num_uncomputed() const { return num_tokens() - num_computed_tokens; }
  int64_t num_drafts() const { return static_cast<int64_t>(draft_tokens.size()); }
};

}  // namespace dz::runtime
