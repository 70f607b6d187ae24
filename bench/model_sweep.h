#pragma once
// End-to-end model benchmarks behind `dayzero bench decode` and `dayzero bench prefill` (issue 8
// item 1; docs/performance.md "How to report a speed"): a model (a synthetic one built from a
// bench/configs/*.json with random weights, or a real checkpoint), timed decode steps over a
// synthetic cached context and timed prefills, with the bytes and FLOPs each step needs counted
// from the formulas so every figure is a fraction of the limits measured in the same run.
//
// Decode context. Filling 128K cached tokens by running prefill is far too slow on this CPU, so
// fill_context() writes the cache directly: random latent records (the normalised latent and the
// rotated rope part at RMS 1, BF16-rounded, quantised exactly as the model writes them), random
// indexer keys (RMS 1, BF16, act_quant ue8m0 like the indexer) and, for KDA layers, a random
// recurrent state and conv rows. A decode step over it does the same work as over a prefilled
// context: the same bytes read, the same indexer scoring and top-k selection over every key, the
// same attention over the selected (sparse) or all (dense) records. Only the values are not what a
// real prompt would leave.
//
// The batched-decode arithmetic is batched_decode_bench's (issue 5): ideal(B) = B · bytes(1) /
// bytes(B), with bytes(B) = the batch-independent weights once + each distinct routed expert the
// batch touched once (counted from the routing of the timed steps) + the cache bytes each sequence
// reads.

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/parallel.h"
#include "dayzero/core/status.h"
#include "dayzero/dist/comm.h"
#include "dayzero/model/causal_lm.h"
#include "dayzero/model/forward_batch.h"
#include "dayzero/model/hybrid_model.h"
#include "dayzero/model/kv_cache.h"
#include "dayzero/model/synthetic_model.h"
#include "dayzero/model/taps.h"

namespace dz::bench {

// The 1-minute load average (the machine is shared: every figure carries it).
inline double load_average() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1.0;
}

// E·(1 − (1 − k/E)^B): distinct experts a batch of B touches when each token picks k uniformly.
double expected_distinct_experts(int64_t num_experts, int64_t top_k, int64_t batch);

// Seconds on the wall clock, or when cpu the process's CPU time (all its threads) divided by
// cpu_threads: what machine_limits' cpu clock does, so steps and limits are timed alike.
double clock_seconds(bool cpu, int cpu_threads = 1);

// A model to benchmark. `synthetic` is set for a config-built model: only then are the weight
// bytes and FLOPs known from formulas.
struct BenchModel {
  std::string name;  // the config path or checkpoint directory
  std::unique_ptr<model::CausalLm> model;
  model::HybridModel* hybrid = nullptr;  // model as a HybridModel, or null
  std::optional<model::SyntheticModelConfig> synthetic;
  model::SyntheticWeightBytes bytes;  // synthetic only
  double build_seconds = 0;
  // A multi-rank plan's communicator (model is rank 0's StepLeader), for the traffic per step.
  dist::Comm* comm = nullptr;
};

Result<BenchModel> load_synthetic_bench_model(
    const std::string& config_path,
    kernels::Mxfp4Activations mxfp4_activations = kernels::Mxfp4Activations::kBf16);
// Wraps a loaded checkpoint (the CLI loads it as `dayzero generate` does).
BenchModel wrap_checkpoint_model(std::string name, std::unique_ptr<model::CausalLm> model);

// The ids and arrays of one ForwardBatch of sequences that each run tokens [pos_begin, pos_end)
// of their own token list.
struct BatchBuilder {
  std::vector<int32_t> ids, positions;
  std::vector<int64_t> slots, rows;
  model::ForwardBatch batch;

  void clear();
  // Adds one sequence; its last token's row goes to the logits.
  void add(const std::vector<int32_t>& tokens, std::span<const int32_t> block_table,
           int64_t block_size, int64_t pos_begin, int64_t pos_end, int32_t state_slot);
  const model::ForwardBatch& finish();
};

// Counts, per MoE layer and step, the distinct experts the batch routed to (top-k of σ score +
// correction bias, n_group 1, as MoeBlock routes), from the "router_scores" tap.
class ExpertCounter : public model::TapSink {
 public:
  explicit ExpertCounter(const model::HybridModel& m) : model_(m) {}
  void on_tap(int layer_id, std::string_view name, const float* data, const Shape& shape) override;
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

// Writes `num_tokens` random cached tokens (positions [0, num_tokens)) into every paged layer
// pool for each block table, and a random recurrent state into each state slot (KDA layers);
// see the header comment. Deterministic for a seed; parallel over ctx's threads.
void fill_context(const ExecContext& ctx, std::span<const model::LayerCacheSpec> specs,
                  model::KvCache& cache, std::span<const std::vector<int32_t>> block_tables,
                  int64_t num_tokens, std::span<const int32_t> state_slots, uint64_t seed);

// What one decode token of a sequence reads from the cache at `visible` cached positions
// (its own record included): dense MLA layers every record, mla_dsa layers every indexer key and
// min(visible, top-k) records, KDA layers the recurrent state and conv rows.
// Reads back the first paged MLA layer's records at positions [0, num_tokens) of a block table
// and counts those that are finite and not all zero: what a fill really left in the cache (−1 when
// no layer has latent records; only the positions in blocks this rank stores).
int64_t count_filled_positions(std::span<const model::LayerCacheSpec> specs, model::KvCache& cache,
                               std::span<const int32_t> block_table, int64_t num_tokens);

double cache_bytes_read_per_token(const model::HybridModel* hybrid,
                                  std::span<const model::LayerCacheSpec> specs, int64_t visible);

struct DecodeOptions {
  std::vector<int64_t> batches{1, 4, 16, 64};
  std::vector<int64_t> contexts{1024};
  int num_threads = 1;
  double min_seconds = 2.0;  // timed per row (after one warm-up step)
  int min_steps = 3;
  int max_steps = 64;
  bool cpu_clock = false;
  int64_t block_size = 64;
  uint64_t seed = 1;
  double dram_gbps = 0;  // the limit at num_threads, for the fractions (0: not known)
};

struct DecodeRow {
  int64_t context = 0;  // cached tokens before the first timed step
  int64_t batch = 0;
  int num_steps = 0;
  double seconds_per_step = 0;
  double tokens_per_second = 0;
  // Bytes one step reads (synthetic models; 0 otherwise): weights in the form decode reads,
  // distinct routed experts, cache records/keys/states.
  double weight_bytes = 0;
  double expert_bytes = 0;
  double cache_bytes = 0;
  double bytes_per_step = 0;
  double gbps = 0;
  double dram_fraction = 0;
  double distinct_experts = 0;  // per MoE layer per step (0 without MoE)
  double speedup = 1;           // tokens/s over the first batch of the same context, per token
  double ideal_speedup = 1;
  double achieved_over_ideal = 1;
  double vs_first_context = 1;     // tokens/s over the same batch at the first context
  double comm_bytes_per_step = 0;  // the model's bytes received from other ranks (a plan)
  double fill_seconds = 0;         // writing the synthetic context (once per context)
  int64_t filled_positions = 0;    // count_filled_positions of the last sequence after the fill
  double load = 0;
};

// Runs the sweep: for each context (cache rebuilt and filled once, for the largest batch), each
// batch size. on_row is called as each row completes (progress output).
Result<std::vector<DecodeRow>> run_decode(BenchModel& m, const DecodeOptions& options,
                                          const std::function<void(const DecodeRow&)>& on_row);

struct PrefillOptions {
  std::vector<int64_t> token_counts{512, 2048};
  int64_t chunk_tokens = 2048;  // tokens per forward
  int num_threads = 1;
  int repeats = 1;  // best of
  bool cpu_clock = false;
  int64_t block_size = 64;
  uint64_t seed = 1;
  double gemm_gflops = 0;  // the best GEMM peak at num_threads (0: not known)
};

struct PrefillRow {
  int64_t num_tokens = 0;
  int64_t chunk_tokens = 0;
  double seconds = 0;
  double tokens_per_second = 0;
  double linear_flops = 0;     // 2 · active params · tokens (lm_head on the last token only)
  double attention_flops = 0;  // from the formulas (see prefill_attention_flops)
  double gflops = 0;           // (linear + attention) / seconds
  double gemm_fraction = 0;
  double load = 0;
};

// Attention FLOPs of prefilling positions [0, num_tokens) in chunks, as the engine computes them:
// MLA 2·H·(d_qk + d_v) per visible (query, key) pair (causal; mla_dsa layers min(pos + 1, top-k)
// keys), the indexer 2·n_I·d_I per (query, key) pair over all visible keys, KDA 6·H·d² per token
// (the three d×d state products). Elementwise work (softmax, norms, RoPE) is not counted.
double prefill_attention_flops(const model::HybridModel& model, int64_t num_tokens);

Result<std::vector<PrefillRow>> run_prefill(BenchModel& m, const PrefillOptions& options,
                                            const std::function<void(const PrefillRow&)>& on_row);

}  // namespace dz::bench
