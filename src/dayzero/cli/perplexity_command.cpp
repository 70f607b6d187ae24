// `dayzero perplexity [--model DIR] (--file TEXT | --token-ids-file IDS) [--context N]
// [--max-windows K] [--bos] [--prefill-chunk N] [--json]`: llama-perplexity's measurement. The
// token stream (the text through the model's tokenizer, special-token text kept as plain text and
// no BOS; or ids separated by whitespace and/or commas) is cut into consecutive windows of exactly
// N tokens, a shorter tail dropped (runtime/perplexity.h). Each window is prefilled alone from
// position 0, with [BOS] in front under --bos; the logits at every position but the last score the
// next token of the window. Reports per-window mean NLL and exp(mean NLL over all predictions).

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dayzero/cli/commands.h"
#include "dayzero/cli/default_model.h"
#include "dayzero/cli/engine_args.h"
#include "dayzero/cli/engine_request.h"
#include "dayzero/cli/model_args.h"
#include "dayzero/core/logging.h"
#include "dayzero/runtime/generation_config.h"
#include "dayzero/runtime/perplexity.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::cli {
namespace {

struct PerplexityArgs {
  ModelArgs model;
  std::string text_file;
  std::string ids_file;
  int64_t context = 256;
  int64_t max_windows = 0;  // 0: every full window
  int64_t prefill_chunk = 512;
  bool bos = false;
  bool json = false;
};

Result<std::string> read_whole_file(const std::string& path, const char* flag) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return make_error(StatusCode::kNotFound, "{}: cannot read {}", flag, path);
  std::stringstream text;
  text << file.rdbuf();
  if (text.str().empty())
    return make_error(StatusCode::kInvalidArgument, "{}: {} is empty", flag, path);
  return text.str();
}

// Ids separated by any mix of whitespace and commas; each a non-negative 32-bit integer.
Result<std::vector<int32_t>> parse_id_text(const std::string& text, const std::string& path) {
  std::vector<int32_t> ids;
  auto is_separator = [](char c) {
    return c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
  };
  size_t pos = 0;
  while (pos < text.size()) {
    if (is_separator(text[pos])) {
      ++pos;
      continue;
    }
    size_t end = pos;
    while (end < text.size() && !is_separator(text[end])) ++end;
    const char* first = text.data() + pos;
    const char* last = text.data() + end;
    int32_t value = -1;
    auto [ptr, ec] = std::from_chars(first, last, value);
    if (ec != std::errc() || ptr != last || value < 0)
      return make_error(StatusCode::kInvalidArgument,
                        "--token-ids-file {}: item {} \"{}\" is not a token id (a non-negative "
                        "32-bit integer)",
                        path, ids.size(), std::string(first, std::min<size_t>(end - pos, 40)));
    ids.push_back(value);
    pos = end;
  }
  if (ids.empty())
    return make_error(StatusCode::kInvalidArgument, "--token-ids-file {}: holds no token ids",
                      path);
  return ids;
}

Result<std::vector<int32_t>> load_ids(const PerplexityArgs& args) {
  if (!args.ids_file.empty()) {
    DZ_ASSIGN_OR_RETURN(std::string text, read_whole_file(args.ids_file, "--token-ids-file"));
    return parse_id_text(text, args.ids_file);
  }
  DZ_ASSIGN_OR_RETURN(std::string text, read_whole_file(args.text_file, "--file"));
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<serve::Tokenizer> tokenizer,
                      serve::load_tokenizer(args.model.model_dir));
  Result<std::vector<int32_t>> ids =
      tokenizer->encode(text, serve::EncodeOptions{.allow_special = false});
  if (!ids.ok()) return ids.status().with_context("--file " + args.text_file);
  if (ids->empty())
    return make_error(StatusCode::kInvalidArgument, "--file {}: encodes to no tokens",
                      args.text_file);
  return ids;
}

Status run(const PerplexityArgs& args) {
  if (args.context < 2)
    return make_error(StatusCode::kInvalidArgument, "--context must be >= 2, got {}", args.context);
  DZ_ASSIGN_OR_RETURN(std::vector<int32_t> ids, load_ids(args));
  const std::string source =
      args.ids_file.empty() ? "--file " + args.text_file : "--token-ids-file " + args.ids_file;
  std::vector<int32_t> prefix;  // [BOS] under --bos
  if (args.bos) {
    DZ_ASSIGN_OR_RETURN(runtime::GenerationDefaults defaults,
                        runtime::load_generation_defaults(args.model.model_dir));
    if (!defaults.bos_token_id)
      return make_error(StatusCode::kInvalidArgument,
                        "--bos: the checkpoint names no bos_token_id (config.json, "
                        "generation_config.json)");
    prefix.push_back(*defaults.bos_token_id);
  }
  // The serving default: min(4096, max_position_embeddings).
  DZ_ASSIGN_OR_RETURN(runtime::EngineConfig engine, engine_config(args.model, EngineArgs{}));
  const auto window_len = static_cast<int64_t>(prefix.size()) + args.context;
  if (window_len > engine.max_model_len)
    return make_error(StatusCode::kInvalidArgument,
                      "--context {}{} exceeds the model's max_model_len {} (min(4096, "
                      "max_position_embeddings))",
                      args.context, args.bos ? " + BOS" : "", engine.max_model_len);
  Result<std::vector<runtime::TokenWindow>> split =
      runtime::split_windows(static_cast<int64_t>(ids.size()), args.context, args.max_windows);
  if (!split.ok()) return split.status().with_context(source);
  const std::vector<runtime::TokenWindow>& windows = *split;

  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::CausalLm> model, load_model(args.model));
  if (model == nullptr) return Status::ok_status();  // a rank that followed rank 0's steps
  const int64_t vocab = model->vocab_size();
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] >= vocab)
      return make_error(StatusCode::kInvalidArgument,
                        "{}: token id {} (index {}) is outside the vocabulary [0, {})", source,
                        ids[i], i, vocab);
  for (int32_t id : prefix)
    if (id >= vocab)
      return make_error(StatusCode::kInvalidArgument,
                        "--bos: bos_token_id {} is outside the vocabulary [0, {})", id, vocab);
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<runtime::EngineCore> scorer,
                      make_scoring_engine(*model, args.model, window_len, args.prefill_chunk));

  runtime::PerplexitySummary summary;
  std::vector<double> window_nll;  // mean NLL of each window
  const auto start = std::chrono::steady_clock::now();
  for (const runtime::TokenWindow& window : windows) {
    // One request per window, prefilled from position 0: the logits of every position but the
    // last come back chunk by chunk, row t predicting token t + 1 (the one sample is ignored).
    runtime::GenerationRequest request;
    request.prompt_token_ids = prefix;
    request.prompt_token_ids.insert(request.prompt_token_ids.end(), ids.begin() + window.begin,
                                    ids.begin() + window.begin + window.num_tokens);
    request.max_tokens = 1;
    request.return_prompt_logits = true;
    const std::vector<int32_t> window_ids = request.prompt_token_ids;
    double nll = 0;
    int64_t num_scored = 0;
    DZ_RETURN_IF_ERROR(run_request(*scorer, std::move(request), [&](runtime::RequestOutput& out) {
      const auto num_rows = static_cast<int64_t>(out.new_prompt_logits.size()) / vocab;
      if (num_rows == 0) return Status::ok_status();
      nll += runtime::sum_nll(
          out.new_prompt_logits, vocab,
          std::span<const int32_t>(window_ids)
              .subspan(static_cast<size_t>(num_scored + 1), static_cast<size_t>(num_rows)));
      num_scored += num_rows;
      return Status::ok_status();
    }));
    if (!std::isfinite(nll))
      return make_error(StatusCode::kInternal,
                        "window {} (tokens [{}, {})): the NLL is not finite (non-finite logits)",
                        window_nll.size(), window.begin, window.begin + window.num_tokens);
    const int64_t num_predicted = window_len - 1;
    summary.num_windows += 1;
    summary.num_predicted += num_predicted;
    summary.nll_sum += nll;
    window_nll.push_back(nll / double(num_predicted));
    if (!args.json) {
      fmt::print("window {}/{}: tokens [{}, {}), nll {:.6f}, ppl {:.4f}\n", window_nll.size(),
                 windows.size(), window.begin, window.begin + window.num_tokens, window_nll.back(),
                 std::exp(window_nll.back()));
      std::fflush(stdout);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  spdlog::info("{} windows of {} tokens in {:.3f} s ({:.1f} tokens/s); {} of {} tokens unused",
               summary.num_windows, window_len, seconds,
               double(summary.num_windows * window_len) / std::max(seconds, 1e-9),
               static_cast<int64_t>(ids.size()) - summary.num_windows * args.context, ids.size());
  if (args.json) {
    nlohmann::json out = {
        {"windows", summary.num_windows},     {"predicted_tokens", summary.num_predicted},
        {"nll_sum", summary.nll_sum},         {"mean_nll", summary.mean_nll()},
        {"perplexity", summary.perplexity()}, {"window_nll", window_nll}};
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("windows {}, predicted tokens {}, mean nll {:.6f} nats, perplexity {:.4f}\n",
               summary.num_windows, summary.num_predicted, summary.mean_nll(),
               summary.perplexity());
  }
  return Status::ok_status();
}

}  // namespace

RunCommand add_perplexity_command(CLI::App& app) {
  auto* command = app.add_subcommand(
      "perplexity",
      "Perplexity of a text (or token ids) over consecutive windows of N tokens, each evaluated "
      "from position 0 (llama-perplexity)");
  auto args = std::make_shared<PerplexityArgs>();
  add_model_options(*command, args->model, /*model_has_default=*/true);
  add_parallel_options(*command, args->model.parallel);
  auto* file = command->add_option("--file", args->text_file,
                                   "text file, tokenized with the model's tokenizer (special-token "
                                   "text as plain text, no BOS)");
  auto* ids_file = command->add_option("--token-ids-file", args->ids_file,
                                       "token ids separated by whitespace and/or commas");
  file->excludes(ids_file);
  ids_file->excludes(file);
  command
      ->add_option("--context", args->context,
                   "tokens per window; a shorter tail is dropped (with --bos, BOS comes on top)")
      ->check(integer_at_least(2))
      ->capture_default_str();
  command->add_option("--max-windows", args->max_windows, "evaluate only the first K windows")
      ->check(integer_at_least(1));
  command->add_flag("--bos", args->bos,
                    "put the checkpoint's BOS before every window (it predicts the first token)");
  command
      ->add_option("--prefill-chunk", args->prefill_chunk,
                   "prefill each window in chunks of N tokens (bounds the logits memory)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  command->add_flag("--json", args->json,
                    "print one JSON object: windows, predicted_tokens, nll_sum, mean_nll, "
                    "perplexity, window_nll (mean NLL of each window, nats)");
  return [args, file, ids_file] {
    if (file->count() == 0 && ids_file->count() == 0)
      return fail(make_error(StatusCode::kInvalidArgument, "give --file or --token-ids-file"));
    Result<std::string> dir = resolve_model_dir(args->model.model_dir);
    if (!dir.ok()) return fail(dir.status());
    args->model.model_dir = *dir;
    Status status = run(*args);
    return status.ok() ? 0 : fail(status);
  };
}

}  // namespace dz::cli
