#include "model_sweep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <numeric>
#include <utility>

#include "dayzero/core/check.h"
#include "dayzero/core/splitmix.h"
#include "dayzero/formats/act_quant.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/step_broadcast.h"

namespace dz::bench {
namespace {

// SplitMix64 with values rounded to BF16 (the cache and state values the model stores).
class Rng : public SplitMix64 {
 public:
  using SplitMix64::SplitMix64;
  float bf16_uniform(float stddev) { return formats::round_to_bf16(uniform(stddev)); }
};

uint64_t mix_seed(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  Rng r(seed ^ (a * 0x9E3779B97F4A7C15ull) ^ (b * 0xC2B2AE3D27D4EB4Full) ^
        (c * 0x165667B19E3779F9ull));
  return r.next();
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Cache bytes per token of the paged pools and per state slot, from the specs (before any
// allocation, to refuse a sweep that does not fit).
int64_t paged_bytes_per_token(std::span<const model::LayerCacheSpec> specs) {
  int64_t bytes = 0;
  for (const model::LayerCacheSpec& s : specs) {
    if (s.mla.latent_dim > 0) bytes += s.mla.record_bytes();
    if (s.index_key_dim > 0) bytes += s.index_key_dim + 4;
  }
  return bytes;
}
int64_t state_bytes_per_slot(std::span<const model::LayerCacheSpec> specs) {
  int64_t bytes = 0;
  for (const model::LayerCacheSpec& s : specs)
    if (s.kda.num_heads > 0) bytes += s.kda.slot_bytes();
  return bytes;
}

bool has_recurrent_state(std::span<const model::LayerCacheSpec> specs) {
  return std::any_of(specs.begin(), specs.end(),
                     [](const model::LayerCacheSpec& s) { return s.kda.num_heads > 0; });
}

Result<model::KvCache> make_cache(std::span<const model::LayerCacheSpec> specs, int64_t num_blocks,
                                  int64_t block_size, int64_t num_slots, double max_bytes,
                                  model::BlockShard shard) {
  const double bytes =
      static_cast<double>(shard.stored_blocks(num_blocks) * block_size) *
          static_cast<double>(paged_bytes_per_token(specs)) +
      static_cast<double>(num_slots) * static_cast<double>(state_bytes_per_slot(specs));
  if (bytes > max_bytes)
    return make_error(StatusCode::kInvalidArgument,
                      "the cache for this sweep needs {:.2f} GiB (largest batch x (context + "
                      "steps)), over the {:.0f} GiB allowed: lower --batch or --context",
                      bytes / double(1 << 30), max_bytes / double(1 << 30));
  return model::KvCache::create(specs, num_blocks, block_size, num_slots, shard);
}

constexpr double kMaxCacheBytes = 14.0 * (1LL << 30);  // the machine has 24 GiB

}  // namespace

double expected_distinct_experts(int64_t num_experts, int64_t top_k, int64_t batch) {
  const auto E = static_cast<double>(num_experts);
  return E * (1.0 - std::pow(1.0 - static_cast<double>(top_k) / E, static_cast<double>(batch)));
}

double clock_seconds(bool cpu, int cpu_threads) {
  if (cpu) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec)) /
           std::max(cpu_threads, 1);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Result<BenchModel> load_synthetic_bench_model(const std::string& config_path,
                                              kernels::Mxfp4Activations mxfp4_activations) {
  BenchModel m;
  m.name = config_path;
  DZ_ASSIGN_OR_RETURN(model::SyntheticModelConfig config,
                      model::load_synthetic_config(config_path));
  config.mxfp4_activations = mxfp4_activations;
  const double t0 = clock_seconds(false);
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<model::HybridModel> built,
                      model::build_synthetic_model(config));
  m.build_seconds = clock_seconds(false) - t0;
  m.bytes = model::synthetic_weight_bytes(config);
  m.synthetic = std::move(config);
  m.hybrid = built.get();
  m.model = std::move(built);
  return m;
}

BenchModel wrap_checkpoint_model(std::string name, std::unique_ptr<model::CausalLm> model) {
  BenchModel m;
  m.name = std::move(name);
  // Under a plan the model is rank 0's StepLeader: its shard says what the layers are.
  auto* leader = dynamic_cast<model::StepLeader*>(model.get());
  m.hybrid = dynamic_cast<model::HybridModel*>(leader != nullptr ? &leader->shard() : model.get());
  m.model = std::move(model);
  return m;
}

void BatchBuilder::clear() {
  ids.clear(), positions.clear(), slots.clear(), rows.clear();
  batch = model::ForwardBatch{};
}

void BatchBuilder::add(const std::vector<int32_t>& tokens, std::span<const int32_t> block_table,
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

const model::ForwardBatch& BatchBuilder::finish() {
  batch.token_ids = ids;
  batch.positions = positions;
  batch.slot_mapping = slots;
  return batch;
}

void ExpertCounter::on_tap(int layer_id, std::string_view name, const float* data,
                           const Shape& shape) {
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

void fill_context(const ExecContext& ctx, std::span<const model::LayerCacheSpec> specs,
                  model::KvCache& cache, std::span<const std::vector<int32_t>> block_tables,
                  int64_t num_tokens, std::span<const int32_t> state_slots, uint64_t seed) {
  const int64_t block_size = cache.block_size();
  constexpr int64_t kChunk = 256;  // positions per work item
  const int64_t num_chunks = ceil_div(num_tokens, kChunk);
  const auto num_seqs = static_cast<int64_t>(block_tables.size());
  for (size_t layer = 0; layer < specs.size(); ++layer) {
    const model::LayerCacheSpec& spec = specs[layer];
    const int layer_id = static_cast<int>(layer);
    if (spec.mla.latent_dim > 0 || spec.index_key_dim > 0) {
      const model::MlaLayerCache mla =
          spec.mla.latent_dim > 0 ? cache.mla_layer(layer_id) : model::MlaLayerCache{};
      const model::IndexLayerCache index =
          spec.index_key_dim > 0 ? cache.index_layer(layer_id) : model::IndexLayerCache{};
      parallel_for(ctx, num_seqs * num_chunks, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> latent(static_cast<size_t>(spec.mla.latent_dim));
        std::vector<float> rope(static_cast<size_t>(spec.mla.rope_dim));
        std::vector<uint16_t> key(static_cast<size_t>(spec.index_key_dim));
        std::vector<uint8_t> codes(static_cast<size_t>(spec.index_key_dim));
        for (int64_t item = begin; item < end; ++item) {
          const int64_t s = item / num_chunks, chunk = item % num_chunks;
          const std::span<const int32_t> table = block_tables[static_cast<size_t>(s)];
          Rng rng(mix_seed(seed, layer, static_cast<uint64_t>(s), static_cast<uint64_t>(chunk)));
          const int64_t p_end = std::min(num_tokens, (chunk + 1) * kChunk);
          for (int64_t pos = chunk * kChunk; pos < p_end; ++pos) {
            // Under context parallelism this rank fills the blocks it stores.
            const int64_t slot =
                cache.shard().stored_slot(model::slot_of(table, block_size, pos), block_size);
            if (slot < 0) continue;
            if (spec.mla.latent_dim > 0) {
              for (float& x : latent) x = rng.bf16_uniform(1.0f);
              for (float& x : rope) x = rng.bf16_uniform(1.0f);
              kernels::write_mla_record(mla.layout, mla.pool, slot, latent.data(), rope.data());
            }
            if (spec.index_key_dim > 0) {
              for (uint16_t& x : key) x = formats::encode_bf16(rng.bf16_uniform(1.0f));
              float scale = 0;
              formats::act_quant(key, formats::ActScaleFormat::kUe8m0, codes,
                                 std::span<float>(&scale, 1));
              kernels::write_index_key(index.layout, index.pool, slot, codes, scale);
            }
          }
        }
      });
    }
    if (spec.kda.num_heads > 0) {
      // A state of entries ~0.2 (β·v·kᵀ with unit-norm keys, summed over the decay's horizon) and
      // conv rows of RMS 1, as a sequence mid-way through a prompt would hold.
      const model::KdaLayerState kda = cache.kda_layer(layer_id);
      parallel_for(ctx, static_cast<int64_t>(state_slots.size()), 1,
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       const int32_t slot = state_slots[static_cast<size_t>(i)];
                       Rng rng(mix_seed(seed, layer, 1u << 20, static_cast<uint64_t>(slot)));
                       float* state = kda.state(slot);
                       for (int64_t j = 0; j < kda.layout.state_floats(); ++j)
                         state[j] = rng.bf16_uniform(0.2f);
                       uint16_t* conv = kda.conv_rows(slot);
                       for (int64_t j = 0; j < kda.layout.conv_elems(); ++j)
                         conv[j] = formats::encode_bf16(rng.bf16_uniform(1.0f));
                     }
                   });
    }
  }
}

int64_t count_filled_positions(std::span<const model::LayerCacheSpec> specs, model::KvCache& cache,
                               std::span<const int32_t> block_table, int64_t num_tokens) {
  for (size_t layer = 0; layer < specs.size(); ++layer) {
    const kernels::MlaCacheLayout& layout = specs[layer].mla;
    if (layout.latent_dim == 0) continue;
    const model::MlaLayerCache mla = cache.mla_layer(static_cast<int>(layer));
    std::vector<float> record(static_cast<size_t>(layout.latent_dim + layout.rope_dim));
    int64_t filled = 0;
    for (int64_t pos = 0; pos < num_tokens; ++pos) {
      const int64_t slot = cache.shard().stored_slot(
          model::slot_of(block_table, cache.block_size(), pos), cache.block_size());
      if (slot < 0) continue;  // another CP rank's block
      kernels::read_mla_record(layout, mla.pool, slot, record.data());
      const bool finite =
          std::all_of(record.begin(), record.end(), [](float x) { return std::isfinite(x); });
      const bool nonzero =
          std::any_of(record.begin(), record.end(), [](float x) { return x != 0.0f; });
      filled += finite && nonzero ? 1 : 0;
    }
    return filled;
  }
  return -1;
}

double cache_bytes_read_per_token(const model::HybridModel* hybrid,
                                  std::span<const model::LayerCacheSpec> specs, int64_t visible) {
  double bytes = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    // Layers outside the stack (an MTP head) do not run in forward().
    if (hybrid != nullptr && static_cast<int>(i) >= hybrid->num_layers()) break;
    const model::LayerCacheSpec& s = specs[i];
    if (s.mla.latent_dim > 0) {
      int64_t records = visible;
      if (hybrid != nullptr && hybrid->layer(static_cast<int>(i)).indexer != nullptr)
        records =
            std::min(visible, hybrid->layer(static_cast<int>(i)).indexer->config().index_topk);
      bytes += static_cast<double>(records) * static_cast<double>(s.mla.record_bytes());
    }
    if (s.index_key_dim > 0)
      bytes += static_cast<double>(visible) * static_cast<double>(s.index_key_dim + 4);
    if (s.kda.num_heads > 0) bytes += static_cast<double>(s.kda.slot_bytes());
  }
  return bytes;
}

Result<std::vector<DecodeRow>> run_decode(BenchModel& m, const DecodeOptions& opt,
                                          const std::function<void(const DecodeRow&)>& on_row) {
  if (opt.batches.empty() || opt.contexts.empty())
    return make_error(StatusCode::kInvalidArgument, "decode: empty --batch or --context list");
  model::CausalLm& lm = *m.model;
  const std::vector<model::LayerCacheSpec> specs = lm.cache_layers();
  const bool recurrent = has_recurrent_state(specs);
  const int64_t max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int64_t bs = opt.block_size;
  const ExecContext ctx{.num_threads = opt.num_threads};
  const int64_t vocab = lm.vocab_size();
  std::optional<ExpertCounter> counter;
  if (m.hybrid != nullptr) counter.emplace(*m.hybrid);
  const model::SyntheticWeightBytes& wb = m.bytes;
  std::vector<DecodeRow> rows;
  std::vector<float> logits;
  BatchBuilder bb;
  for (size_t ci = 0; ci < opt.contexts.size(); ++ci) {
    const int64_t L = opt.contexts[ci];
    // Positions: warm-up at L, timed steps at L + 1 … L + max_steps.
    const int64_t capacity = L + 1 + opt.max_steps;
    const int64_t blocks_per_seq = ceil_div(capacity, bs);
    // Blocks of different sequences interleaved, so no sequence's records are contiguous; under
    // context parallelism over C ranks entry b of a table is a block ≡ b (mod C), as the engine's
    // pool hands them out (docs/parallel.md §9.4): C·(q + 1) + b % C with q = ⌊b/C⌋·B_max + s.
    const int C = lm.cache_shard().count;
    const auto block_id = [&](int64_t s, int64_t b) {
      return static_cast<int32_t>(C * ((b / C) * max_batch + s + 1) + b % C);
    };
    DZ_ASSIGN_OR_RETURN(model::KvCache cache,
                        make_cache(specs, C * (ceil_div(blocks_per_seq, C) * max_batch + 2), bs,
                                   recurrent ? max_batch : 0, kMaxCacheBytes, lm.cache_shard()));
    lm.cache_created(cache);
    std::vector<std::vector<int32_t>> tables(static_cast<size_t>(max_batch));
    std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(max_batch));
    std::vector<int32_t> state_slots;
    Rng rng(mix_seed(opt.seed, 7, static_cast<uint64_t>(L), 0));
    for (int64_t s = 0; s < max_batch; ++s) {
      for (int64_t b = 0; b < blocks_per_seq; ++b)
        tables[static_cast<size_t>(s)].push_back(block_id(s, b));
      for (int64_t p = 0; p < capacity; ++p)
        tokens[static_cast<size_t>(s)].push_back(
            static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab)));
      if (recurrent) state_slots.push_back(static_cast<int32_t>(s));
    }
    const double t_fill = clock_seconds(false);
    fill_context(ctx, specs, cache, tables, L, state_slots, opt.seed + static_cast<uint64_t>(L));
    const double fill_seconds = clock_seconds(false) - t_fill;
    const int64_t filled_positions =
        count_filled_positions(specs, cache, tables[static_cast<size_t>(max_batch - 1)], L);

    std::vector<int64_t> pos(static_cast<size_t>(max_batch), L);
    auto step = [&](int64_t B, model::TapSink* taps) -> Result<double> {
      bb.clear();
      double cache_bytes = 0;
      for (int64_t s = 0; s < B; ++s) {
        const auto i = static_cast<size_t>(s);
        bb.add(tokens[i], tables[i], bs, pos[i], pos[i] + 1,
               recurrent ? static_cast<int32_t>(s) : -1);
        ++pos[i];
        cache_bytes += cache_bytes_read_per_token(m.hybrid, specs, pos[i]);
      }
      const model::ForwardBatch& batch = bb.finish();
      logits.resize(bb.rows.size() * static_cast<size_t>(vocab));
      DZ_RETURN_IF_ERROR(lm.forward(ctx, batch, cache, bb.rows, logits.data(), taps));
      return cache_bytes;
    };
    const size_t first_row = rows.size();
    for (int64_t B : opt.batches) {
      std::fill(pos.begin(), pos.end(), L);
      DZ_RETURN_IF_ERROR(step(B, nullptr).status());  // warm-up: scratch sized, pages touched
      if (counter) counter->reset();
      const int64_t received_before = m.comm ? m.comm->stats().total().bytes_received : 0;
      double cache_sum = 0;
      int steps = 0;
      const double t0 = clock_seconds(opt.cpu_clock, opt.num_threads);
      while (steps < opt.max_steps &&
             (steps < opt.min_steps ||
              clock_seconds(opt.cpu_clock, opt.num_threads) - t0 < opt.min_seconds)) {
        DZ_ASSIGN_OR_RETURN(const double cache_bytes, step(B, counter ? &*counter : nullptr));
        cache_sum += cache_bytes;
        ++steps;
      }
      DecodeRow row;
      row.context = L;
      row.batch = B;
      row.num_steps = steps;
      row.seconds_per_step = (clock_seconds(opt.cpu_clock, opt.num_threads) - t0) / steps;
      row.tokens_per_second = static_cast<double>(B) / row.seconds_per_step;
      row.fill_seconds = fill_seconds;
      row.filled_positions = filled_positions;
      row.load = load_average();
      row.distinct_experts = counter ? counter->mean_distinct() : 0.0;
      row.cache_bytes = cache_sum / steps;
      if (m.comm)
        row.comm_bytes_per_step =
            static_cast<double>(m.comm->stats().total().bytes_received - received_before) / steps;
      if (m.synthetic) {
        row.weight_bytes = static_cast<double>(wb.per_step_bytes);
        row.expert_bytes = row.distinct_experts * static_cast<double>(wb.num_moe_layers) *
                           static_cast<double>(wb.per_expert_bytes);
        row.bytes_per_step = row.weight_bytes + row.expert_bytes + row.cache_bytes;
        row.gbps = row.bytes_per_step / row.seconds_per_step / 1e9;
        if (opt.dram_gbps > 0) row.dram_fraction = row.gbps / opt.dram_gbps;
      }
      // Speedups against the first batch size of this context (per token), and the ideal.
      const DecodeRow& base = rows.size() > first_row ? rows[first_row] : row;
      const double per_token_base = base.tokens_per_second / static_cast<double>(base.batch);
      row.speedup = row.tokens_per_second / per_token_base;
      if (m.synthetic) {
        const double bytes1 = base.bytes_per_step / static_cast<double>(base.batch);
        row.ideal_speedup = static_cast<double>(B) * bytes1 / row.bytes_per_step;
        row.achieved_over_ideal = row.speedup / row.ideal_speedup;
      } else {
        row.ideal_speedup = row.achieved_over_ideal = 0;  // unknown without the weight bytes
      }
      // The same batch at the first context: how far decode slows as the context grows.
      row.vs_first_context = 1;
      for (size_t r = 0; r < first_row; ++r)
        if (rows[r].context == opt.contexts[0] && rows[r].batch == B)
          row.vs_first_context = row.tokens_per_second / rows[r].tokens_per_second;
      rows.push_back(row);
      if (on_row) on_row(rows.back());
    }
  }
  return rows;
}

double prefill_attention_flops(const model::HybridModel& model, int64_t num_tokens) {
  const auto T = static_cast<double>(num_tokens);
  const double all_pairs = T * (T + 1) / 2;  // Σ over positions p of (p + 1) visible keys
  double flops = 0;
  for (int i = 0; i < model.num_layers(); ++i) {
    const model::DecoderLayer& layer = model.layer(i);
    if (layer.mla != nullptr) {
      const model::MlaConfig& c = layer.mla->config();
      double pairs = all_pairs;
      if (layer.indexer != nullptr) {
        const model::DsaIndexerConfig& ic = layer.indexer->config();
        const auto K = static_cast<double>(ic.index_topk);
        // Positions p ≥ K see K keys, earlier ones p + 1.
        pairs = T <= K ? all_pairs : K * (K + 1) / 2 + (T - K) * K;
        flops += 2.0 * static_cast<double>(ic.index_n_heads * ic.index_head_dim) * all_pairs;
      }
      flops += 2.0 *
               static_cast<double>(c.num_heads *
                                   (c.qk_nope_head_dim + c.qk_rope_head_dim + c.v_head_dim)) *
               pairs;
    }
    if (layer.kda != nullptr) {
      const model::KdaConfig& c = layer.kda->config();
      flops += 6.0 * static_cast<double>(c.num_heads * c.head_dim * c.head_dim) * T;
    }
  }
  return flops;
}

Result<std::vector<PrefillRow>> run_prefill(BenchModel& m, const PrefillOptions& opt,
                                            const std::function<void(const PrefillRow&)>& on_row) {
  model::CausalLm& lm = *m.model;
  const std::vector<model::LayerCacheSpec> specs = lm.cache_layers();
  const bool recurrent = has_recurrent_state(specs);
  const ExecContext ctx{.num_threads = opt.num_threads};
  const int64_t vocab = lm.vocab_size();
  std::vector<PrefillRow> rows;
  std::vector<float> logits(static_cast<size_t>(vocab));
  BatchBuilder bb;
  for (int64_t T : opt.token_counts) {
    const int64_t bs = opt.block_size;
    DZ_ASSIGN_OR_RETURN(model::KvCache cache,
                        make_cache(specs, ceil_div(T, bs) + 1, bs, recurrent ? 1 : 0,
                                   kMaxCacheBytes, lm.cache_shard()));
    lm.cache_created(cache);
    std::vector<int32_t> table;
    for (int64_t b = 0; b < ceil_div(T, bs); ++b) table.push_back(static_cast<int32_t>(1 + b));
    Rng rng(mix_seed(opt.seed, 11, static_cast<uint64_t>(T), 0));
    std::vector<int32_t> tokens;
    for (int64_t p = 0; p < T; ++p)
      tokens.push_back(static_cast<int32_t>(rng.next() % static_cast<uint64_t>(vocab)));
    const int64_t chunk = std::min(opt.chunk_tokens, T);
    PrefillRow row;
    row.num_tokens = T;
    row.chunk_tokens = chunk;
    row.seconds = 1e300;
    for (int r = 0; r < std::max(1, opt.repeats); ++r) {
      // From position 0 each time: a KDA state slot restarts at zero (KdaBlock) and the records
      // are overwritten.
      const double t0 = clock_seconds(opt.cpu_clock, opt.num_threads);
      for (int64_t begin = 0; begin < T; begin += chunk) {
        bb.clear();
        bb.add(tokens, table, bs, begin, std::min(T, begin + chunk), recurrent ? 0 : -1);
        DZ_RETURN_IF_ERROR(lm.forward(ctx, bb.finish(), cache, bb.rows, logits.data(), nullptr));
      }
      row.seconds = std::min(row.seconds, clock_seconds(opt.cpu_clock, opt.num_threads) - t0);
    }
    row.tokens_per_second = static_cast<double>(T) / row.seconds;
    row.load = load_average();
    if (m.hybrid != nullptr) row.attention_flops = prefill_attention_flops(*m.hybrid, T);
    if (m.synthetic) {
      const double head = static_cast<double>(m.synthetic->vocab_size * m.synthetic->hidden_size);
      const double body = static_cast<double>(m.bytes.active_params) - head;
      row.linear_flops = 2.0 * body * static_cast<double>(T) +
                         2.0 * head * static_cast<double>(ceil_div(T, chunk));
      row.gflops = (row.linear_flops + row.attention_flops) / row.seconds / 1e9;
      if (opt.gemm_gflops > 0) row.gemm_fraction = row.gflops / opt.gemm_gflops;
    }
    rows.push_back(row);
    if (on_row) on_row(rows.back());
  }
  return rows;
}

}  // namespace dz::bench
