#include "dayzero/cli/generate_batch.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "dayzero/cli/engine_request.h"
#include "dayzero/cli/prompt_images.h"
#include "dayzero/core/logging.h"
#include "dayzero/formats/npy.h"
#include "dayzero/runtime/engine.h"
#include "dayzero/runtime/generation_config.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::cli {
namespace {

// The request of one line: text tokenized (BOS prepended when the checkpoint asks for it) or the
// given ids as they are.
Result<runtime::GenerationRequest> make_request(const PromptLine& line,
                                                const serve::Tokenizer& tokenizer,
                                                const runtime::GenerationDefaults& defaults,
                                                const model::CausalLm& model, bool return_logits) {
  runtime::GenerationRequest request;
  DZ_ASSIGN_OR_RETURN(const std::vector<runtime::ImageUpload> uploads,
                      load_images(model, line.images));
  if (line.prompt) {
    DZ_ASSIGN_OR_RETURN(const std::string text, text_with_images(*line.prompt, uploads));
    DZ_ASSIGN_OR_RETURN(request.prompt_token_ids, tokenizer.encode(text));
    if (defaults.add_bos_token && defaults.bos_token_id)
      request.prompt_token_ids.insert(request.prompt_token_ids.begin(), *defaults.bos_token_id);
    if (request.prompt_token_ids.empty())
      return make_error(StatusCode::kInvalidArgument, "the prompt encodes to no tokens");
  } else {
    request.prompt_token_ids = line.prompt_token_ids;
  }
  DZ_RETURN_IF_ERROR(place_images(model, uploads, request));
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

std::string json_line(int64_t index, const Completion& c,
                      const std::vector<int32_t>* prompt_token_ids) {
  nlohmann::ordered_json line;
  line["index"] = index;
  if (prompt_token_ids != nullptr) line["prompt_token_ids"] = *prompt_token_ids;
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

Status run_prompts_file(const BatchGenerateArgs& args) {
  DZ_ASSIGN_OR_RETURN(std::vector<PromptLine> lines,
                      load_prompts_file(args.prompts_file, args.defaults));
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<serve::Tokenizer> tokenizer,
                      serve::load_tokenizer(args.model.model_dir));
  DZ_ASSIGN_OR_RETURN(runtime::GenerationDefaults defaults,
                      runtime::load_generation_defaults(args.model.model_dir));
  const bool dump_logits = !args.dump_logits_dir.empty();
  if (dump_logits) {
    std::error_code ec;
    std::filesystem::create_directories(args.dump_logits_dir, ec);
    if (ec)
      return make_error(StatusCode::kIo, "--dump-logits {}: {}", args.dump_logits_dir,
                        ec.message());
  }
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> model, load_model(args.model));
  if (model == nullptr) return Status::ok_status();  // a rank that followed rank 0's steps
  std::vector<runtime::GenerationRequest> requests;
  std::vector<std::vector<int32_t>> prompts;  // as submitted (--dump-logits prints them)
  for (const PromptLine& line : lines) {
    auto request = make_request(line, *tokenizer, defaults, *model, dump_logits);
    if (!request.ok())
      return request.status().with_context(
          fmt::format("{} line {}", args.prompts_file, line.line_number));
    prompts.push_back(request->prompt_token_ids);
    requests.push_back(std::move(*request));
  }
  DZ_ASSIGN_OR_RETURN(runtime::EngineConfig config, engine_config(args.model, args.engine));
  // Every prompt of the file is submitted at once.
  config.max_queued_requests =
      std::max(config.max_queued_requests, static_cast<int64_t>(requests.size()));
  config.eos_token_ids = defaults.eos_token_ids;
  config.token_bytes = token_bytes_of(*tokenizer);
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
    const std::string text =
        json_line(static_cast<int64_t>(i), completion, dump_logits ? &prompts[i] : nullptr);
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
  const std::string speculative =
      config.speculative.enabled()
          ? fmt::format("; speculative: {} drafts, {} draft tokens, {} accepted ({} by position)",
                        metrics.spec_num_drafts, metrics.spec_num_draft_tokens,
                        metrics.spec_num_accepted_tokens,
                        fmt::join(metrics.spec_accepted_per_position, "/"))
          : std::string();
  spdlog::info(
      "{} requests ({} failed): {} prompt tokens, {} generated in {:.3f} s ({:.1f} tokens/s); {} "
      "steps, {} preemptions, prefix cache hit rate {:.1f}%{}",
      streams.size(), num_failed, num_prompt_tokens, num_generated, seconds,
      seconds > 0 ? static_cast<double>(num_generated) / seconds : 0.0, metrics.num_steps,
      metrics.num_preemptions, 100.0 * hit_rate, speculative);
  if (num_failed > 0)
    return make_error(StatusCode::kInternal, "{} of {} requests failed (see their \"error\")",
                      num_failed, streams.size());
  return Status::ok_status();
}

}  // namespace dz::cli
