#include "dayzero/cli/generate_batch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/core/logging.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/formats/npy.h"
#include "dayzero/runtime/engine.h"
#include "dayzero/runtime/generation_config.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

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

Result<runtime::EngineConfig> engine_config(const BatchGenerateArgs& args, int64_t num_prompts) {
  const EngineArgs& e = args.engine;
  runtime::EngineConfig config;
  config.max_num_seqs = e.max_num_seqs;
  config.max_num_batched_tokens = e.max_num_batched_tokens;
  config.max_queued_requests = std::max(config.max_queued_requests, num_prompts);
  config.long_prefill_threshold = e.long_prefill_threshold;
  config.block_size = args.model.block_size;
  config.num_blocks = e.num_blocks;
  DZ_ASSIGN_OR_RETURN(config.kv_cache_bytes,
                      parse_memory_size(e.kv_cache_memory, "--kv-cache-memory"));
  if (e.max_model_len > 0) {
    config.max_model_len = e.max_model_len;
  } else {
    DZ_ASSIGN_OR_RETURN(config.max_model_len, default_max_model_len(args.model.model_dir));
  }
  config.enable_prefix_caching = !e.no_prefix_caching;
  config.max_state_checkpoints = e.max_state_checkpoints;
  // The checkpoint interval must be a multiple of the block size: the multiple nearest 1024
  // from above.
  config.state_checkpoint_interval = (config.state_checkpoint_interval + config.block_size - 1) /
                                     config.block_size * config.block_size;
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::weakly_canonical(args.model.model_dir, ec);
  config.model_identity =
      (ec ? args.model.model_dir : dir.string()) + "|kv_cache_dtype=" + args.model.kv_cache_dtype;
  return config;
}

// The request of one line: text tokenized (BOS prepended when the checkpoint asks for it) or the
// given ids as they are.
Result<runtime::GenerationRequest> make_request(const PromptLine& line,
                                                const serve::Tokenizer& tokenizer,
                                                const runtime::GenerationDefaults& defaults,
                                                bool return_logits) {
  runtime::GenerationRequest request;
  if (line.prompt) {
    DZ_ASSIGN_OR_RETURN(request.prompt_token_ids, tokenizer.encode(*line.prompt));
    if (defaults.add_bos_token && defaults.bos_token_id)
      request.prompt_token_ids.insert(request.prompt_token_ids.begin(), *defaults.bos_token_id);
    if (request.prompt_token_ids.empty())
      return make_error(StatusCode::kInvalidArgument, "the prompt encodes to no tokens");
  } else {
    request.prompt_token_ids = line.prompt_token_ids;
  }
  request.sampling = line.sampling;
  request.max_tokens = line.max_tokens;
  request.priority = line.priority;
  request.return_logits = return_logits;
  return request;
}

struct Completion {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<float> logits;  // [num_rows, vocab]
  int64_t num_logits_rows = 0;
  runtime::RequestOutput last;
};

Completion collect(runtime::RequestStream& stream) {
  Completion result;
  while (!stream.finished()) {
    std::optional<runtime::RequestOutput> output = stream.next(std::chrono::seconds(1));
    if (!output) continue;
    result.tokens.insert(result.tokens.end(), output->new_token_ids.begin(),
                         output->new_token_ids.end());
    result.text += output->new_text;
    for (const std::vector<float>& row : output->new_logits) {
      result.logits.insert(result.logits.end(), row.begin(), row.end());
      ++result.num_logits_rows;
    }
    result.last = std::move(*output);
  }
  return result;
}

std::string finish_reason(const runtime::RequestOutput& last) {
  if (!last.error.ok()) return "error";
  if (last.aborted) return "abort";
  return std::string(runtime::finish_reason_name(last.finish_reason));
}

std::string json_line(int64_t index, const Completion& c) {
  nlohmann::ordered_json line;
  line["index"] = index;
  line["text"] = c.text;
  line["tokens"] = c.tokens;
  line["finish_reason"] = finish_reason(c.last);
  if (!c.last.error.ok()) line["error"] = c.last.error.to_string();
  line["prompt_tokens"] = c.last.num_prompt_tokens;
  line["cached_tokens"] = c.last.num_cached_tokens;
  line["preemptions"] = c.last.num_preemptions;
  return line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
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
      .add_option("--kv-cache-memory", args.kv_cache_memory,
                  "KV cache budget when --num-blocks is 0: bytes, or with a KiB, MiB or GiB suffix")
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

Status run_prompts_file(const BatchGenerateArgs& args) {
  DZ_ASSIGN_OR_RETURN(std::vector<PromptLine> lines,
                      load_prompts_file(args.prompts_file, args.defaults));
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<serve::Tokenizer> tokenizer,
                      serve::load_tokenizer(args.model.model_dir));
  DZ_ASSIGN_OR_RETURN(runtime::GenerationDefaults defaults,
                      runtime::load_generation_defaults(args.model.model_dir));
  const bool dump_logits = !args.dump_logits_dir.empty();
  std::vector<runtime::GenerationRequest> requests;
  for (const PromptLine& line : lines) {
    auto request = make_request(line, *tokenizer, defaults, dump_logits);
    if (!request.ok())
      return request.status().with_context(
          fmt::format("{} line {}", args.prompts_file, line.line_number));
    requests.push_back(std::move(*request));
  }
  if (dump_logits) {
    std::error_code ec;
    std::filesystem::create_directories(args.dump_logits_dir, ec);
    if (ec)
      return make_error(StatusCode::kIo, "--dump-logits {}: {}", args.dump_logits_dir,
                        ec.message());
  }

  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> model, load_model(args.model));
  DZ_ASSIGN_OR_RETURN(runtime::EngineConfig config,
                      engine_config(args, static_cast<int64_t>(requests.size())));
  config.eos_token_ids = defaults.eos_token_ids;
  const serve::Tokenizer* tok = tokenizer.get();
  config.token_bytes = [tok](int32_t id) -> std::optional<std::string> {
    std::optional<std::string_view> bytes = tok->token_bytes(id);
    if (!bytes) return std::nullopt;
    return std::string(*bytes);
  };
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine,
                      runtime::Engine::create(*model, exec_context(args.model), config));

  const auto start = std::chrono::steady_clock::now();
  std::vector<std::shared_ptr<runtime::RequestStream>> streams;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto stream = engine->submit(std::move(requests[i]));
    if (!stream.ok())
      return stream.status().with_context(
          fmt::format("{} line {}", args.prompts_file, lines[i].line_number));
    streams.push_back(std::move(*stream));
  }
  int64_t num_prompt_tokens = 0;
  int64_t num_generated = 0;
  int64_t num_failed = 0;
  for (size_t i = 0; i < streams.size(); ++i) {
    const Completion completion = collect(*streams[i]);
    streams[i].reset();
    num_prompt_tokens += completion.last.num_prompt_tokens;
    num_generated += completion.last.num_output_tokens;
    if (!completion.last.error.ok()) ++num_failed;
    const std::string text = json_line(static_cast<int64_t>(i), completion);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    if (dump_logits) {
      const std::string path = fmt::format("{}/{}.npy", args.dump_logits_dir, i);
      DZ_RETURN_IF_ERROR(formats::write_npy_f32(
          path, completion.logits, Shape{completion.num_logits_rows, model->vocab_size()}));
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const runtime::EngineMetrics metrics = engine->metrics();
  const double hit_rate = metrics.prefix_query_tokens > 0
                              ? static_cast<double>(metrics.prefix_hit_tokens) /
                                    static_cast<double>(metrics.prefix_query_tokens)
                              : 0.0;
  spdlog::info(
      "{} requests ({} failed): {} prompt tokens, {} generated in {:.3f} s ({:.1f} tokens/s); {} "
      "steps, {} preemptions, prefix cache hit rate {:.1f}%",
      streams.size(), num_failed, num_prompt_tokens, num_generated, seconds,
      seconds > 0 ? static_cast<double>(num_generated) / seconds : 0.0, metrics.num_steps,
      metrics.num_preemptions, 100.0 * hit_rate);
  if (num_failed > 0)
    return make_error(StatusCode::kInternal, "{} of {} requests failed (see their \"error\")",
                      num_failed, streams.size());
  return Status::ok_status();
}

}  // namespace dz::cli
