#include "dayzero/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "dayzero/core/check.h"
#include "dayzero/runtime/philox.h"

namespace dz::runtime {
namespace {

// The largest value, ties to the lower id; -inf entries lose to any finite one.
int32_t argmax(std::span<const float> values) {
  size_t best = 0;
  for (size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[best]) best = i;
  return static_cast<int32_t>(best);
}

bool in_range(float value, float lo, float hi) {
  return value >= lo && value <= hi;
}

Status check_token_id(const char* field, int32_t id, int64_t vocab_size) {
  if (id < 0 || (vocab_size > 0 && id >= vocab_size))
    return make_error(StatusCode::kInvalidArgument,
                      "{}: token id {} is outside the vocabulary [0, {})", field, id,
                      vocab_size > 0 ? std::to_string(vocab_size) : "vocab_size");
  return Status::ok_status();
}

}  // namespace

Status validate_sampling_params(const SamplingParams& params, int64_t vocab_size) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f)
    return make_error(StatusCode::kInvalidArgument,
                      "temperature must be a finite number >= 0, got {}", params.temperature);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    return make_error(StatusCode::kInvalidArgument, "top_p must be in (0, 1], got {}",
                      params.top_p);
  if (params.top_k < -1)
    return make_error(StatusCode::kInvalidArgument,
                      "top_k must be -1 or 0 (off) or a positive count, got {}", params.top_k);
  if (!in_range(params.min_p, 0.0f, 1.0f))
    return make_error(StatusCode::kInvalidArgument, "min_p must be in [0, 1], got {}",
                      params.min_p);
  if (!std::isfinite(params.repetition_penalty) || params.repetition_penalty <= 0.0f)
    return make_error(StatusCode::kInvalidArgument,
                      "repetition_penalty must be a finite number > 0, got {}",
                      params.repetition_penalty);
  if (!in_range(params.presence_penalty, -2.0f, 2.0f))
    return make_error(StatusCode::kInvalidArgument, "presence_penalty must be in [-2, 2], got {}",
                      params.presence_penalty);
  if (!in_range(params.frequency_penalty, -2.0f, 2.0f))
    return make_error(StatusCode::kInvalidArgument, "frequency_penalty must be in [-2, 2], got {}",
                      params.frequency_penalty);
  for (const auto& [id, bias] : params.logit_bias) {
    DZ_RETURN_IF_ERROR(check_token_id("logit_bias", id, vocab_size));
    if (!in_range(bias, -kMaxLogitBias, kMaxLogitBias))
      return make_error(StatusCode::kInvalidArgument,
                        "logit_bias of token {} must be in [-100, 100], got {}", id, bias);
  }
  if (params.min_tokens < 0)
    return make_error(StatusCode::kInvalidArgument, "min_tokens must be >= 0, got {}",
                      params.min_tokens);
  for (int32_t id : params.stop_token_ids)
    DZ_RETURN_IF_ERROR(check_token_id("stop_token_ids", id, vocab_size));
  if (params.top_logprobs < 0 || params.top_logprobs > kMaxTopLogprobs)
    return make_error(StatusCode::kInvalidArgument, "top_logprobs must be in [0, {}], got {}",
                      kMaxTopLogprobs, params.top_logprobs);
  for (const std::string& s : params.stop)
    if (s.empty())
      return make_error(StatusCode::kInvalidArgument, "stop: stop strings must not be empty");
  return Status::ok_status();
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> eos_token_ids,
                 uint32_t choice_index)
    : params_(params), stop_ids_(params.stop_token_ids), choice_index_(choice_index) {
  DZ_CHECK(validate_sampling_params(params).ok(), "invalid sampling parameters");
  if (!params.ignore_eos)
    stop_ids_.insert(stop_ids_.end(), eos_token_ids.begin(), eos_token_ids.end());
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
}

bool Sampler::is_stop_token(int32_t token) const {
  return std::binary_search(stop_ids_.begin(), stop_ids_.end(), token);
}

std::span<const float> Sampler::process(std::span<const float> logits, int64_t position,
                                        std::span<const int32_t> prompt_ids,
                                        std::span<const int32_t> output_ids) {
  DZ_CHECK(!logits.empty(), "no logits to sample from");
  DZ_CHECK(position >= 0, "negative output position {}", position);
  const auto n = static_cast<int64_t>(logits.size());
  logits_.assign(logits.begin(), logits.end());
  for (const auto& [id, bias] : params_.logit_bias) {
    DZ_CHECK(id < n, "logit_bias id {} outside the vocabulary [0, {})", id, n);
    logits_[static_cast<size_t>(id)] += bias;
  }
  if (position < params_.min_tokens)
    for (int32_t id : stop_ids_)
      if (id < n) logits_[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
  apply_penalties(prompt_ids, output_ids);
  return logits_;
}

SampleResult Sampler::sample(std::span<const float> logits, int64_t position,
                             std::span<const int32_t> prompt_ids,
                             std::span<const int32_t> output_ids) {
  process(logits, position, prompt_ids, output_ids);
  const auto n = static_cast<int64_t>(logits.size());
  SampleResult result;
  result.token = params_.temperature < kGreedyTemperature ? argmax(logits_) : draw(position);

  if (params_.logprobs || params_.top_logprobs > 0) {
    // Raw model distribution (vLLM's default logprobs mode), in FP64.
    const double max_logit = logits[static_cast<size_t>(argmax(logits))];
    DZ_CHECK(std::isfinite(max_logit), "no finite logit");
    double sum = 0;
    for (float l : logits) sum += std::exp(static_cast<double>(l) - max_logit);
    const double log_norm = max_logit + std::log(sum);
    auto logprob = [&](int32_t id) {
      return static_cast<float>(static_cast<double>(logits[static_cast<size_t>(id)]) - log_norm);
    };
    result.logprob = logprob(result.token);
    const auto k = std::min<int64_t>(params_.top_logprobs, n);
    order_.resize(logits.size());
    std::iota(order_.begin(), order_.end(), 0);
    std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), [&](int32_t a, int32_t b) {
      const float la = logits[static_cast<size_t>(a)], lb = logits[static_cast<size_t>(b)];
      return la > lb || (la == lb && a < b);
    });
    for (int64_t i = 0; i < k; ++i)
      result.top_logprobs.push_back(
          {order_[static_cast<size_t>(i)], logprob(order_[static_cast<size_t>(i)])});
  }
  return result;
}

void Sampler::apply_penalties(std::span<const int32_t> prompt_ids,
                              std::span<const int32_t> output_ids) {
  const auto n = static_cast<int64_t>(logits_.size());
  counts_.resize(logits_.size(), 0);  // all zero between calls
  auto check = [n](int32_t id) {
    DZ_CHECK(id >= 0 && id < n, "history token {} outside the vocabulary [0, {})", id, n);
    return static_cast<size_t>(id);
  };
  const float r = params_.repetition_penalty;
  if (r != 1.0f) {
    // CTRL/HF: once per distinct token of prompt + output, shrinking positive logits and
    // growing negative ones, so the token always becomes less likely.
    auto penalise = [&](int32_t id) {
      const size_t i = check(id);
      if (counts_[i] != 0) return;
      counts_[i] = 1;
      logits_[i] = logits_[i] > 0.0f ? logits_[i] / r : logits_[i] * r;
    };
    for (int32_t id : prompt_ids) penalise(id);
    for (int32_t id : output_ids) penalise(id);
    for (int32_t id : prompt_ids) counts_[static_cast<size_t>(id)] = 0;
    for (int32_t id : output_ids) counts_[static_cast<size_t>(id)] = 0;
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (int32_t id : output_ids) ++counts_[check(id)];
    for (int32_t id : output_ids) {
      const auto i = static_cast<size_t>(id);
      if (counts_[i] == 0) continue;  // already applied
      logits_[i] -=
          params_.presence_penalty + params_.frequency_penalty * static_cast<float>(counts_[i]);
      counts_[i] = 0;
    }
  }
}

int32_t Sampler::draw(int64_t position) {
  const size_t n = logits_.size();
  const double inv_temperature = 1.0 / static_cast<double>(params_.temperature);
  const double max_scaled = logits_[static_cast<size_t>(argmax(logits_))] * inv_temperature;
  DZ_CHECK(std::isfinite(max_scaled), "every token is masked");
  probs_.resize(n);
  kept_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    probs_[i] = std::exp(static_cast<double>(logits_[i]) * inv_temperature - max_scaled);
    kept_[i] = probs_[i] > 0.0 ? 1 : 0;
  }
  // Most probable first, ties to the lower id; the logits order equals the probability order.
  auto before = [&](int32_t a, int32_t b) {
    const float la = logits_[static_cast<size_t>(a)], lb = logits_[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  // order_[0, num_candidates) holds the tokens top-k left; they are sorted only as far as needed.
  const bool top_k_on = params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n;
  const size_t num_candidates = top_k_on ? static_cast<size_t>(params_.top_k) : n;
  auto sort_prefix = [&](size_t count) {
    std::partial_sort(order_.begin(), order_.begin() + static_cast<std::ptrdiff_t>(count),
                      order_.end(), before);
  };
  if (top_k_on || params_.top_p < 1.0f) {
    order_.resize(n);
    std::iota(order_.begin(), order_.end(), 0);
  }
  if (top_k_on) {
    sort_prefix(num_candidates);
    for (size_t i = num_candidates; i < n; ++i) kept_[static_cast<size_t>(order_[i])] = 0;
  }
  if (params_.top_p < 1.0f) {
    // Nucleus of what top-k left: the shortest prefix whose mass reaches top_p of it. The
    // sorted prefix grows geometrically, since a nucleus is usually far smaller than the vocab.
    double total = 0;
    for (size_t i = 0; i < num_candidates; ++i) total += probs_[static_cast<size_t>(order_[i])];
    const double target = static_cast<double>(params_.top_p) * total;
    size_t num_sorted = top_k_on ? num_candidates : std::min<size_t>(n, 256);
    if (!top_k_on) sort_prefix(num_sorted);
    double mass = 0;
    size_t num_kept = 0;
    while (true) {
      while (num_kept < num_sorted && (num_kept == 0 || mass < target))
        mass += probs_[static_cast<size_t>(order_[num_kept++])];
      if (mass >= target || num_sorted == num_candidates) break;
      num_sorted = std::min(num_candidates, 4 * num_sorted);
      sort_prefix(num_sorted);  // keeps order_[0, num_kept): they lead under the same order
    }
    for (size_t i = num_kept; i < num_candidates; ++i) kept_[static_cast<size_t>(order_[i])] = 0;
  }
  if (params_.min_p > 0.0f) {
    // The most probable token (p = 1 before normalising) survives top-k and top-p, so the
    // threshold relative to it needs no renormalisation, and it is itself always kept.
    const double threshold = static_cast<double>(params_.min_p);
    for (size_t i = 0; i < n; ++i)
      if (probs_[i] < threshold) kept_[i] = 0;
  }
  // Inverse CDF in token-id order over the kept tokens.
  double total = 0;
  for (size_t i = 0; i < n; ++i)
    if (kept_[i]) total += probs_[i];
  const double target =
      philox_uniform(params_.seed, choice_index_, position, RandomPurpose::kSampleToken) * total;
  double cumulative = 0;
  size_t last = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!kept_[i]) continue;
    cumulative += probs_[i];
    last = i;
    if (target < cumulative) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(last);  // target within rounding of the total
}

}  // namespace dz::runtime
