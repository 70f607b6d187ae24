#include "dayzero/cli/engine_args.h"

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "dayzero/formats/hf_config.h"

namespace dz::cli {
namespace {

constexpr int64_t kDefaultMaxModelLen = 4096;

// min(4096, max_position_embeddings of config.json, text_config when nested).
Result<int64_t> default_max_model_len(const std::string& model_dir) {
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject config,
                      formats::ConfigObject::load(model_dir + "/config.json"));
  DZ_ASSIGN_OR_RETURN(std::optional<formats::ConfigObject> text,
                      config.optional_object("text_config"));
  const formats::ConfigObject& fields = text ? *text : config;
  DZ_ASSIGN_OR_RETURN(std::optional<int64_t> max_positions,
                      fields.optional_positive_int("max_position_embeddings"));
  return std::min(kDefaultMaxModelLen, max_positions.value_or(kDefaultMaxModelLen));
}

}  // namespace

void add_engine_options(CLI::App& command, EngineArgs& args) {
  command.add_option("--max-num-seqs", args.max_num_seqs, "most requests running at once")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      .add_option("--max-num-batched-tokens", args.max_num_batched_tokens,
                  "token budget of one engine step (prefill chunks + decode tokens)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      .add_option("--num-blocks", args.num_blocks,
                  "KV cache blocks including the null block; 0: as many as --kv-cache-memory holds")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command
      .add_option(
          "--kv-cache-memory", args.kv_cache_memory,
          "KV cache budget per rank when --num-blocks is 0: bytes, or with a KiB, MiB or GiB "
          "suffix (under --cp C the pool holds C times the blocks)")
      ->capture_default_str();
  command
      .add_option("--max-model-len", args.max_model_len,
                  "prompt + output tokens of one request; 0: min(4096, max_position_embeddings)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command.add_flag("--no-prefix-caching", args.no_prefix_caching,
                   "never reuse cached blocks of earlier prompts");
  command
      .add_option("--max-state-checkpoints", args.max_state_checkpoints,
                  "recurrent-state checkpoint slots of hybrid models; -1: 2 * --max-num-seqs")
      ->check(integer_at_least(-1))
      ->capture_default_str();
  command
      .add_option(
          "--state-checkpoint-interval", args.state_checkpoint_interval,
          "hybrid models: also checkpoint the recurrent state every this many prompt tokens "
          "(rounded up to a multiple of --block-size) for prefix-cache hits")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command
      .add_option("--long-prefill-threshold", args.long_prefill_threshold,
                  "most prefill tokens of one long prompt per step; 0: max-num-batched-tokens / 2")
      ->check(integer_at_least(0))
      ->capture_default_str();
  command
      .add_option("--max-num-encoder-tokens", args.max_num_encoder_tokens,
                  "image tokens the vision encoder makes per engine step; 0: "
                  "max(--max-num-batched-tokens, the model's largest image)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  // Hidden: fault injection for the containment tests (docs/serving.md §5.4).
  command
      .add_option("--fault-nan-logits-seed", args.fault_nan_logits_seed,
                  "one NaN in the logits of requests with this sampling seed")
      ->group("");
  command.add_option(
      "--speculative-config", args.speculative_config,
      "speculative decoding as JSON, vLLM's spelling: '{\"method\": \"ngram\", "
      "\"num_speculative_tokens\": 3, \"prompt_lookup_min\": 2, \"prompt_lookup_max\": 4}' "
      "(also \"disable_by_batch_size\", default 8: no drafts while more requests run)");
  command
      .add_option("--fault-crash-seed", args.fault_crash_seed,
                  "abort the process when sampling for a request with this seed")
      ->group("");
}

Result<int64_t> parse_memory_size(const std::string& text, const char* flag) {
  static constexpr std::pair<const char*, int64_t> kSuffixes[] = {
      {"KiB", int64_t{1} << 10}, {"MiB", int64_t{1} << 20}, {"GiB", int64_t{1} << 30}};
  std::string digits = text;
  int64_t unit = 1;
  for (const auto& [suffix, bytes] : kSuffixes) {
    const std::string s = suffix;
    if (digits.size() > s.size() && digits.ends_with(s)) {
      digits.resize(digits.size() - s.size());
      unit = bytes;
      break;
    }
  }
  const bool all_digits =
      !digits.empty() && digits.size() <= 12 &&
      std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!all_digits || std::stoll(digits) == 0)
    return make_error(StatusCode::kInvalidArgument,
                      "{}: expected a positive number of bytes, optionally with a KiB, MiB or GiB "
                      "suffix (e.g. 512MiB), got \"{}\"",
                      flag, text);
  return std::stoll(digits) * unit;
}

Result<runtime::EngineConfig> engine_config(const ModelArgs& model, const EngineArgs& e) {
  runtime::EngineConfig config;
  config.max_num_seqs = e.max_num_seqs;
  config.max_num_batched_tokens = e.max_num_batched_tokens;
  config.max_queued_requests = e.max_queued_requests;
  config.long_prefill_threshold = e.long_prefill_threshold;
  config.max_num_encoder_tokens = e.max_num_encoder_tokens;
  config.block_size = model.block_size;
  config.num_blocks = e.num_blocks;
  DZ_ASSIGN_OR_RETURN(config.kv_cache_bytes,
                      parse_memory_size(e.kv_cache_memory, "--kv-cache-memory"));
  if (e.max_model_len > 0) {
    config.max_model_len = e.max_model_len;
  } else {
    DZ_ASSIGN_OR_RETURN(config.max_model_len, default_max_model_len(model.model_dir));
  }
  config.enable_prefix_caching = !e.no_prefix_caching;
  config.nan_logits_seed = e.fault_nan_logits_seed;
  config.crash_seed = e.fault_crash_seed;
  config.max_state_checkpoints = e.max_state_checkpoints;
  DZ_ASSIGN_OR_RETURN(config.speculative, runtime::parse_speculative_config(e.speculative_config));
  // Checkpoints sit at block boundaries: the interval is rounded up to a multiple of the block.
  config.state_checkpoint_interval =
      (e.state_checkpoint_interval + config.block_size - 1) / config.block_size * config.block_size;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::weakly_canonical(model.model_dir, ec);
  config.model_identity = (ec ? model.model_dir : dir.string()) +
                          "|kv_cache_dtype=" + model.kv_cache_dtype +
                          "|mxfp4_activations=" + model.mxfp4_activations;
  return config;
}

}  // namespace dz::cli
