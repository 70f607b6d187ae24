#pragma once
// Shared by the serving benchmarks (batched decode, cache utilisation, prefix TTFT): loading a
// synthetic model from bench/configs. The batch builder, the load average and the distinct-expert
// counter live in model_sweep.h (dz_bench_model), shared with `dayzero bench decode`.

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
#include "model_sweep.h"

namespace dz::bench {

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

}  // namespace dz::bench
