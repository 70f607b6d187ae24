#include "dayzero/model/verify.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include "dayzero/kernels/norms.h"
#include "dayzero/model/kv_cache.h"
#include "dayzero/model/vision/vision_encoder.h"

namespace dz::model {

void CapturingTapSink::on_tap(int layer_id, std::string_view name, const float* data,
                              const Shape& shape) {
  TapArray& a = taps_[{layer_id, std::string(name)}];
  a.shape = shape;
  a.data.assign(data, data + shape.num_elems());
}

const float* CapturingTapSink::substitute(int layer_id, std::string_view name, const Shape& shape) {
  if (given_ == nullptr || std::find(names_.begin(), names_.end(), name) == names_.end())
    return nullptr;
  auto it = given_->find({layer_id, std::string(name)});
  return it != given_->end() && it->second.shape == shape ? it->second.data.data() : nullptr;
}

namespace {

// One sequence of token ids at positions 0…T−1 over a fresh KV cache (the trivial block
// allocator): each C++ run of the verification starts from empty caches.
struct FreshSequence {
  KvCache cache;
  SequentialBlocks blocks;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  ForwardBatch batch;
};

Result<std::unique_ptr<FreshSequence>> fresh_sequence(const CausalLm& model,
                                                      std::span<const int32_t> token_ids,
                                                      int64_t block_size) {
  const auto T = static_cast<int64_t>(token_ids.size());
  const int64_t num_blocks = (T + block_size - 1) / block_size;
  std::vector<LayerCacheSpec> layers = model.cache_layers();
  const bool recurrent = std::any_of(layers.begin(), layers.end(), [](const LayerCacheSpec& spec) {
    return spec.kda.num_heads > 0;
  });
  DZ_ASSIGN_OR_RETURN(KvCache cache, KvCache::create(layers, num_blocks, block_size,
                                                     recurrent ? 1 : 0, model.cache_shard()));
  auto seq = std::unique_ptr<FreshSequence>(
      new FreshSequence{std::move(cache), SequentialBlocks(num_blocks, block_size), {}, {}, {}});
  DZ_RETURN_IF_ERROR(seq->blocks.reserve(T));
  for (int64_t i = 0; i < T; ++i) {
    seq->positions.push_back(static_cast<int32_t>(i));
    seq->slots.push_back(seq->blocks.slot_of(i));
  }
  seq->batch = ForwardBatch{
      .token_ids = token_ids,
      .positions = seq->positions,
      .slot_mapping = seq->slots,
      .sequences = {SequenceSlice{.token_begin = 0,
                                  .num_tokens = T,
                                  .pos_begin = 0,
                                  .block_table = seq->blocks.block_table(),
                                  .state_slot = 0}},
      .block_size = block_size,
  };
  return seq;
}

Result<const TapArray*> need(const TapMap& taps, int layer_id, const std::string& name,
                             const Shape& shape, const char* side) {
  auto it = taps.find({layer_id, name});
  if (it == taps.end())
    return make_error(StatusCode::kInvalidArgument, "{} tap ({}, {}) is missing", side, layer_id,
                      name);
  if (!(it->second.shape == shape))
    return make_error(StatusCode::kInvalidArgument, "{} tap ({}, {}) has shape {}, expected {}",
                      side, layer_id, name, it->second.shape.to_string(), shape.to_string());
  return &it->second;
}

// ‖a − b‖₂ / ‖b‖₂ over n elements (the absolute norm when b is all zeros).
double rel_rms(const float* a, const float* b, int64_t n) {
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    ref += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

VerifyRow below(std::string level, int layer_id, std::string quantity, std::string metric,
                double value, double tolerance) {
  return VerifyRow{std::move(level), layer_id, std::move(quantity), std::move(metric), value,
                   tolerance,        false,    value < tolerance};
}

// A count that must not exceed `tolerance`.
VerifyRow count_at_most(std::string level, int layer_id, std::string quantity, std::string metric,
                        int64_t count, int64_t tolerance) {
  return VerifyRow{std::move(level),
                   layer_id,
                   std::move(quantity),
                   std::move(metric),
                   static_cast<double>(count),
                   static_cast<double>(tolerance),
                   false,
                   count <= tolerance};
}

// Rows whose selected sets differ by more than near-ties: a position chosen by one side only is
// excused when its reference score is within `bound`·max|row score| of the reference's k-th score
// (a BF16 / FP8 rounding flip between nearly equal candidates, docs/models.md §8.1). Row t is the
// query at positions[t]; ref_scores has T keys per row.
int64_t indexer_unexplained_rows(const int32_t* ours, const float* ref_sel, const float* ref_scores,
                                 std::span<const int32_t> positions, int64_t T, int64_t K) {
  int64_t bad_rows = 0;
  for (size_t t = 0; t < positions.size(); ++t) {
    const int32_t pos = positions[t];
    std::set<int32_t> a, b;
    for (size_t j = t * static_cast<size_t>(K); j < (t + 1) * static_cast<size_t>(K); ++j) {
      if (ours[j] >= 0) a.insert(ours[j]);
      if (ref_sel[j] >= 0) b.insert(static_cast<int32_t>(ref_sel[j]));
    }
    if (a == b) continue;
    const float* row = ref_scores + static_cast<int64_t>(t) * T;
    double scale = 0, kth = INFINITY;
    for (int32_t s = 0; s <= pos; ++s) scale = std::max(scale, std::fabs(double{row[s]}));
    for (int32_t s : b) kth = std::min(kth, double{row[s]});
    bool explained = a.size() == b.size();
    for (int32_t s : a)
      if (!b.count(s) && (s > pos || std::fabs(row[s] - kth) > kIndexerGapBound * scale))
        explained = false;
    for (int32_t s : b)
      if (!a.count(s) && std::fabs(row[s] - kth) > kIndexerGapBound * scale) explained = false;
    if (!explained) ++bad_rows;
  }
  return bad_rows;
}

// Tokens whose expert sets differ by more than near-ties of the biased reference scores.
int64_t routing_unexplained_tokens(const std::vector<int32_t>& ours, const float* ref_ids,
                                   const float* ref_scores, const std::vector<float>& bias,
                                   int64_t T, int64_t k, int64_t E) {
  int64_t bad = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::set<int32_t> a, b;
    for (int64_t j = 0; j < k; ++j) {
      a.insert(ours[static_cast<size_t>(t * k + j)]);
      b.insert(static_cast<int32_t>(ref_ids[t * k + j]));
    }
    if (a == b) continue;
    double lo = INFINITY, hi = -INFINITY;
    auto biased = [&](int32_t e) {
      return double{ref_scores[t * E + e]} +
             (bias.empty() ? 0.0 : double{bias[static_cast<size_t>(e)]});
    };
    for (int32_t e : a)
      if (!b.count(e)) lo = std::min(lo, biased(e)), hi = std::max(hi, biased(e));
    for (int32_t e : b)
      if (!a.count(e)) lo = std::min(lo, biased(e)), hi = std::max(hi, biased(e));
    if (hi - lo > kRoutingGapBound) ++bad;
  }
  return bad;
}

// The engine's tap `name` against the reference's, both [rows, cols].
Status compare_tap(const TapMap& ours, const TapMap& ref, int layer_id, const std::string& name,
                   const Shape& shape, const char* level, double tolerance,
                   std::vector<VerifyRow>& rows) {
  DZ_ASSIGN_OR_RETURN(const TapArray* a, need(ours, layer_id, name, shape, "engine"));
  DZ_ASSIGN_OR_RETURN(const TapArray* b, need(ref, layer_id, name, shape, "reference"));
  rows.push_back(below(level, layer_id, name, "rel_rms",
                       rel_rms(a->data.data(), b->data.data(), shape.num_elems()), tolerance));
  return Status::ok_status();
}

// The engine's tap `name` [T, cols] against columns [first, first + cols) of the reference's
// [T, ·]: a rank's heads under tensor parallelism (all of them in one process).
Status compare_tap_columns(const TapMap& ours, const TapMap& ref, int layer_id,
                           const std::string& name, int64_t T, int64_t cols, int64_t first,
                           const char* level, double tolerance, std::vector<VerifyRow>& rows) {
  DZ_ASSIGN_OR_RETURN(const TapArray* a, need(ours, layer_id, name, {T, cols}, "engine"));
  const auto it = ref.find({layer_id, name});
  if (it == ref.end())
    return make_error(StatusCode::kInvalidArgument, "reference tap ({}, {}) is missing", layer_id,
                      name);
  const Shape& shape = it->second.shape;
  if (shape.rank() != 2 || shape[0] != T || shape[1] < first + cols)
    return make_error(StatusCode::kInvalidArgument,
                      "reference tap ({}, {}) has shape {}, expected [{}, >= {}]", layer_id, name,
                      shape.to_string(), T, first + cols);
  std::vector<float> picked(static_cast<size_t>(T * cols));
  for (int64_t t = 0; t < T; ++t)
    std::copy_n(it->second.data.data() + t * shape[1] + first, cols, picked.data() + t * cols);
  rows.push_back(below(level, layer_id, name, "rel_rms",
                       rel_rms(a->data.data(), picked.data(), T * cols), tolerance));
  return Status::ok_status();
}

// The indexer's rows from a layer run on the reference's q latent (docs/models.md §8.1): its scores
// at the positions it selected against the reference's, and the selected sets up to near-ties.
// Row t is the query at positions[t], of a sequence of T tokens.
Status indexer_rows(const DecoderLayer& layer, std::span<const int32_t> positions, int64_t T,
                    const TapMap& ours, const TapMap& ref, std::vector<VerifyRow>& rows) {
  const int l = layer.layer_id;
  const int64_t K = layer.indexer->config().index_topk;
  const auto R = static_cast<int64_t>(positions.size());
  const char* kRef = "reference";
  DZ_ASSIGN_OR_RETURN(const TapArray* ref_scores, need(ref, l, "index_scores", {R, T}, kRef));
  DZ_ASSIGN_OR_RETURN(const TapArray* ref_sel, need(ref, l, "index_selection", {R, K}, kRef));
  DZ_ASSIGN_OR_RETURN(const TapArray* our_scores, need(ours, l, "index_scores", {R, K}, "engine"));
  DZ_ASSIGN_OR_RETURN(const TapArray* our_sel, need(ours, l, "index_selection", {R, K}, "engine"));
  std::vector<int32_t> selection(our_sel->data.begin(), our_sel->data.end());
  std::vector<float> a, b;
  for (int64_t t = 0; t < R; ++t)
    for (int64_t j = 0; j < K; ++j) {
      const int32_t s = selection[static_cast<size_t>(t * K + j)];
      if (s < 0 || s > positions[static_cast<size_t>(t)]) continue;
      a.push_back(our_scores->data[static_cast<size_t>(t * K + j)]);
      b.push_back(ref_scores->data[static_cast<size_t>(t * T + s)]);
    }
  rows.push_back(below("operator", l, "index_scores", "rel_rms",
                       rel_rms(a.data(), b.data(), static_cast<int64_t>(a.size())),
                       kOperatorRelRms));
  rows.push_back(count_at_most("operator", l, "index_selection", "rows_beyond_gap",
                               indexer_unexplained_rows(selection.data(), ref_sel->data.data(),
                                                        ref_scores->data.data(), positions, T, K),
                               0));
  return Status::ok_status();
}

// The token mixer of `layer` as the model runs it (DecoderLayer::attention), on the reference's
// attention input, with the reference's q latent and indexer selection carried on in place of
// the engine's own (the engine's are compared first), so attention is checked on the reference's
// sparse set.
// `batch` is the whole sequence, or this rank's pieces of it under context parallelism (`ref`
// then holds their rows); T is the sequence's length.
Status mixer_rows(const ExecContext& ctx, const DecoderLayer& layer, const ForwardBatch& batch,
                  int64_t sequence_tokens, KvCache& cache, const TapMap& ref, Arena& scratch,
                  std::vector<VerifyRow>& rows) {
  const int l = layer.layer_id;
  const int64_t T = batch.num_tokens(), d = layer.hidden_size;
  const char* kRef = "reference";
  DZ_ASSIGN_OR_RETURN(const TapArray* attn_norm, need(ref, l, "attn_norm", {T, d}, kRef));
  const int64_t r_q = layer.mla != nullptr ? layer.mla->config().q_lora_rank : 0;
  if (r_q > 0) DZ_RETURN_IF_ERROR(need(ref, l, "q_latent", {T, r_q}, kRef).status());
  if (layer.indexer != nullptr) {
    const int64_t K = layer.indexer->config().index_topk;
    DZ_RETURN_IF_ERROR(need(ref, l, "index_selection", {T, K}, kRef).status());
  }
  CapturingTapSink sink(&ref, {"q_latent", "index_selection"});
  std::vector<float> out(static_cast<size_t>(T * d));
  layer.attention(ctx, batch, cache, attn_norm->data.data(), out.data(), scratch, &sink);
  if (layer.kda != nullptr) {
    // This rank's heads (all of them in one process).
    const KdaConfig& c = layer.kda->config();
    const int64_t width = c.num_heads * c.head_dim, first = c.head_offset * c.head_dim;
    for (const char* name : {"kda_q", "kda_k", "kda_v", "kda_g", "kda_core"})
      DZ_RETURN_IF_ERROR(compare_tap_columns(sink.taps(), ref, l, name, T, width, first, "operator",
                                             kOperatorRelRms, rows));
    DZ_RETURN_IF_ERROR(compare_tap_columns(sink.taps(), ref, l, "kda_beta", T, c.num_heads,
                                           c.head_offset, "operator", kOperatorRelRms, rows));
  }
  if (r_q > 0)
    DZ_RETURN_IF_ERROR(
        compare_tap(sink.taps(), ref, l, "q_latent", {T, r_q}, "operator", kOperatorRelRms, rows));
  if (layer.indexer != nullptr)
    DZ_RETURN_IF_ERROR(
        indexer_rows(layer, batch.positions, sequence_tokens, sink.taps(), ref, rows));
  kernels::round_to_bf16(out.data(), T * d);
  DZ_ASSIGN_OR_RETURN(const TapArray* attn_out, need(ref, l, "attn_out", {T, d}, kRef));
  rows.push_back(below("operator", l, "attn_out", "rel_rms",
                       rel_rms(out.data(), attn_out->data.data(), T * d), kOperatorRelRms));
  return Status::ok_status();
}

// The FFN of `layer` as the model runs it (DecoderLayer::ffn) on the reference's FFN input: the
// engine's routing is compared, then the experts run on the reference's decisions.
Status ffn_rows(const ExecContext& ctx, const DecoderLayer& layer, int64_t T, const TapMap& ref,
                Arena& scratch, std::vector<VerifyRow>& rows) {
  const int l = layer.layer_id;
  const int64_t d = layer.hidden_size;
  const char* kRef = "reference";
  DZ_ASSIGN_OR_RETURN(const TapArray* ffn_norm, need(ref, l, "ffn_norm", {T, d}, kRef));
  DZ_ASSIGN_OR_RETURN(const TapArray* ffn_out, need(ref, l, "ffn_out", {T, d}, kRef));
  if (layer.moe != nullptr) {
    const int64_t k = layer.moe->config().num_experts_per_tok;
    DZ_RETURN_IF_ERROR(need(ref, l, "routing_ids", {T, k}, kRef).status());
    DZ_RETURN_IF_ERROR(need(ref, l, "routing_weights", {T, k}, kRef).status());
  }
  CapturingTapSink sink(&ref, {"routing_ids", "routing_weights"});
  std::vector<float> out(static_cast<size_t>(T * d));
  layer.ffn(ctx, ffn_norm->data.data(), T, out.data(), scratch, &sink);
  if (layer.moe != nullptr) {
    const MoeConfig& c = layer.moe->config();
    const int64_t E = c.num_experts, k = c.num_experts_per_tok;
    DZ_RETURN_IF_ERROR(compare_tap(sink.taps(), ref, l, "router_scores", {T, E}, "operator",
                                   kOperatorRelRms, rows));
    DZ_ASSIGN_OR_RETURN(const TapArray* ref_router, need(ref, l, "router_scores", {T, E}, kRef));
    DZ_ASSIGN_OR_RETURN(const TapArray* ref_ids, need(ref, l, "routing_ids", {T, k}, kRef));
    DZ_ASSIGN_OR_RETURN(const TapArray* our_ids,
                        need(sink.taps(), l, "routing_ids", {T, k}, "engine"));
    const std::vector<int32_t> ids(our_ids->data.begin(), our_ids->data.end());
    rows.push_back(count_at_most(
        "operator", l, "routing_ids", "tokens_beyond_gap",
        routing_unexplained_tokens(ids, ref_ids->data.data(), ref_router->data.data(),
                                   layer.moe->weights().e_score_correction_bias, T, k, E),
        0));
    if (layer.moe->weights().latent_down_proj) {
      const int64_t r = layer.moe->weights().latent_down_proj->out_features();
      DZ_RETURN_IF_ERROR(
          compare_tap(sink.taps(), ref, l, "latent_in", {T, r}, "operator", kOperatorRelRms, rows));
    }
  }
  rows.push_back(below("operator", l, "ffn_out", "rel_rms",
                       rel_rms(out.data(), ffn_out->data.data(), T * d), kOperatorRelRms));
  return Status::ok_status();
}

// The reference's per-token taps cut to the rows of this rank's pieces (context parallelism); the
// logits stay whole (every rank computes all asked rows).
TapMap rows_of_split(const TapMap& ref, const ContextSplit& split, int64_t T) {
  TapMap mine;
  const int64_t n = split.local().num_tokens();
  for (const auto& [key, array] : ref) {
    if (array.shape.rank() == 0 || array.shape[0] != T ||
        key == std::pair{-1, std::string("logits")}) {
      mine.emplace(key, array);
      continue;
    }
    const int64_t width = array.shape.num_elems() / T;
    TapArray& cut = mine[key];
    cut.shape = array.shape;
    cut.shape[0] = n;
    cut.data.resize(static_cast<size_t>(n * width));
    for (int64_t t = 0; t < n; ++t)
      std::copy_n(array.data.data() + split.full_token(t) * width, width,
                  cut.data.data() + t * width);
  }
  return mine;
}

}  // namespace

Result<std::vector<VerifyRow>> verify_model(const ExecContext& ctx, HybridModel& model,
                                            std::span<const int32_t> token_ids, const TapMap& ref,
                                            int64_t block_size,
                                            std::span<const GivenEmbedding> given) {
  const auto T = static_cast<int64_t>(token_ids.size());
  const int64_t d = model.hidden_size(), V = model.vocab_size();
  if (T == 0) return make_error(StatusCode::kInvalidArgument, "verify: no tokens");
  std::vector<VerifyRow> rows;

  // Operator level: one fresh cache for all layers (each writes only its own pools and state).
  // Under context parallelism each rank checks the rows of its own pieces (the layers' taps see
  // only those), and rank 0 reports each row's worst rank.
  std::unique_ptr<ContextSplit> split;
  TapMap split_ref;
  {
    DZ_ASSIGN_OR_RETURN(std::unique_ptr<FreshSequence> seq,
                        fresh_sequence(model, token_ids, block_size));
    split = model.split_step(seq->batch);
    if (split != nullptr) split_ref = rows_of_split(ref, *split, T);
    const ForwardBatch& batch = split != nullptr ? split->local() : seq->batch;
    const TapMap& mine = split != nullptr ? split_ref : ref;
    Arena& scratch = model.block_scratch(ctx, batch);
    for (int l = 0; l < model.num_layers(); ++l) {
      DZ_RETURN_IF_ERROR(
          mixer_rows(ctx, model.layer(l), batch, T, seq->cache, mine, scratch, rows));
      DZ_RETURN_IF_ERROR(ffn_rows(ctx, model.layer(l), batch.num_tokens(), mine, scratch, rows));
    }
  }

  // Layer and model level: the engine's own forward, with its own decisions.
  DZ_ASSIGN_OR_RETURN(std::unique_ptr<FreshSequence> seq,
                      fresh_sequence(model, token_ids, block_size));
  seq->batch.given_embeddings = given;
  std::vector<int64_t> all_rows(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) all_rows[static_cast<size_t>(t)] = t;
  std::vector<float> logits(static_cast<size_t>(T * V));
  CapturingTapSink sink;
  DZ_RETURN_IF_ERROR(model.forward(ctx, seq->batch, seq->cache, all_rows, logits.data(), &sink));
  const TapMap& mine = split != nullptr ? split_ref : ref;
  const int64_t R = split != nullptr ? split->local().num_tokens() : T;
  for (int l = 0; l < model.num_layers(); ++l) {
    if (model.has_attn_res()) {
      DZ_RETURN_IF_ERROR(
          compare_tap(sink.taps(), mine, l, "attn_mix", {R, d}, "layer", kLayerRelRms, rows));
      DZ_RETURN_IF_ERROR(
          compare_tap(sink.taps(), mine, l, "ffn_mix", {R, d}, "layer", kLayerRelRms, rows));
    }
    DZ_RETURN_IF_ERROR(
        compare_tap(sink.taps(), mine, l, "layer_out", {R, d}, "layer", kLayerRelRms, rows));
  }
  if (model.has_attn_res())
    DZ_RETURN_IF_ERROR(
        compare_tap(sink.taps(), mine, -1, "final_mix", {R, d}, "layer", kLayerRelRms, rows));

  DZ_ASSIGN_OR_RETURN(const TapArray* ref_logits, need(ref, -1, "logits", {T, V}, "reference"));
  std::vector<double> rel(static_cast<size_t>(T));
  int64_t agree = 0;
  for (int64_t t = 0; t < T; ++t) {
    const float* a = logits.data() + t * V;
    const float* b = ref_logits->data.data() + t * V;
    rel[static_cast<size_t>(t)] = rel_rms(a, b, V);
    agree += (std::max_element(a, a + V) - a) == (std::max_element(b, b + V) - b);
  }
  std::sort(rel.begin(), rel.end());
  const double median =
      T % 2 == 1 ? rel[static_cast<size_t>(T / 2)]
                 : 0.5 * (rel[static_cast<size_t>(T / 2 - 1)] + rel[static_cast<size_t>(T / 2)]);
  rows.push_back(below("model", -1, "logits", "median_rel_l2", median, kLogitsMedianRelL2));
  const double agreement = static_cast<double>(agree) / static_cast<double>(T);
  rows.push_back(VerifyRow{"model", -1, "logits", "argmax_agree", agreement, kArgmaxAgreement, true,
                           agreement >= kArgmaxAgreement});
  return rows;
}

std::vector<VerifyRow> worst_over_ranks(dist::Comm& comm, std::vector<VerifyRow> rows) {
  const int ranks = comm.size();
  const auto n = static_cast<int64_t>(rows.size());
  std::vector<int64_t> sizes(static_cast<size_t>(ranks));
  comm.all_gather(std::as_bytes(std::span(&n, 1)), std::as_writable_bytes(std::span(sizes)),
                  std::vector<int64_t>(static_cast<size_t>(ranks), 8), dist::WireType::kU8, -1);
  for (int64_t size : sizes)
    DZ_CHECK(size == n, "verify: the ranks made {} and {} comparisons", size, n);
  struct Verdict {
    double value;
    double pass;  // 1 or 0
  };
  std::vector<Verdict> mine;
  for (const VerifyRow& row : rows) mine.push_back({row.value, row.pass ? 1.0 : 0.0});
  std::vector<Verdict> all(mine.size() * static_cast<size_t>(ranks));
  comm.all_gather(std::as_bytes(std::span(mine)), std::as_writable_bytes(std::span(all)),
                  std::vector<int64_t>(static_cast<size_t>(ranks), n * int64_t{sizeof(Verdict)}),
                  dist::WireType::kU8, -1);
  for (int64_t i = 0; i < n; ++i) {
    VerifyRow& row = rows[static_cast<size_t>(i)];
    for (int r = 0; r < ranks; ++r) {
      const Verdict& theirs = all[static_cast<size_t>(r * n + i)];
      row.value =
          row.at_least ? std::min(row.value, theirs.value) : std::max(row.value, theirs.value);
      row.pass = row.pass && theirs.pass != 0.0;
    }
  }
  return rows;
}

Result<std::vector<VerifyRow>> verify_vision(const ExecContext& ctx, const VisionEncoder& vision,
                                             std::span<const ProcessedImage> images,
                                             const TapMap& ref, std::vector<float>& embeddings) {
  const MoonVit& tower = vision.tower();
  const int64_t d = tower.config().vt_hidden_size;
  std::vector<VisionSpan> spans;
  std::vector<float> pixels;
  int64_t n = 0;
  for (const ProcessedImage& image : images) {
    spans.push_back(
        {.first_patch = n, .grid_height = image.grid_height, .grid_width = image.grid_width});
    pixels.insert(pixels.end(), image.pixel_values.begin(), image.pixel_values.end());
    n += image.num_patches();
  }
  const int64_t tokens = n / 4;
  const int64_t patch = static_cast<int64_t>(pixels.size()) / std::max<int64_t>(n, 1);
  auto need = [&](const std::string& name, const Shape& shape) -> Result<const TapArray*> {
    auto it = ref.find({kVisionTapLayer, name});
    if (it == ref.end())
      return make_error(StatusCode::kInvalidArgument, "verify: the reference has no vision tap {}",
                        name);
    if (it->second.shape != shape)
      return make_error(StatusCode::kInvalidArgument,
                        "verify: the reference's vision tap {} is {}, the engine's {}: the two "
                        "preprocessed the images differently",
                        name, it->second.shape.to_string(), shape.to_string());
    return &it->second;
  };
  std::vector<VerifyRow> rows;
  // Preprocessing: the same integer and FP64 steps on both sides, so exactly equal.
  DZ_ASSIGN_OR_RETURN(const TapArray* ref_pixels, need("pixel_values", {n, patch}));
  int64_t differing = 0;
  for (size_t i = 0; i < pixels.size(); ++i) differing += pixels[i] != ref_pixels->data[i];
  rows.push_back(
      count_at_most("operator", -1, "vision pixels", "values_beyond_equal", differing, 0));
  // Each stage on the reference's input: BF16 activations, so kOperatorRelRms.
  auto compare = [&](const std::string& name, const std::vector<float>& ours,
                     const Shape& shape) -> Status {
    DZ_ASSIGN_OR_RETURN(const TapArray* want, need(name, shape));
    rows.push_back(below("operator", -1, "vision " + name, "rel_rms",
                         rel_rms(ours.data(), want->data.data(), shape.num_elems()),
                         kOperatorRelRms));
    return Status::ok_status();
  };
  DZ_RETURN_IF_ERROR(
      compare("patch_embed", tower.patch_embed(ctx, spans, ref_pixels->data.data()), {n, d}));
  std::string input = "patch_embed";
  MoonVitScratch scratch;
  for (int64_t b = 0; b < tower.num_blocks(); ++b) {
    DZ_ASSIGN_OR_RETURN(const TapArray* in, need(input, {n, d}));
    std::vector<float> x = in->data;
    tower.run_block(ctx, b, spans, x.data(), scratch);
    input = fmt::format("block{}_out", b);
    DZ_RETURN_IF_ERROR(compare(input, x, {n, d}));
  }
  DZ_ASSIGN_OR_RETURN(const TapArray* last, need(input, {n, d}));
  std::vector<float> normed = last->data;
  tower.final_norm(ctx, n, normed.data());
  DZ_RETURN_IF_ERROR(compare("final_norm", normed, {n, d}));
  DZ_ASSIGN_OR_RETURN(const TapArray* ref_final, need("final_norm", {n, d}));
  DZ_RETURN_IF_ERROR(
      compare("merged", tower.merge(spans, ref_final->data.data()), {tokens, 4 * d}));
  const int64_t hidden = tower.config().text_hidden_size;
  DZ_ASSIGN_OR_RETURN(const TapArray* ref_merged, need("merged", {tokens, 4 * d}));
  DZ_RETURN_IF_ERROR(compare("projector_out", tower.project(ctx, tokens, ref_merged->data.data()),
                             {tokens, hidden}));
  // The engine's whole encode, from its own pixels: layer level (errors accumulate over blocks).
  std::vector<const ProcessedImage*> list;
  for (const ProcessedImage& image : images) list.push_back(&image);
  embeddings = vision.encode(ctx, list);
  DZ_ASSIGN_OR_RETURN(const TapArray* ref_out, need("projector_out", {tokens, hidden}));
  rows.push_back(below("layer", -1, "vision embeds", "rel_rms",
                       rel_rms(embeddings.data(), ref_out->data.data(), tokens * hidden),
                       kLayerRelRms));
  return rows;
}

}  // namespace dz::model
