#pragma once
// What goes into and comes out of the serving engine (docs/serving.md §2–§3): its configuration,
// one request, and the incremental outputs a request streams. Shared by EngineCore (one step at a
// time, single-threaded), Engine (its thread-safe wrapper), the CLI and the server.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dayzero/cache/prefix_hash.h"
#include "dayzero/core/status.h"
#include "dayzero/dist/comm.h"
#include "dayzero/runtime/sampler.h"
#include "dayzero/runtime/speculative_config.h"
#include "dayzero/runtime/stop_strings.h"

namespace dz::runtime {

// The bytes one token stands for (the tokenizer's token_bytes); nullopt for an id it lacks.
// runtime/ sits below serve/, so the engine sees the tokenizer only through this.
using TokenBytesFn = std::function<std::optional<std::string>(int32_t token)>;

struct EngineConfig {
  int64_t max_num_seqs = 32;             // running requests; also the number of live state slots
  int64_t max_num_batched_tokens = 512;  // token budget of one step
  int64_t max_queued_requests = 256;     // Engine::submit beyond it: kResourceExhausted
  int64_t long_prefill_threshold = 0;    // 0: max_num_batched_tokens / 2
  int64_t max_long_partial_prefills = 1;
  int64_t block_size = 64;  // tokens per KV block
  int64_t num_blocks = 0;   // KV blocks incl. the null block; 0: from kv_cache_bytes
  int64_t kv_cache_bytes = int64_t{1} << 30;
  int64_t reserve_blocks = -1;   // emergency reserve; -1: max_num_seqs (one per decode)
  int64_t max_model_len = 4096;  // prompt + output tokens of one request
  bool enable_prefix_caching = true;
  // Image embeddings kept after encoding, by content hash, at most this many bytes (least
  // recently used dropped first): a repeated image is encoded once.
  int64_t encoder_cache_bytes = int64_t{256} << 20;
  // Image tokens the vision encoder makes in one step (vLLM's max_num_encoder_input_tokens): a
  // chunk stops before an image the step cannot encode. 0: max(max_num_batched_tokens, the
  // model's largest image).
  int64_t max_num_encoder_tokens = 0;
  int64_t max_state_checkpoints = -1;        // hybrid models; -1: 2 · max_num_seqs
  int64_t state_checkpoint_interval = 1024;  // multiple of block_size
  std::string model_identity;  // seeds the prefix-hash chain (two models never share entries)
  std::vector<int32_t> eos_token_ids;
  TokenBytesFn token_bytes;       // needed for text output and stop strings; may be empty
  bool check_invariants = false;  // cache invariants after every step (tests, debug builds)
  // Fault injection for tests: one logit of every request sampled with this seed reads as NaN,
  // which fails that request alone (docs/serving.md §5.4).
  std::optional<uint64_t> nan_logits_seed;
  // Fault injection for tests: the process aborts when it is about to sample for a request with
  // this seed (a worker crash that a request causes, docs/serving.md §5.10).
  std::optional<uint64_t> crash_seed;
  // Speculative decoding (docs/serving.md §4); method kNone: off.
  SpeculativeConfig speculative;
  // Tests: proposes the drafts instead of the method's proposer, given a request's tokens
  // (prompt then output) and the most drafts it may have.
  std::function<std::vector<int32_t>(std::span<const int32_t> tokens, int64_t max_drafts)>
      propose_drafts_for_test;
  // Engine only: called on the loop thread after a step's outputs reached their streams (a worker
  // process forwards them then).
  std::function<void()> on_outputs;
};

// An image in a prompt (docs/vision.md §4): its placeholder tokens fill [offset, offset +
// num_tokens) of the prompt; the engine preprocesses and encodes `data` (the image file) when a
// chunk first needs its embeddings, and keeps them by `hash` for later requests.
struct PromptImage {
  int64_t offset = 0;
  int64_t num_tokens = 0;
  cache::BlockHash hash;                    // content hash (runtime/prompt_images.h)
  std::shared_ptr<const std::string> data;  // the file's bytes
};

struct GenerationRequest {
  std::vector<int32_t> prompt_token_ids;  // non-empty, ids in the vocabulary
  std::vector<PromptImage> images;        // in prompt order, over placeholder tokens
  SamplingParams sampling;
  int64_t max_tokens = 16;     // ≥ 1; prompt + max_tokens ≤ max_model_len
  int32_t priority = 0;        // lower runs first; FCFS among equals
  std::string cache_salt;      // isolates prefix-cache entries between tenants
  uint32_t choice_index = 0;   // the sampler's choice stream (EngineCore::add_choices sets it)
  bool return_logits = false;  // tests and verification: the FP32 logits row of every sampled token
  // Scoring (`dayzero logits`, `dayzero perplexity`; vLLM's prompt_logprobs, unreduced): the FP32
  // logits of every prompt position but the last, row t predicting prompt token t + 1. The last
  // position's row is the first sampled token's (return_logits). Needs prefix caching off.
  bool return_prompt_logits = false;
  // Teacher forcing: the first outputs are these ids instead of samples, one decode step each
  // (eos ids among them do not end the request). At most max_tokens of them.
  std::vector<int32_t> forced_output_token_ids;
  // The MTP head's logits of every position t whose successor is given (a prompt or forced
  // token), predicting token t + 2. Needs a model with an MTP head and prefix caching off (the
  // head's cache records exist only for positions this request computed).
  bool return_mtp_logits = false;
  // Migration to a new worker (docs/serving.md §5.10): the tokens this request generated before.
  // They are recomputed as a prefix after the prompt and count as output: toward max_tokens,
  // min_tokens and the penalties, as the sampler's position, and for stop strings; no output
  // repeats them. Fewer than max_tokens; not with forced tokens or logits outputs.
  std::vector<int32_t> resumed_output_token_ids;
};

// One delta of a request's stream. The concatenation of every delta's new_token_ids is the
// output; of new_text, the completion text (UTF-8 held back until whole, stop strings cut).
struct RequestOutput {
  int64_t request_id = 0;
  std::vector<int32_t> new_token_ids;
  std::vector<SampleResult> new_samples;       // with logprobs when asked (token, logprob, top)
  std::vector<std::vector<float>> new_logits;  // return_logits: one [vocab] row per new token
  // return_prompt_logits / return_mtp_logits: [rows, vocab], the positions this step scored in
  // order (concatenated over the deltas: every prompt position but the last; every MTP row).
  std::vector<float> new_prompt_logits;
  std::vector<float> new_mtp_logits;
  std::string new_text;  // empty without EngineConfig::token_bytes
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  bool aborted = false;  // cancelled (finish_reason stays kNone)
  Status error;          // a request that failed (e.g. the model refused its batch)
  int64_t num_prompt_tokens = 0;
  int64_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache at (last) admission;
                                  // the whole prompt for a choice forked from another
  int64_t num_output_tokens = 0;  // generated so far
  int64_t num_preemptions = 0;    // times this request was preempted and recomputed
  // When the request first got tokens into a step (queue time = this − arrival); unset while it
  // has only waited.
  std::optional<std::chrono::steady_clock::time_point> first_scheduled;
};

struct EngineMetrics {
  int64_t num_running = 0;
  int64_t num_waiting = 0;
  int64_t num_blocks = 0;       // null block excluded
  int64_t num_used_blocks = 0;  // held by requests
  int64_t num_cached_free_blocks = 0;
  double kv_cache_usage = 0.0;  // used / num_blocks
  int64_t prefix_query_tokens = 0;
  int64_t prefix_hit_tokens = 0;
  int64_t prompt_tokens = 0;      // counted at admission (each choice of n > 1)
  int64_t generation_tokens = 0;  // sampled
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;
  int64_t live_tokens = 0;      // tokens held in the cache by running requests
  int64_t allocated_slots = 0;  // blocks held by running requests × block_size
  // A multi-rank model's traffic so far (rank 0's, by layer and collective; the step
  // descriptions under dist::kStepLayer); empty in one process.
  std::map<dist::CommKey, dist::CommCounts> comm;
  // Speculative decoding (vLLM's spec_decode metrics): verification rows with drafts, drafts
  // verified, drafts accepted, and accepted by position (index j: the (j+1)-th draft of a row).
  int64_t spec_num_drafts = 0;
  int64_t spec_num_draft_tokens = 0;
  int64_t spec_num_accepted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_position;
  // The memory speculation keeps for rollback: one recurrent state per running request of a
  // hybrid model (0 otherwise: rejected KV rows are overwritten later).
  int64_t spec_rollback_bytes = 0;
  // Set by a worker supervisor (0 in process): worker groups restarted after a failure, and
  // requests moved to a new group.
  int64_t worker_restarts = 0;
  int64_t requests_migrated = 0;
  // Images (docs/vision.md §4): preprocessed at submission, encoded by the encoder step (tokens:
  // the merged tokens they gave; steps: the steps that ran the tower), and the seconds each took.
  int64_t images_preprocessed = 0;
  double image_preprocess_seconds = 0.0;
  int64_t images_encoded = 0;
  int64_t image_tokens_encoded = 0;
  int64_t image_encode_steps = 0;
  double image_encode_seconds = 0.0;
};

}  // namespace dz::runtime
