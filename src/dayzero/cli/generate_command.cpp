// `dayzero generate [--model DIR] --prompt TEXT [--max-tokens N] [--temperature T] [--top-p P]
// [--top-k K] [--min-p P] [--repetition-penalty R] [--stop S]... [--seed S] [--ignore-eos]
// [--timing]`: one completion, streamed to stdout as tokens arrive (incomplete UTF-8 characters
// and text that may start a stop string held back), ending at an eos id of the checkpoint (unless
// --ignore-eos), a stop string or after N tokens. --timing prints one JSON line on stderr with the
// prefill and decode times (wall and process CPU) for benchmarks (bench/peer_demo.py).
// The prompt is one request through the serving engine (engine_request.h), with the server's
// stop strings, UTF-8 hold-back, sampling, and generation_config.json's eos ids, BOS and sampling
// defaults for the flags not given (greedy where the checkpoint has none); the engine
// flags apply, but the KV cache holds just the request unless --num-blocks is given.
// With --prompts-file FILE.jsonl instead of --prompt, every prompt of the file runs concurrently
// through the engine (generate_batch.h), one JSON line per prompt.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/default_model.h"
#include "dayzero/cli/engine_args.h"
#include "dayzero/cli/engine_request.h"
#include "dayzero/cli/generate_batch.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/cli/prompt_images.h"
#include "dayzero/core/logging.h"
#include "dayzero/runtime/engine_core.h"
#include "dayzero/runtime/generation_config.h"
#include "dayzero/runtime/sampler.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::cli {
namespace {

struct GenerateArgs {
  ModelArgs model;
  std::string prompt;
  std::vector<std::string> images;  // image files, in the order of their placeholders
  int64_t max_tokens = 128;
  float temperature = 0.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::string> stop;
  uint64_t seed = 0;
  bool ignore_eos = false;
  bool timing = false;
  std::string prompts_file;
  EngineArgs engine;
  std::string dump_logits_dir;
  runtime::SamplingFieldsGiven given;  // the sampling flags on the command line
};

// The flags' sampling parameters; generation_config.json's defaults for the flags not given, as
// the server applies them to a request's missing fields (the flags' own defaults, greedy and no
// filters, where the checkpoint has none).
Result<runtime::SamplingParams> sampling_params(const GenerateArgs& args) {
  DZ_ASSIGN_OR_RETURN(runtime::GenerationDefaults defaults,
                      runtime::load_generation_defaults(args.model.model_dir));
  runtime::SamplingParams s{.temperature = args.temperature,
                            .top_p = args.top_p,
                            .top_k = args.top_k,
                            .min_p = args.min_p,
                            .repetition_penalty = args.repetition_penalty,
                            .seed = args.seed,
                            .stop = args.stop};
  s.ignore_eos = args.ignore_eos;
  runtime::apply_generation_defaults(s, args.given, defaults);
  DZ_RETURN_IF_ERROR(runtime::validate_sampling_params(s));
  return s;
}

// CPU seconds of this process (all its threads).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

void write_out(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

Status run(const GenerateArgs& args) {
  DZ_ASSIGN_OR_RETURN(runtime::GenerationDefaults defaults,
                      runtime::load_generation_defaults(args.model.model_dir));
  runtime::GenerationRequest request;
  DZ_ASSIGN_OR_RETURN(request.sampling, sampling_params(args));
  request.max_tokens = args.max_tokens;
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<serve::Tokenizer> tokenizer,
                      serve::load_tokenizer(args.model.model_dir));
  // The serving engine with the same flags, eos ids and text stream as `dayzero serve`.
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> model, load_model(args.model));
  if (model == nullptr) return Status::ok_status();  // a rank that followed rank 0's steps
  DZ_ASSIGN_OR_RETURN(const std::vector<runtime::ImageUpload> uploads,
                      load_images(*model, args.images));
  DZ_ASSIGN_OR_RETURN(const std::string prompt, text_with_images(args.prompt, uploads));
  DZ_ASSIGN_OR_RETURN(request.prompt_token_ids, tokenizer->encode(prompt));
  if (defaults.add_bos_token && defaults.bos_token_id)
    request.prompt_token_ids.insert(request.prompt_token_ids.begin(), *defaults.bos_token_id);
  if (request.prompt_token_ids.empty())
    return make_error(StatusCode::kInvalidArgument, "--prompt: the prompt encodes to no tokens");
  DZ_RETURN_IF_ERROR(place_images(*model, uploads, request));
  const auto num_prompt = static_cast<int64_t>(request.prompt_token_ids.size());
  DZ_ASSIGN_OR_RETURN(runtime::EngineConfig config, engine_config(args.model, args.engine));
  config.eos_token_ids = defaults.eos_token_ids;
  config.token_bytes = token_bytes_of(*tokenizer);
  if (args.engine.num_blocks == 0) {
    // One request needs no pool of --kv-cache-memory (whose allocation alone takes most of a
    // short run): the blocks of its whole context, with no reserve beside them.
    config.num_blocks =
        1 + (num_prompt + args.max_tokens + config.block_size - 1) / config.block_size;
    config.reserve_blocks = 0;
  }
  const ExecContext ctx = exec_context(args.model);
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<runtime::EngineCore> engine,
                      runtime::EngineCore::create(*model, ctx, config));

  // The prefill is every step up to the first sample; each later step decodes one token. Step
  // times leave out the writing of the text (timed from the end of the previous output).
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const double start_cpu = process_cpu_seconds();
  Clock::time_point prefill_end;
  double prefill_cpu = 0.0;
  Clock::time_point step_start;
  double step_start_cpu = 0.0;
  double decode_seconds = 0.0;
  double decode_cpu = 0.0;
  double first_step_seconds = 0.0;
  double first_step_cpu = 0.0;
  int64_t num_generated = 0;     // outputs (engine steps that sampled), an eos id's included
  int64_t num_first_tokens = 0;  // the first output's tokens (more than one never; kept exact)
  std::vector<int32_t> output_ids;
  DZ_RETURN_IF_ERROR(run_request(*engine, std::move(request), [&](runtime::RequestOutput& out) {
    const auto now = Clock::now();
    const double cpu = process_cpu_seconds();
    if (num_generated == 0) {
      prefill_end = now;
      prefill_cpu = cpu - start_cpu;
    } else {
      const double wall = std::chrono::duration<double>(now - step_start).count();
      if (num_generated == 1) {
        first_step_seconds = wall;
        first_step_cpu = cpu - step_start_cpu;
      }
      decode_seconds += wall;
      decode_cpu += cpu - step_start_cpu;
    }
    if (num_generated == 0) num_first_tokens = static_cast<int64_t>(out.new_token_ids.size());
    ++num_generated;
    output_ids.insert(output_ids.end(), out.new_token_ids.begin(), out.new_token_ids.end());
    write_out(out.new_text);
    step_start = Clock::now();
    step_start_cpu = process_cpu_seconds();
    return Status::ok_status();
  }));
  write_out("\n");
  const auto end = Clock::now();
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  const auto num_output = static_cast<int64_t>(output_ids.size());
  spdlog::info("prompt {} tokens in {:.3f} s; {} generated in {:.3f} s", num_prompt,
               seconds(start, prefill_end), num_output, seconds(prefill_end, end));
  if (args.timing) {
    const runtime::EngineMetrics metrics = engine->metrics();
    nlohmann::json timing = {{"prompt_tokens", num_prompt},
                             {"threads", ctx.num_threads},
                             {"prefill_s", seconds(start, prefill_end)},
                             {"prefill_cpu_s", prefill_cpu},
                             // Tokens (an eos id not counted); with speculative
                             // decoding a step may give several.
                             {"generated", num_output},
                             {"decode_steps", num_generated - 1},
                             {"decode_tokens", num_output - num_first_tokens},
                             {"decode_s", decode_seconds},
                             {"decode_cpu_s", decode_cpu},
                             {"decode_first_step_s", first_step_seconds},
                             {"decode_first_step_cpu_s", first_step_cpu},
                             {"tokens", output_ids}};
    if (config.speculative.enabled())
      timing["speculative"] = {{"drafts", metrics.spec_num_drafts},
                               {"draft_tokens", metrics.spec_num_draft_tokens},
                               {"accepted_tokens", metrics.spec_num_accepted_tokens},
                               {"accepted_per_position", metrics.spec_accepted_per_position},
                               {"rollback_bytes", metrics.spec_rollback_bytes}};
    if (metrics.images_preprocessed > 0)
      timing["vision"] = {{"images", metrics.images_encoded},
                          {"image_tokens", metrics.image_tokens_encoded},
                          {"encode_steps", metrics.image_encode_steps},
                          {"preprocess_s", metrics.image_preprocess_seconds},
                          {"encode_s", metrics.image_encode_seconds}};
    std::fprintf(stderr, "%s\n", timing.dump().c_str());
  }
  return Status::ok_status();
}

Status run_batch(const GenerateArgs& args) {
  BatchGenerateArgs batch{.model = args.model,
                          .engine = args.engine,
                          .prompts_file = args.prompts_file,
                          .dump_logits_dir = args.dump_logits_dir,
                          .defaults = {}};
  batch.defaults.max_tokens = args.max_tokens;
  DZ_ASSIGN_OR_RETURN(batch.defaults.sampling, sampling_params(args));
  return run_prompts_file(batch);
}

}  // namespace

RunCommand add_generate_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "generate",
      "Complete a prompt through the serving engine, streamed to stdout; or every prompt of a "
      "JSONL file at once, one JSON line each");
  auto args = std::make_shared<GenerateArgs>();
  add_model_options(*command, args->model, /*model_has_default=*/true);
  add_parallel_options(*command, args->model.parallel);
  auto* prompt =
      command->add_option("--prompt", args->prompt, "text to complete (no chat template)");
  command->add_option("--image", args->images,
                      "an image file (repeatable; models with a vision tower): each goes where the "
                      "prompt has <|media_pad|>, or before the prompt");
  auto* prompts_file =
      command->add_option("--prompts-file", args->prompts_file,
                          "JSONL, one {\"prompt\": ...} or {\"prompt_token_ids\": [...]} per "
                          "line with optional per-line sampling fields: all run concurrently "
                          "through the engine, one JSON line out per prompt");
  prompt->excludes(prompts_file);
  prompts_file->excludes(prompt);
  command->add_option("--max-tokens", args->max_tokens, "most tokens to generate")
      ->check(integer_at_least(1))
      ->capture_default_str();
  // Each sampling flag left out takes generation_config.json's value, else the default shown.
  auto* temperature =
      command
          ->add_option(
              "--temperature", args->temperature,
              "0: greedy; otherwise softmax(logits / T) (default: generation_config.json's)")
          ->capture_default_str();
  auto* top_p =
      command->add_option("--top-p", args->top_p, "nucleus mass in (0, 1]")->capture_default_str();
  auto* top_k =
      command->add_option("--top-k", args->top_k, "keep the K most likely tokens; <= 0: off")
          ->capture_default_str();
  auto* min_p = command->add_option("--min-p", args->min_p, "keep p >= min_p * p_max; 0: off")
                    ->capture_default_str();
  auto* repetition_penalty =
      command
          ->add_option("--repetition-penalty", args->repetition_penalty,
                       "over prompt + output: logit / r if positive, logit * r if negative; 1: off")
          ->capture_default_str();
  command->add_option("--stop", args->stop, "stop string (repeatable); cut before it");
  command->add_option("--seed", args->seed, "sampler seed")->capture_default_str();
  auto* ignore_eos = command->add_flag(
      "--ignore-eos", args->ignore_eos,
      "keep generating past the checkpoint's eos ids (fixed-length runs for benchmarks)");
  auto* timing = command->add_flag(
      "--timing", args->timing,
      "print one JSON line on stderr: prefill and decode seconds (wall and process CPU), decode "
      "steps and tokens (decode_tokens / decode_s is the decode rate) and the generated token ids");
  ignore_eos->excludes(prompts_file);
  timing->excludes(prompts_file);
  add_engine_options(*command, args->engine);
  command
      ->add_option("--dump-logits", args->dump_logits_dir,
                   "with --prompts-file (testing): DIR/<index>.npy, float32 [generated, vocab], "
                   "the logits of every sampled token")
      ->needs(prompts_file);
  return [args, prompt, prompts_file, temperature, top_p, top_k, min_p, repetition_penalty] {
    args->given = {.temperature = temperature->count() > 0,
                   .top_p = top_p->count() > 0,
                   .top_k = top_k->count() > 0,
                   .min_p = min_p->count() > 0,
                   .repetition_penalty = repetition_penalty->count() > 0};
    if (prompt->count() == 0 && prompts_file->count() == 0)
      return fail(make_error(StatusCode::kInvalidArgument, "give --prompt or --prompts-file"));
    Result<std::string> dir = resolve_model_dir(args->model.model_dir);
    if (!dir.ok()) return fail(dir.status());
    args->model.model_dir = *dir;
    Status status = args->prompts_file.empty() ? run(*args) : run_batch(*args);
    return status.ok() ? 0 : fail(status);
  };
}

}  // namespace dz::cli
