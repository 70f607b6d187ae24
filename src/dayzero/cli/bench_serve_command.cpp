// `dayzero bench serve --url URL --num-prompts N --concurrency C [--input-len L --output-len O]`:
// load an OpenAI-compatible server with streamed requests and report TTFT, TPOT, ITL, E2EL and
// throughput as `vllm bench serve` defines them (docs/serving.md §6; serve/bench_client/).

#include "dayzero/cli/bench_serve_command.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dayzero/serve/bench_client/bench_dataset.h"
#include "dayzero/serve/bench_client/bench_report.h"
#include "dayzero/serve/bench_client/bench_stats.h"
#include "dayzero/serve/bench_client/load_runner.h"
#include "dayzero/serve/bench_client/prometheus_text.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::cli {
namespace {

struct BenchServeArgs {
  std::string url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model_dir;      // --model: a checkpoint folder, for its tokenizer
  std::string tokenizer_dir;  // --tokenizer: overrides --model's
  std::string served_model_name;
  std::string api_key;
  serve::DatasetOptions dataset{.name = "random",
                                .num_prompts = 1000,
                                .input_len = 1024,
                                .output_len = 128,
                                .range_ratio = 0.0,
                                .prefix_len = 256,
                                .num_prefixes = 10,
                                .seed = 0};
  int32_t vocab_size = 0;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int64_t max_concurrency = 0;
  bool ignore_eos = false;
  double timeout_s = 600;
  std::string save_result;
  std::vector<std::string> goodput;
  std::string percentiles = "50,90,99";
};

Result<serve::GoodputSlo> parse_goodput(const std::vector<std::string>& pairs) {
  serve::GoodputSlo slo;
  for (const std::string& pair : pairs) {
    size_t colon = pair.find(':');
    char* end = nullptr;
    double ms = colon == std::string::npos ? 0.0 : std::strtod(pair.c_str() + colon + 1, &end);
    if (colon == std::string::npos || end != pair.c_str() + pair.size() || colon + 1 == pair.size())
      return make_error(StatusCode::kInvalidArgument,
                        "--goodput takes KEY:MS pairs (ttft, tpot, e2el), not '{}'", pair);
    if (!(ms >= 0))
      return make_error(StatusCode::kInvalidArgument, "--goodput {}: the SLO must be >= 0", pair);
    std::string key = pair.substr(0, colon);
    if (key == "ttft") {
      slo.ttft_ms = ms;
    } else if (key == "tpot") {
      slo.tpot_ms = ms;
    } else if (key == "e2el") {
      slo.e2el_ms = ms;
    } else {
      return make_error(StatusCode::kInvalidArgument,
                        "--goodput: unknown metric '{}' (ttft, tpot or e2el)", key);
    }
  }
  return slo;
}

Result<std::vector<double>> parse_percentiles(const std::string& list) {
  std::vector<double> out;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t comma = std::min(list.find(',', begin), list.size());
    std::string item = list.substr(begin, comma - begin);
    char* end = nullptr;
    double p = std::strtod(item.c_str(), &end);
    if (item.empty() || end != item.c_str() + item.size() || !(p >= 0 && p <= 100))
      return make_error(StatusCode::kInvalidArgument,
                        "--metric-percentiles: '{}' is not a number in [0, 100]", item);
    out.push_back(p);
    begin = comma + 1;
  }
  return out;
}

Result<double> parse_rate(const std::string& text) {
  if (text == "inf") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  double rate = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !(rate > 0))
    return make_error(StatusCode::kInvalidArgument,
                      "--request-rate must be a positive number or inf, not '{}'", text);
  return rate;
}

Status run(const BenchServeArgs& args) {
  DZ_ASSIGN_OR_RETURN(double rate, parse_rate(args.request_rate));
  DZ_ASSIGN_OR_RETURN(serve::GoodputSlo slo, parse_goodput(args.goodput));
  DZ_ASSIGN_OR_RETURN(std::vector<double> percentiles, parse_percentiles(args.percentiles));
  if (!(args.burstiness > 0))
    return make_error(StatusCode::kInvalidArgument, "--burstiness must be positive");

  serve::LoadOptions load;
  load.url = args.url;
  load.endpoint = args.endpoint;
  load.kind = args.endpoint.find("chat/completions") != std::string::npos
                  ? serve::ApiKind::kChatCompletions
                  : serve::ApiKind::kCompletions;
  load.api_key = args.api_key;
  if (load.api_key.empty())
    if (const char* env = std::getenv("OPENAI_API_KEY")) load.api_key = env;
  load.request_rate = rate;
  load.burstiness = args.burstiness;
  load.max_concurrency = args.max_concurrency;
  load.ignore_eos = args.ignore_eos;
  load.timeout_s = args.timeout_s;
  load.seed = args.dataset.seed;

  std::unique_ptr<serve::Tokenizer> tokenizer;
  std::string tokenizer_dir = args.tokenizer_dir.empty() ? args.model_dir : args.tokenizer_dir;
  if (!tokenizer_dir.empty()) {
    DZ_ASSIGN_OR_RETURN(tokenizer, serve::load_tokenizer(tokenizer_dir));
  }
  if (load.kind == serve::ApiKind::kChatCompletions && tokenizer == nullptr)
    return make_error(StatusCode::kInvalidArgument,
                      "--endpoint {} sends text: give --model DIR or --tokenizer DIR",
                      args.endpoint);
  int32_t vocab_size = args.vocab_size > 0    ? args.vocab_size
                       : tokenizer != nullptr ? tokenizer->vocab_size()
                                              : 0;
  if (vocab_size <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "random prompts need a vocabulary: give --model DIR or --tokenizer DIR "
                      "(its tokenizer), or --vocab-size N");
  DZ_ASSIGN_OR_RETURN(
      std::vector<serve::BenchRequest> requests,
      serve::make_dataset(args.dataset, serve::prompt_token_ids(vocab_size, tokenizer.get())));
  if (load.kind == serve::ApiKind::kChatCompletions) serve::decode_prompts(requests, *tokenizer);

  load.model = args.served_model_name;
  if (load.model.empty()) {
    DZ_ASSIGN_OR_RETURN(load.model, serve::first_model_id(args.url, load.api_key));
  }

  std::printf("Traffic request rate: %s\n", args.request_rate.c_str());
  std::printf("Burstiness factor: %g (%s)\n", args.burstiness,
              args.burstiness == 1.0 ? "Poisson process" : "Gamma distribution");
  std::printf("Maximum request concurrency: %s\n",
              args.max_concurrency > 0 ? std::to_string(args.max_concurrency).c_str() : "None");
  std::fflush(stdout);

  Result<std::string> before = serve::http_get(args.url, "/metrics", load.api_key, 30.0);
  serve::LoadRun run = serve::run_load(load, requests);
  Result<std::string> after = serve::http_get(args.url, "/metrics", load.api_key, 30.0);
  bool metrics_available = before.ok() && after.ok();
  std::map<std::string, double> deltas;
  if (metrics_available)
    deltas = serve::counter_deltas(serve::parse_prometheus_sums(*before),
                                   serve::parse_prometheus_sums(*after));

  // Re-tokenize after the run, so the count costs no client CPU while requests are timed.
  if (tokenizer != nullptr) {
    for (serve::RequestResult& r : run.results) {
      if (!r.success) continue;
      Result<std::vector<int32_t>> ids = tokenizer->encode(r.generated_text);
      if (ids.ok()) r.retokenized_tokens = static_cast<int64_t>(ids->size());
    }
  }

  serve::BenchMetrics metrics =
      serve::compute_metrics(run.results, run.duration_s, slo, percentiles);
  serve::RunDescription description{
      .backend = load.kind == serve::ApiKind::kChatCompletions ? "openai-chat" : "openai",
      .model_id = load.model,
      .tokenizer_id = tokenizer_dir,
      .dataset_name = args.dataset.name,
      .num_prompts = args.dataset.num_prompts,
      .request_rate = rate,
      .burstiness = args.burstiness,
      .max_concurrency = args.max_concurrency,
      .has_tokenizer = tokenizer != nullptr,
      .goodput = slo.any() ? std::optional<serve::GoodputSlo>(slo) : std::nullopt};
  std::string report = serve::format_report(description, metrics, run.results, run.duration_s,
                                            deltas, metrics_available);
  std::fputs(report.c_str(), stdout);
  if (!args.save_result.empty()) {
    nlohmann::json result =
        serve::result_json(description, metrics, run.results, run.duration_s, deltas);
    std::ofstream file(args.save_result);
    file << result.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    if (!file)
      return make_error(StatusCode::kIo, "cannot write --save-result {}", args.save_result);
  }
  if (metrics.completed == 0)
    return make_error(StatusCode::kInternal, "every request failed (first error: {})",
                      run.results.empty() ? std::string() : run.results.front().error);
  return Status::ok_status();
}

}  // namespace

RunCommand add_bench_serve_subcommand(CLI::App& bench) {
  auto* c = bench.add_subcommand(
      "serve",
      "Load an OpenAI-compatible server with streamed requests; report TTFT, TPOT, ITL, "
      "E2EL and throughput as `vllm bench serve`");
  auto args = std::make_shared<BenchServeArgs>();
  c->add_option("--url", args->url, "Server base URL (scheme, host, port)")->capture_default_str();
  c->add_option("--endpoint", args->endpoint, "/v1/completions or /v1/chat/completions")
      ->check(CLI::IsMember({"/v1/completions", "/v1/chat/completions"}))
      ->capture_default_str();
  c->add_option("--model", args->model_dir,
                "Checkpoint folder: its tokenizer draws prompts and "
                "re-counts output tokens");
  c->add_option("--tokenizer", args->tokenizer_dir, "Tokenizer folder (overrides --model's)");
  c->add_option("--served-model-name", args->served_model_name,
                "The requests' model field (default: the first of GET /v1/models)");
  c->add_option("--api-key", args->api_key, "Bearer key (default: $OPENAI_API_KEY)");
  c->add_option("--dataset-name", args->dataset.name, "random or prefix-repetition")
      ->check(CLI::IsMember({"random", "prefix-repetition"}))
      ->capture_default_str();
  c->add_option("--num-prompts", args->dataset.num_prompts, "Requests to send")
      ->check(CLI::Range(int64_t{1}, int64_t{1'000'000}))
      ->capture_default_str();
  c->add_option("--input-len", args->dataset.input_len,
                "Prompt tokens (prefix-repetition: suffix tokens after the shared prefix)")
      ->capture_default_str();
  c->add_option("--output-len", args->dataset.output_len, "max_tokens of each request")
      ->capture_default_str();
  c->add_option("--range-ratio", args->dataset.range_ratio,
                "random: lengths drawn from [L(1-r), L(1+r)]")
      ->capture_default_str();
  c->add_option("--prefix-len", args->dataset.prefix_len, "prefix-repetition: shared prefix tokens")
      ->capture_default_str();
  c->add_option("--num-prefixes", args->dataset.num_prefixes,
                "prefix-repetition: distinct prefixes")
      ->capture_default_str();
  c->add_option("--vocab-size", args->vocab_size,
                "Draw prompt ids from [0, N) when no tokenizer is given");
  c->add_option("--seed", args->dataset.seed, "Seed of prompts and arrival times")
      ->capture_default_str();
  c->add_option("--request-rate", args->request_rate,
                "Requests per second (Poisson arrivals), or inf: all at once")
      ->capture_default_str();
  c->add_option("--burstiness", args->burstiness, "Gamma shape of arrival gaps (1: Poisson)")
      ->capture_default_str();
  c->add_option("--max-concurrency,--concurrency", args->max_concurrency,
                "Requests in flight at most (default: unbounded)")
      ->check(CLI::Range(int64_t{1}, serve::kMaxClientThreads));
  c->add_flag("--ignore-eos", args->ignore_eos, "Ask the server to ignore EOS (fixed lengths)");
  c->add_option("--timeout", args->timeout_s, "Seconds one request may take")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  c->add_option("--save-result", args->save_result, "Write vLLM's result JSON to FILE");
  c->add_option("--goodput", args->goodput, "SLOs as KEY:MS (ttft, tpot, e2el)");
  c->add_option("--metric-percentiles", args->percentiles, "Percentiles to report")
      ->capture_default_str();
  return [args] {
    Status status = run(*args);
    if (!status.ok()) {
      std::fprintf(stderr, "error: %s\n", status.to_string().c_str());
      return 1;
    }
    return 0;
  };
}

}  // namespace dz::cli
