#include "dayzero/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dayzero/core/check.h"

namespace dz::runtime {
namespace {

int32_t argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

Status validate_sampling_params(const SamplingParams& params) {
  if (!std::isfinite(params.temperature) || params.temperature < 0.0f)
    return make_error(StatusCode::kInvalidArgument,
                      "temperature must be a finite number >= 0, got {}", params.temperature);
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
    return make_error(StatusCode::kInvalidArgument, "top_p must be in (0, 1], got {}",
                      params.top_p);
  return Status::ok_status();
}

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {
  DZ_CHECK(validate_sampling_params(params).ok(), "invalid sampling parameters");
}

int32_t Sampler::sample(std::span<const float> logits) {
  DZ_CHECK(!logits.empty(), "no logits to sample from");
  if (params_.temperature == 0.0f) return argmax(logits);

  const size_t n = logits.size();
  const double max_logit = logits[static_cast<size_t>(argmax(logits))];
  probs_.resize(n);
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    probs_[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / params_.temperature);
    total += probs_[i];
  }
  order_.resize(n);
  std::iota(order_.begin(), order_.end(), 0);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t a, int32_t b) { return probs_[a] > probs_[b]; });
  // Nucleus: the shortest prefix whose mass reaches top_p.
  const double target = static_cast<double>(params_.top_p) * total;
  double kept = 0;
  size_t num_kept = 0;
  while (num_kept < n && (num_kept == 0 || kept < target)) kept += probs_[order_[num_kept++]];

  // A uniform in [0, 1) from the top 53 bits, the same on every standard library.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * kept;
  double cumulative = 0;
  for (size_t i = 0; i < num_kept; ++i) {
    cumulative += probs_[order_[i]];
    if (u < cumulative) return order_[i];
  }
  return order_[num_kept - 1];  // u within rounding of the total
}

}  // namespace dz::runtime
