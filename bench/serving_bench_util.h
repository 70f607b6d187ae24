#pragma once
// Shared by the serving benchmarks (batched decode, cache utilisation, prefix TTFT): loading a
// synthetic model from bench/configs, one-token-per-sequence ForwardBatches over a plain KV
// cache, the load average beside each figure, and a tap sink that counts the distinct routed
// experts of a step.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/hybrid_model.h"
#include "dayzero/model/synthetic_model.h"
#include "dayzero/model/taps.h"

namespace dz::bench {

// The 1-minute load average (the machine is shared: every figure carries it).
inline double load_average() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1.0;
}

struct LoadedModel {
  model::SyntheticModelConfig config;
  model::SyntheticWeightBytes bytes;
  std::unique_ptr<model::HybridModel> model;
};

inline LoadedModel load_model(const std::string& path) {
  LoadedModel m;
  Result<model::SyntheticModelConfig> config = model::load_synthetic_config(path);
  DZ_CHECK(config.ok(), "{}", config.status().message());
  m.config = *config;
  m.bytes = model::synthetic_weight_bytes(m.config);
  Result<std::unique_ptr<model::HybridModel>> built = model::build_synthetic_model(m.config);
  DZ_CHECK(built.ok(), "{}", built.status().message());
  m.model = std::move(built).value();
  return m;
}

// The ids and arrays of one ForwardBatch of sequences that each run tokens [pos_begin, pos_end)
// of their own token list.
struct BatchBuilder {
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> slots, rows;
  model::ForwardBatch batch;

  void clear() {
    ids.clear(), positions.clear(), slots.clear(), rows.clear();
    batch = model::ForwardBatch{};
  }
  // Adds one sequence; its last token's row goes to the logits.
  void add(const std::vector<int32_t>& tokens, std::span<const int32_t> block_table,
           int64_t block_size, int64_t pos_begin, int64_t pos_end, int32_t state_slot) {
    batch.block_size = block_size;
    batch.sequences.push_back(model::SequenceSlice{.token_begin = static_cast<int64_t>(ids.size()),
                                                   .num_tokens = pos_end - pos_begin,
                                                   .pos_begin = pos_begin,
                                                   .block_table = block_table,
                                                   .state_slot = state_slot});
    for (int64_t p = pos_begin; p < pos_end; ++p) {
      ids.push_back(tokens[static_cast<size_t>(p)]);
      positions.push_back(static_cast<int32_t>(p));
      slots.push_back(model::slot_of(block_table, block_size, p));
    }
    rows.push_back(static_cast<int64_t>(ids.size()) - 1);
  }
  const model::ForwardBatch& finish() {
    batch.token_ids = ids;
    batch.positions = positions;
    batch.slot_mapping = slots;
    return batch;
  }
};

// Counts, per MoE layer and step, the distinct experts the batch routed to (top-k of σ score +
// correction bias, n_group 1, as MoeBlock routes), from the "router_scores" tap.
class ExpertCounter : public model::TapSink {
 public:
  explicit ExpertCounter(const model::HybridModel& m) : model_(m) {}
  void on_tap(int layer_id, std::string_view name, const float* data, const Shape& shape) override {
    if (name != "router_scores") return;
    const model::MoeBlock& moe = *model_.layer(layer_id).moe;
    const int64_t T = shape[0], E = shape[1], k = moe.config().num_experts_per_tok;
    const std::vector<float>& bias = moe.weights().e_score_correction_bias;
    std::vector<char> seen(static_cast<size_t>(E), 0);
    std::vector<int32_t> order(static_cast<size_t>(E));
    for (int64_t t = 0; t < T; ++t) {
      std::iota(order.begin(), order.end(), 0);
      auto biased = [&](int32_t e) {
        return data[t * E + e] + (bias.empty() ? 0.0f : bias[static_cast<size_t>(e)]);
      };
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return biased(a) > biased(b) || (biased(a) == biased(b) && a < b);
      });
      for (int64_t i = 0; i < k; ++i) seen[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
    }
    distinct_sum_ += std::accumulate(seen.begin(), seen.end(), int64_t{0});
    ++layer_steps_;
  }
  // Mean distinct experts per MoE layer per step since the last reset.
  double mean_distinct() const {
    return layer_steps_ == 0
               ? 0.0
               : static_cast<double>(distinct_sum_) / static_cast<double>(layer_steps_);
  }
  void reset() { distinct_sum_ = 0, layer_steps_ = 0; }

 private:
  const model::HybridModel& model_;
  int64_t distinct_sum_ = 0;
  int64_t layer_steps_ = 0;
};

}  // namespace dz::bench
