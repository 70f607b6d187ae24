// `dayzero logits --model DIR --token-ids 1,2,3 --output FILE.npy [--prefill-chunk N]
// [--decode-from K] [--kv-cache-dtype fp8|bf16]`: float32 logits of every position, [n_tokens,
// vocab]. Prefill (whole, or in chunks), then decode one token at a time from position K: every
// split runs the same math, so the outputs agree (the test of the cache and the chunked paths).

#include <algorithm>
#include <cstring>
#include <memory>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/formats/npy.h"
#include "dayzero/runtime/single_sequence.h"

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
  const int64_t vocab = model->vocab_size();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab)
      return make_error(StatusCode::kInvalidArgument,
                        "--token-ids: id {} (index {}) is outside the vocabulary [0, {})", ids[i],
                        i, vocab);
  const ExecContext ctx = exec_context(args.model);
  DZ_ASSIGN_OR_RETURN(runtime::SingleSequence seq,
                      runtime::SingleSequence::create(*model, num_tokens, args.model.block_size));

  const bool with_mtp = !args.mtp_output.empty();
  if (with_mtp && !model->has_mtp())
    return make_error(StatusCode::kUnsupported, "--mtp-output: the model has no MTP head");
  if (with_mtp && num_tokens < 2)
    return make_error(StatusCode::kInvalidArgument, "--mtp-output needs at least 2 token ids");

  std::vector<float> all(static_cast<size_t>(num_tokens * vocab));  // [n_tokens, vocab]
  // Row t predicts token t + 2 from tokens ≤ t + 1: [n_tokens − 1, vocab].
  std::vector<float> mtp(with_mtp ? static_cast<size_t>((num_tokens - 1) * vocab) : 0);
  std::vector<float> logits;
  auto run_span = [&](int64_t begin, int64_t end) -> Status {
    std::span<const int32_t> span(ids.data() + begin, static_cast<size_t>(end - begin));
    DZ_RETURN_IF_ERROR(seq.extend(ctx, span, /*all_logits=*/true, logits));
    std::copy(logits.begin(), logits.end(), all.begin() + begin * vocab);
    const int64_t mtp_end = std::min(end, num_tokens - 1);  // the last token has no successor
    if (!with_mtp || mtp_end <= begin) return Status::ok_status();
    std::span<const int32_t> next(ids.data() + begin + 1, static_cast<size_t>(mtp_end - begin));
    DZ_RETURN_IF_ERROR(seq.extend_mtp(ctx, next, logits));
    std::copy(logits.begin(), logits.end(), mtp.begin() + begin * vocab);
    return Status::ok_status();
  };
  const int64_t chunk = args.prefill_chunk > 0 ? args.prefill_chunk : decode_from;
  for (int64_t begin = 0; begin < decode_from; begin += chunk)
    DZ_RETURN_IF_ERROR(run_span(begin, std::min(begin + chunk, decode_from)));
  for (int64_t pos = decode_from; pos < num_tokens; ++pos)
    DZ_RETURN_IF_ERROR(run_span(pos, pos + 1));

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
