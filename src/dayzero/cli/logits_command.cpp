// `dayzero logits --model DIR --token-ids 1,2,3 --output FILE.npy [--prefill-chunk N]
// [--decode-from K] [--kv-cache-dtype fp8|bf16]`: float32 logits of every position, [n_tokens,
// vocab]. Prefill (whole, or in chunks), then decode one token at a time from position K: every
// split runs the same math, so the outputs agree (the test of the cache and the chunked paths).
// One scoring request through the serving engine: the first K tokens its prompt (their logits
// returned), the rest forced as its outputs, one decode step each.

#include <algorithm>
#include <memory>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/engine_request.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/formats/npy.h"

#include <spdlog/spdlog.h>

namespace dz::cli {
namespace {

struct LogitsArgs {
  ModelArgs model;
  std::string token_ids;
  std::string output;
  std::string mtp_output;     // MTP head logits [n_tokens − 1, vocab]
  int64_t prefill_chunk = 0;  // 0: the whole prefill at once
  int64_t decode_from = -1;   // -1: no decode
};

Status run(const LogitsArgs& args) {
  DZ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, parse_token_ids(args.token_ids, "--token-ids"));
  const auto num_tokens = static_cast<int64_t>(ids.size());
  const int64_t decode_from = args.decode_from < 0 ? num_tokens : args.decode_from;
  if (decode_from > num_tokens)
    return make_error(StatusCode::kInvalidArgument,
                      "--decode-from {} exceeds the number of tokens {}", decode_from, num_tokens);
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> model, load_model(args.model));
  if (model == nullptr) return Status::ok_status();  // a rank that followed rank 0's steps
  const int64_t vocab = model->vocab_size();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab)
      return make_error(StatusCode::kInvalidArgument,
                        "--token-ids: id {} (index {}) is outside the vocabulary [0, {})", ids[i],
                        i, vocab);
  const bool with_mtp = !args.mtp_output.empty();
  if (with_mtp && !model->has_mtp())
    return make_error(StatusCode::kUnsupported, "--mtp-output: the model has no MTP head");
  if (with_mtp && num_tokens < 2)
    return make_error(StatusCode::kInvalidArgument, "--mtp-output needs at least 2 token ids");

  // A prompt needs a token: decoding from 0 prefills the first one alone, which is the same
  // one-token step.
  const int64_t num_prompt = std::max<int64_t>(decode_from, 1);
  runtime::GenerationRequest request;
  request.prompt_token_ids.assign(ids.begin(), ids.begin() + num_prompt);
  request.forced_output_token_ids.assign(ids.begin() + num_prompt, ids.end());
  // The forced tokens, then one sample whose logits row is the last position's.
  request.max_tokens = num_tokens - num_prompt + 1;
  request.return_prompt_logits = true;
  request.return_logits = true;
  request.return_mtp_logits = with_mtp;
  const int64_t chunk = args.prefill_chunk > 0 ? args.prefill_chunk : num_prompt;
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<runtime::EngineCore> engine,
                      make_scoring_engine(*model, args.model, num_tokens, chunk));

  std::vector<float> prompt_rows;  // positions [0, num_prompt − 1)
  std::vector<float> output_rows;  // positions [num_prompt − 1, n_tokens) and a sampled token
  // Row t predicts token t + 2 from tokens ≤ t + 1: [n_tokens − 1, vocab].
  std::vector<float> mtp;
  DZ_RETURN_IF_ERROR(run_request(*engine, std::move(request), [&](runtime::RequestOutput& out) {
    prompt_rows.insert(prompt_rows.end(), out.new_prompt_logits.begin(),
                       out.new_prompt_logits.end());
    for (const std::vector<float>& row : out.new_logits)
      output_rows.insert(output_rows.end(), row.begin(), row.end());
    mtp.insert(mtp.end(), out.new_mtp_logits.begin(), out.new_mtp_logits.end());
    return Status::ok_status();
  }));
  std::vector<float> all = std::move(prompt_rows);  // [n_tokens, vocab]
  all.insert(all.end(), output_rows.begin(), output_rows.end());
  const auto want = static_cast<size_t>(num_tokens * vocab);
  const auto want_mtp = static_cast<size_t>(with_mtp ? (num_tokens - 1) * vocab : 0);
  if (all.size() != want || mtp.size() != want_mtp)
    return make_error(StatusCode::kInternal,
                      "the engine returned {} logits rows and {} MTP rows for {} tokens",
                      all.size() / static_cast<size_t>(vocab),
                      mtp.size() / static_cast<size_t>(vocab), num_tokens);
  if (const std::string traffic = traffic_summary(); !traffic.empty()) spdlog::info("{}", traffic);
  DZ_RETURN_IF_ERROR(formats::write_npy_f32(args.output, all, Shape{num_tokens, vocab}));
  if (with_mtp)
    DZ_RETURN_IF_ERROR(formats::write_npy_f32(args.mtp_output, mtp, Shape{num_tokens - 1, vocab}));
  return Status::ok_status();
}

}  // namespace

RunCommand add_logits_command(CLI::App& app) {
  auto* command =
      app.add_subcommand("logits", "Write float32 logits [n_tokens, vocab] of a token sequence");
  auto args = std::make_shared<LogitsArgs>();
  add_model_options(*command, args->model);
  add_parallel_options(*command, args->model.parallel);
  command->add_option("--token-ids", args->token_ids, "comma-separated token ids")->required();
  command->add_option("--output", args->output, "the .npy file to write")->required();
  command->add_option("--mtp-output", args->mtp_output,
                      "also write the MTP head's logits [n_tokens - 1, vocab] (row t predicts "
                      "token t + 2)");
  command
      ->add_option("--prefill-chunk", args->prefill_chunk,
                   "prefill in chunks of N tokens (default: all at once)")
      ->check(integer_at_least(1));
  command
      ->add_option("--decode-from", args->decode_from,
                   "prefill the first K tokens, then decode the rest one at a time")
      ->check(integer_at_least(0));
  return [args] {
    Status status = run(*args);
    return status.ok() ? 0 : fail(status);
  };
}

}  // namespace dz::cli
