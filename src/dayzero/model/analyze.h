#pragma once
// `dayzero analyze`: what a model config asks of the engine and of the machines, before anything
// is loaded (docs/analyze.md). Layer kinds and their pattern, the sparse-attention parameters,
// parameters and bytes by component and dtype, memory per rank under a parallel plan, cache and
// recurrent-state bytes, communication bytes per step for each parallel dimension, and the list of
// operators, formats and fields the config uses with whether this engine runs them.

#include <cstdint>
#include <string>
#include <vector>

#include "dayzero/core/status.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/model/inspect.h"
#include "dayzero/model/parallel_plan.h"

namespace dz::model {

struct AnalyzeOptions {
  ParallelPlan plan;
  int64_t context = 4096;  // tokens per sequence held in the cache
  // Sequences decoding together (one token each per step), spread over the plan's ep groups.
  int64_t batch = 1;
  int64_t prefill_tokens = 2048;  // tokens of one prefill step (one sequence's chunk)
};

// One collective of a step: bytes one rank receives per layer, how many layers issue it, and the
// step's total. The formulas are those of docs/parallel.md §3, with T the tokens of the step.
struct CommLine {
  std::string dimension;  // "tp", "ep", "cp"
  std::string what;       // "all-reduce after o_proj (MLA, KDA)"
  std::string formula;    // "2(N-1)/N * T * h * 4"
  int64_t bytes_per_layer = 0;
  int64_t layers = 0;  // issues per step
  int64_t bytes_per_step = 0;
  bool implemented = true;  // false: planned, not yet run by the engine
};

struct Requirement {
  std::string item;  // "MLA (DeepSeek RoPE)", "DSA lightning indexer", "FP8 block weights", ...
  bool supported = false;
  std::string note;
};

struct Analysis {
  std::string model_type;
  std::string recipe;  // "" when no recipe reads this model_type
  bool runnable = false;
  ModelDims dims;
  ModelSummary summary;  // params and bytes (empty when no recipe reads the config)
  AnalyzeOptions options;
  Status plan_status;  // why the plan does not fit, or ok

  // Layer kinds of the main stack (MTP layers apart).
  int num_main_layers = 0;
  int num_mtp_layers = 0;
  int mla_layers = 0;      // MLA without the indexer
  int mla_dsa_layers = 0;  // MLA with the lightning indexer
  int kda_layers = 0;
  int dense_mlp_layers = 0;
  int moe_layers = 0;
  int latent_moe_layers = 0;
  int attn_res_layers = 0;
  std::vector<std::string> pattern;  // describe_schedule
  std::string mixer_period;          // "[KDA KDA KDA MLA] x 23, then MLA": token mixers by period

  // Memory per rank under the plan.
  int64_t weight_bytes_per_rank = 0;
  int64_t replicated_weight_bytes = 0;  // held whole by every rank
  // Per token, per rank (MLA latent and indexer keys are replicated over TP).
  int64_t mla_bytes_per_token_bf16 = 0;
  int64_t mla_bytes_per_token_fp8 = 0;
  int64_t index_bytes_per_token = 0;
  // Per sequence, per rank (KDA state and conv rows split by heads over TP).
  int64_t state_bytes_per_sequence = 0;
  // context tokens of cache (FP8 latent where the geometry allows it, else BF16) and one recurrent
  // state for each of the group's sequences (batch / ep, rounded up).
  int64_t cache_bytes_per_rank = 0;
  int64_t total_bytes_per_rank = 0;

  std::vector<CommLine> decode_comm;   // T = batch / ep tokens per TP group
  std::vector<CommLine> prefill_comm;  // T = prefill_tokens
  std::vector<Requirement> requirements;
};

// Analyzes DIR/config.json or a config.json file. Reads the config through the registry; a
// model_type the registry recognises but refuses is analysed from its fields as far as they go,
// with the missing operators listed.
Result<Analysis> analyze_config_path(const std::string& path, const AnalyzeOptions& options);
Result<Analysis> analyze_config(const formats::ConfigObject& root, const AnalyzeOptions& options);

std::string format_analysis_text(const Analysis& analysis);
std::string format_analysis_json(const Analysis& analysis);

// The token mixers of the main layers written as their shortest repeating unit, repeated as
// often as it fits from layer 0, then the remaining layers: "[KDA KDA KDA MLA] x 23, then MLA".
std::string mixer_period(const LayerSchedule& schedule);

// Expected number of other ranks a token's top-k experts live on when k of E experts are chosen
// uniformly and each of ep ranks holds E / ep of them: (ep - 1) · (1 - C(E - E/ep, k) / C(E, k)).
double expected_remote_ranks(int64_t num_experts, int64_t top_k, int ep);

}  // namespace dz::model
