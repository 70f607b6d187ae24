#include "dayzero/serve/http/server_metrics.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace dz::serve::http {
namespace {

constexpr auto kCompletionWindow = std::chrono::seconds(60);

// vLLM's per-phase latencies of a request: waiting, then prefill up to the first token, then
// decode.
constexpr std::pair<const char*, const char*> kPhaseHistograms[] = {
    {"request_queue_time_seconds", "Histogram of time spent in WAITING phase for request."},
    {"request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request."},
    {"request_decode_time_seconds", "Histogram of time spent in DECODE phase for request."},
};

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

}  // namespace

ServerMetrics::ServerMetrics(std::string prefix, std::string model_name, int64_t max_model_len)
    : registry_(std::move(prefix)),
      model_name_(std::move(model_name)),
      token_buckets_(buckets_1_2_5(static_cast<double>(std::max<int64_t>(max_model_len, 1)))),
      start_(Clock::now()) {
  // Create every series up front so a scrape before the first request shows them at 0.
  update_engine({});
  for (const char* reason : {"stop", "length", "abort"})
    registry_.counter("request_success_total", "Count of successfully processed requests.",
                      labels("finished_reason", reason));
  registry_.counter("requests_cancelled_total", "Requests cancelled by a departed client.",
                    labels());
  registry_.counter("requests_rejected_total", "Requests refused before running, by reason.",
                    labels("reason", "queue_full"));
  registry_.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                      ttft_buckets_seconds(), labels());
  registry_.histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                      inter_token_buckets_seconds(), labels());
  registry_.histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                      request_latency_buckets_seconds(), labels());
  for (const auto& [name, help] : kPhaseHistograms)
    registry_.histogram(name, help, request_latency_buckets_seconds(), labels());
  registry_.histogram("request_prompt_tokens", "Number of prefill tokens processed.",
                      token_buckets_, labels());
  registry_.histogram("request_generation_tokens", "Number of generation tokens processed.",
                      token_buckets_, labels());
}

MetricLabels ServerMetrics::labels(std::string_view name, std::string_view value) const {
  MetricLabels result = {{"model_name", model_name_}};
  if (!name.empty()) result.emplace_back(std::string(name), std::string(value));
  return result;
}

void ServerMetrics::update_engine(const runtime::EngineMetrics& m) {
  const MetricLabels l = labels();
  registry_.gauge("num_requests_running", "Number of requests in model execution batches.", l)
      .set(static_cast<double>(m.num_running));
  registry_.gauge("num_requests_waiting", "Number of requests waiting to be processed.", l)
      .set(static_cast<double>(m.num_waiting));
  registry_.gauge("kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", l)
      .set(m.kv_cache_usage);
  registry_.counter("prompt_tokens_total", "Number of prefill tokens processed.", l)
      .advance_to(static_cast<double>(m.prompt_tokens));
  registry_.counter("generation_tokens_total", "Number of generation tokens processed.", l)
      .advance_to(static_cast<double>(m.generation_tokens));
  registry_.counter("num_preemptions_total", "Cumulative number of preemption from the engine.", l)
      .advance_to(static_cast<double>(m.num_preemptions));
  registry_
      .counter("prefix_cache_queries_total",
               "Prefix cache queries, in terms of number of queried tokens.", l)
      .advance_to(static_cast<double>(m.prefix_query_tokens));
  registry_
      .counter("prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
               l)
      .advance_to(static_cast<double>(m.prefix_hit_tokens));
  // Speculative decoding (docs/serving.md §4), vLLM's names.
  if (!m.spec_accepted_per_position.empty()) {  // speculation is on
    registry_.counter("spec_decode_num_drafts_total", "Number of spec decoding drafts.", l)
        .advance_to(static_cast<double>(m.spec_num_drafts));
    registry_.counter("spec_decode_num_draft_tokens_total", "Number of draft tokens.", l)
        .advance_to(static_cast<double>(m.spec_num_draft_tokens));
    registry_.counter("spec_decode_num_accepted_tokens_total", "Number of accepted tokens.", l)
        .advance_to(static_cast<double>(m.spec_num_accepted_tokens));
    for (size_t pos = 0; pos < m.spec_accepted_per_position.size(); ++pos)
      registry_
          .counter("spec_decode_num_accepted_tokens_per_pos_total",
                   "Accepted tokens per draft position.", labels("position", std::to_string(pos)))
          .advance_to(static_cast<double>(m.spec_accepted_per_position[pos]));
  }
  // Supervised serving (docs/serving.md §5.10).
  registry_.counter("worker_restarts_total", "Worker groups restarted after a failure.", l)
      .advance_to(static_cast<double>(m.worker_restarts));
  registry_
      .counter("requests_migrated_total",
               "Unfinished requests re-submitted to a restarted worker group.", l)
      .advance_to(static_cast<double>(m.requests_migrated));
  // Multi-rank traffic (docs/parallel.md §2): rank 0's bytes by layer and collective.
  for (const auto& [key, counts] : m.comm) {
    MetricLabels lk = l;
    lk.emplace_back(
        "layer", key.layer == dist::kStepLayer ? std::string("step") : std::to_string(key.layer));
    lk.emplace_back("op", std::string(dist::comm_op_name(key.op)));
    registry_
        .counter("dist_bytes_received_total",
                 "Bytes rank 0 received from other ranks, by layer (-1: embedding and head; "
                 "step: step descriptions and gathered logits) and collective.",
                 lk)
        .advance_to(static_cast<double>(counts.bytes_received));
    registry_.counter("dist_bytes_sent_total", "Bytes rank 0 sent to other ranks, as received.", lk)
        .advance_to(static_cast<double>(counts.bytes_sent));
    registry_.counter("dist_collectives_total", "Collective calls of rank 0, as received.", lk)
        .advance_to(static_cast<double>(counts.calls));
  }
}

void ServerMetrics::on_output(RequestTimer& timer, const runtime::RequestOutput& output,
                              Clock::time_point now) {
  if (!timer.first_scheduled_ && output.first_scheduled) {
    timer.first_scheduled_ = output.first_scheduled;
    observe_phase(0, timer.arrival_, *output.first_scheduled);
  }
  if (output.new_token_ids.empty()) return;
  const MetricLabels l = labels();
  if (!timer.first_token_seen_) {
    timer.first_token_seen_ = true;
    timer.first_token_ = now;
    if (timer.first_scheduled_) observe_phase(1, *timer.first_scheduled_, now);
    registry_
        .histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                   ttft_buckets_seconds(), l)
        .observe(seconds_between(timer.arrival_, now));
  } else {
    // Several tokens in one output (a stop-string hold-back released) share the interval.
    const double per_token =
        seconds_between(timer.last_token_, now) / static_cast<double>(output.new_token_ids.size());
    Histogram& itl = registry_.histogram("inter_token_latency_seconds",
                                         "Histogram of inter-token latency in seconds.",
                                         inter_token_buckets_seconds(), l);
    for (size_t i = 0; i < output.new_token_ids.size(); ++i) itl.observe(per_token);
  }
  timer.last_token_ = now;
}

void ServerMetrics::on_finished(const RequestTimer& timer, const runtime::RequestOutput& last,
                                std::string_view finished_reason, Clock::time_point now) {
  const MetricLabels l = labels();
  registry_
      .counter("request_success_total", "Count of successfully processed requests.",
               labels("finished_reason", finished_reason))
      .add();
  registry_
      .histogram("e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
                 request_latency_buckets_seconds(), l)
      .observe(seconds_between(timer.arrival_, now));
  if (timer.first_token_seen_) observe_phase(2, timer.first_token_, now);
  registry_
      .histogram("request_prompt_tokens", "Number of prefill tokens processed.", token_buckets_, l)
      .observe(static_cast<double>(last.num_prompt_tokens));
  registry_
      .histogram("request_generation_tokens", "Number of generation tokens processed.",
                 token_buckets_, l)
      .observe(static_cast<double>(last.num_output_tokens));
  if (finished_reason != "abort") note_completion(now);
}

void ServerMetrics::observe_phase(size_t phase, Clock::time_point from, Clock::time_point to) {
  const auto& [name, help] = kPhaseHistograms[phase];
  registry_.histogram(name, help, request_latency_buckets_seconds(), labels())
      .observe(std::max(0.0, seconds_between(from, to)));
}

void ServerMetrics::on_rejected(std::string_view reason) {
  registry_
      .counter("requests_rejected_total", "Requests refused before running, by reason.",
               labels("reason", reason))
      .add();
}

void ServerMetrics::on_cancelled() {
  registry_
      .counter("requests_cancelled_total", "Requests cancelled by a departed client.", labels())
      .add();
}

void ServerMetrics::note_completion(Clock::time_point now) {
  std::lock_guard lock(completions_mutex_);
  recent_completions_.push_back(now);
  while (!recent_completions_.empty() && now - recent_completions_.front() > kCompletionWindow)
    recent_completions_.pop_front();
}

int ServerMetrics::retry_after_seconds(int64_t num_waiting) {
  const Clock::time_point now = Clock::now();
  double window_s = std::min(seconds_between(start_, now),
                             std::chrono::duration<double>(kCompletionWindow).count());
  size_t num_recent = 0;
  {
    std::lock_guard lock(completions_mutex_);
    while (!recent_completions_.empty() && now - recent_completions_.front() > kCompletionWindow)
      recent_completions_.pop_front();
    num_recent = recent_completions_.size();
  }
  if (num_recent == 0 || window_s <= 0) return 60;
  const double per_second = static_cast<double>(num_recent) / window_s;
  const double seconds =
      std::ceil(static_cast<double>(std::max<int64_t>(num_waiting, 1)) / per_second);
  return static_cast<int>(std::clamp(seconds, 1.0, 60.0));
}

}  // namespace dz::serve::http
