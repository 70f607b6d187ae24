// `dayzero generate [--model DIR] --prompt TEXT [--max-tokens N] [--temperature T] [--top-p P]
// [--top-k K] [--min-p P] [--repetition-penalty R] [--stop S]... [--seed S] [--ignore-eos]
// [--timing]`: one completion, streamed to stdout as tokens arrive (incomplete UTF-8 characters
// and text that may start a stop string held back), ending at an eos id of the checkpoint (unless
// --ignore-eos), a stop string or after N tokens. --timing prints one JSON line on stderr with the
// prefill and decode times (wall and process CPU) for benchmarks (bench/peer_demo.py).
// With --prompts-file FILE.jsonl instead of --prompt, every prompt of the file runs concurrently
// through the serving engine (generate_batch.h), one JSON line per prompt.

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
#include "dayzero/cli/generate_batch.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/core/logging.h"
#include "dayzero/runtime/generation_config.h"
#include "dayzero/runtime/sampler.h"
#include "dayzero/runtime/single_sequence.h"
#include "dayzero/runtime/stop_strings.h"
#include "dayzero/runtime/utf8_stream.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::cli {
namespace {

struct GenerateArgs {
  ModelArgs model;
  std::string prompt;
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
};

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
  runtime::SamplingParams sampling{.temperature = args.temperature,
                                   .top_p = args.top_p,
                                   .top_k = args.top_k,
                                   .min_p = args.min_p,
                                   .repetition_penalty = args.repetition_penalty,
                                   .seed = args.seed,
                                   .stop = args.stop};
  sampling.ignore_eos = args.ignore_eos;
  DZ_RETURN_IF_ERROR(runtime::validate_sampling_params(sampling));
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<serve::Tokenizer> tokenizer,
                      serve::load_tokenizer(args.model.model_dir));
  DZ_ASSIGN_OR_RETURN(runtime::GenerationDefaults defaults,
                      runtime::load_generation_defaults(args.model.model_dir));
  DZ_ASSIGN_OR_RETURN(std::vector<int32_t> prompt_ids, tokenizer->encode(args.prompt));
  if (defaults.add_bos_token && defaults.bos_token_id)
    prompt_ids.insert(prompt_ids.begin(), *defaults.bos_token_id);
  if (prompt_ids.empty())
    return make_error(StatusCode::kInvalidArgument, "--prompt: the prompt encodes to no tokens");

  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> model, load_model(args.model));
  for (int32_t id : prompt_ids)
    if (id >= model->vocab_size())
      return make_error(StatusCode::kInvalidArgument,
                        "the tokenizer produced id {}, outside the model's vocabulary [0, {})", id,
                        model->vocab_size());
  const ExecContext ctx = exec_context(args.model);
  const auto num_prompt = static_cast<int64_t>(prompt_ids.size());
  DZ_ASSIGN_OR_RETURN(
      runtime::SingleSequence seq,
      runtime::SingleSequence::create(*model, num_prompt + args.max_tokens, args.model.block_size));
  runtime::Sampler sampler(sampling, defaults.eos_token_ids);
  runtime::Utf8Stream text;
  runtime::StopMatcher stop(sampling.stop, sampling.include_stop_str_in_output);
  std::vector<int32_t> output_ids;
  std::vector<float> logits;

  auto start = std::chrono::steady_clock::now();
  const double start_cpu = process_cpu_seconds();
  DZ_RETURN_IF_ERROR(seq.extend(ctx, prompt_ids, /*all_logits=*/false, logits));
  auto prefill_end = std::chrono::steady_clock::now();
  const double prefill_cpu = process_cpu_seconds() - start_cpu;
  // Decode steps alone (each one-token extend), without sampling and output; the first one apart
  // (it builds the one-token oneDNN primitives).
  double decode_seconds = 0.0;
  double decode_cpu = 0.0;
  double first_step_seconds = 0.0;
  double first_step_cpu = 0.0;
  int64_t num_decode_steps = 0;
  int64_t num_generated = 0;
  while (num_generated < args.max_tokens) {
    const int32_t token = sampler.sample(logits, num_generated, prompt_ids, output_ids).token;
    ++num_generated;
    if (sampler.is_stop_token(token)) break;
    output_ids.push_back(token);
    write_out(stop.push(text.push(tokenizer->token_bytes(token).value_or(""))));
    if (stop.stopped() || num_generated == args.max_tokens) break;
    const auto step_start = std::chrono::steady_clock::now();
    const double step_cpu = process_cpu_seconds();
    DZ_RETURN_IF_ERROR(seq.extend(ctx, std::span<const int32_t>(&token, 1), false, logits));
    const double cpu = process_cpu_seconds() - step_cpu;
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    if (num_decode_steps == 0) {
      first_step_seconds = wall;
      first_step_cpu = cpu;
    }
    decode_cpu += cpu;
    decode_seconds += wall;
    ++num_decode_steps;
  }
  if (!stop.stopped()) write_out(stop.push(text.finish()) + stop.finish());
  write_out("\n");
  auto end = std::chrono::steady_clock::now();
  auto seconds = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
  spdlog::info("prompt {} tokens in {:.3f} s; {} generated in {:.3f} s", num_prompt,
               seconds(start, prefill_end), num_generated, seconds(prefill_end, end));
  if (args.timing) {
    const nlohmann::json timing = {{"prompt_tokens", num_prompt},
                                   {"threads", ctx.num_threads},
                                   {"prefill_s", seconds(start, prefill_end)},
                                   {"prefill_cpu_s", prefill_cpu},
                                   {"generated", num_generated},
                                   {"decode_steps", num_decode_steps},
                                   {"decode_s", decode_seconds},
                                   {"decode_cpu_s", decode_cpu},
                                   {"decode_first_step_s", first_step_seconds},
                                   {"decode_first_step_cpu_s", first_step_cpu},
                                   {"tokens", output_ids}};
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
  batch.defaults.sampling = runtime::SamplingParams{.temperature = args.temperature,
                                                    .top_p = args.top_p,
                                                    .top_k = args.top_k,
                                                    .min_p = args.min_p,
                                                    .repetition_penalty = args.repetition_penalty,
                                                    .seed = args.seed,
                                                    .stop = args.stop};
  DZ_RETURN_IF_ERROR(runtime::validate_sampling_params(batch.defaults.sampling));
  return run_prompts_file(batch);
}

}  // namespace

RunCommand add_generate_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "generate",
      "Complete a prompt, streamed to stdout; or every prompt of a JSONL file at once through "
      "the serving engine (the engine flags apply to --prompts-file only)");
  auto args = std::make_shared<GenerateArgs>();
  add_model_options(*command, args->model, /*model_has_default=*/true);
  auto* prompt =
      command->add_option("--prompt", args->prompt, "text to complete (no chat template)");
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
  command
      ->add_option("--temperature", args->temperature, "0: greedy; otherwise softmax(logits / T)")
      ->capture_default_str();
  command->add_option("--top-p", args->top_p, "nucleus mass in (0, 1]")->capture_default_str();
  command->add_option("--top-k", args->top_k, "keep the K most likely tokens; <= 0: off")
      ->capture_default_str();
  command->add_option("--min-p", args->min_p, "keep p >= min_p * p_max; 0: off")
      ->capture_default_str();
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
      "steps and the generated token ids");
  ignore_eos->excludes(prompts_file);
  timing->excludes(prompts_file);
  add_engine_options(*command, args->engine);
  command
      ->add_option("--dump-logits", args->dump_logits_dir,
                   "with --prompts-file (testing): DIR/<index>.npy, float32 [generated, vocab], "
                   "the logits of every sampled token")
      ->needs(prompts_file);
  return [args, prompt, prompts_file] {
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
