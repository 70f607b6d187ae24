#include "dayzero/model/step_broadcast.h"

#include <algorithm>
#include <bit>
#include <csignal>
#include <numeric>
#include <optional>

#include <spdlog/spdlog.h>

#include "dayzero/core/check.h"

namespace dz::model {

namespace {

// One message, as int64 numbers: kind, the cache (id, blocks, block size, state slots), the cache
// edits since the last message (kind, from, to, rows each), then for a forward the batch: token
// count, sequence count, logits row count, block size, the token ids, positions and slots, per
// sequence (token_begin, num_tokens, pos_begin, state_slot, snapshot count, snapshot slots, table
// length, table), the rows, the data-parallel group of each sequence (--ep > 1), then the given
// embeddings (images): their count and each one's token and row.
enum StepKind : int64_t { kForward, kForwardMtp, kForwardMtpChain, kCache, kStop };

// The model call of a forward kind (a chain's logits rows are all its tokens, in order).
Status run_forward(CausalLm& model, int64_t kind, const ExecContext& ctx, const ForwardBatch& batch,
                   KvCache& cache, std::span<const int64_t> rows, float* out_logits,
                   TapSink* taps) {
  switch (kind) {
    case kForwardMtp:
      return model.forward_mtp(ctx, batch, cache, rows, out_logits, taps);
    case kForwardMtpChain:
      return model.forward_mtp_chain(ctx, batch, cache, out_logits, taps);
    default:
      return model.forward(ctx, batch, cache, rows, out_logits, taps);
  }
}

enum class Edit : int64_t { kBlockRows, kStateSlot };
constexpr int64_t kNumbersPerEdit = 4;

// The cache edits of a step message, in order.
void apply_edits(CausalLm& model, KvCache& cache, std::span<const int64_t> edits) {
  for (size_t e = 0; e + kNumbersPerEdit <= edits.size(); e += kNumbersPerEdit) {
    const auto from = static_cast<int32_t>(edits[e + 1]);
    const auto to = static_cast<int32_t>(edits[e + 2]);
    if (edits[e] == static_cast<int64_t>(Edit::kBlockRows)) {
      model.copy_block_rows(cache, from, to, edits[e + 3]);
    } else {
      model.copy_state_slot(cache, from, to);
    }
  }
}

void broadcast_message(dist::Comm& comm, std::vector<int64_t>& message, dist::Comm::Wait wait) {
  auto size = static_cast<int64_t>(message.size());
  comm.broadcast(std::as_writable_bytes(std::span(&size, 1)), 0, dist::kStepLayer, wait);
  message.resize(static_cast<size_t>(size));
  comm.broadcast(std::as_writable_bytes(std::span(message)), 0, dist::kStepLayer);
}

// A given embedding's row, two FP32 values to a number (the rows of an image are most of a step
// message that has one).
void append_given(std::vector<int64_t>& message, std::span<const GivenEmbedding> given,
                  int64_t hidden) {
  message.push_back(static_cast<int64_t>(given.size()));
  for (const GivenEmbedding& g : given) {
    message.push_back(g.token);
    for (int64_t i = 0; i < hidden; i += 2) {
      const uint64_t lo = std::bit_cast<uint32_t>(g.row[i]);
      const uint64_t hi = i + 1 < hidden ? std::bit_cast<uint32_t>(g.row[i + 1]) : 0u;
      message.push_back(static_cast<int64_t>(hi << 32 | lo));
    }
  }
}

// Reads a message front to back; a short message is a broken protocol, not bad input.
class Reader {
 public:
  explicit Reader(const std::vector<int64_t>& message) : message_(message) {}
  int64_t next() {
    DZ_CHECK(at_ < message_.size(), "step message ends early at {}", at_);
    return message_[at_++];
  }
  template <typename T>
  void read(std::vector<T>& out, int64_t count) {
    DZ_CHECK(count >= 0 && at_ + static_cast<size_t>(count) <= message_.size(),
             "step message: {} numbers past {}", count, at_);
    out.resize(static_cast<size_t>(count));
    for (T& value : out) value = static_cast<T>(message_[at_++]);
  }
  // The given embeddings of append_given: rows into `rows`, entries pointing at them.
  void read_given(int64_t hidden, std::vector<float>& rows, std::vector<GivenEmbedding>& given) {
    const int64_t count = next();
    rows.resize(static_cast<size_t>(std::max<int64_t>(count, 0) * hidden));
    given.clear();
    for (int64_t g = 0; g < count; ++g) {
      const int64_t token = next();
      float* row = rows.data() + g * hidden;
      for (int64_t i = 0; i < hidden; i += 2) {
        const auto bits = static_cast<uint64_t>(next());
        row[i] = std::bit_cast<float>(static_cast<uint32_t>(bits));
        if (i + 1 < hidden) row[i + 1] = std::bit_cast<float>(static_cast<uint32_t>(bits >> 32));
      }
      given.push_back({.token = token, .row = row});
    }
  }

 private:
  const std::vector<int64_t>& message_;
  size_t at_ = 0;
};

// What a following rank keeps between steps.
struct Follower {
  std::vector<LayerCacheSpec> layers;
  std::optional<KvCache> cache;
  uint64_t leader_cache_id = 0;
  std::vector<int32_t> token_ids, positions;
  std::vector<int64_t> slots, rows, groups;
  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<int32_t>> snapshots;
  std::vector<float> logits;
  std::vector<float> given_rows;
  std::vector<GivenEmbedding> given;

  // The cache rank 0 names, created (and the previous one dropped) when it names a new one.
  KvCache& cache_for(uint64_t id, int64_t num_blocks, int64_t block_size, int64_t state_slots,
                     BlockShard shard) {
    if (!cache || id != leader_cache_id) {
      cache.reset();
      Result<KvCache> created = KvCache::create(layers, num_blocks, block_size, state_slots, shard);
      DZ_CHECK(created.ok(), "rank 0's cache geometry does not fit this rank: {}",
               created.status().to_string());
      cache = std::move(created).value();
      leader_cache_id = id;
    }
    return *cache;
  }
};

// What keeps a sequence in one data-parallel group: its first cache block (sequences that share
// cached data share it), else its state slot; none for a model without either.
std::optional<int64_t> group_key(const SequenceSlice& seq) {
  if (!seq.block_table.empty()) return seq.block_table[0];
  if (seq.state_slot >= 0) return -2 - int64_t{seq.state_slot};
  return std::nullopt;
}

// The part of a step one data-parallel group runs (--ep > 1): its sequences, their tokens
// renumbered from 0, the logits rows among them; and the group of every row of the step.
struct GroupStep {
  std::vector<int32_t> token_ids, positions;
  std::vector<int64_t> slots, rows, row_groups;
  std::vector<GivenEmbedding> given;
  ForwardBatch batch;  // spans into the vectors above

  GroupStep(const ForwardBatch& full, std::span<const int64_t> all_rows,
            std::span<const int64_t> groups, int64_t group) {
    std::vector<int64_t> token_group(static_cast<size_t>(full.num_tokens()));
    std::vector<int64_t> renumbered(token_group.size(), -1);
    batch.block_size = full.block_size;
    for (size_t i = 0; i < full.sequences.size(); ++i) {
      SequenceSlice seq = full.sequences[i];
      for (int64_t t = seq.token_begin; t < seq.token_begin + seq.num_tokens; ++t)
        token_group[static_cast<size_t>(t)] = groups[i];
      if (groups[i] != group) continue;
      const auto first = static_cast<size_t>(seq.token_begin);
      const auto count = static_cast<size_t>(seq.num_tokens);
      seq.token_begin = static_cast<int64_t>(token_ids.size());
      for (size_t t = first; t < first + count; ++t) {
        renumbered[t] = static_cast<int64_t>(token_ids.size());
        token_ids.push_back(full.token_ids[t]);
        positions.push_back(full.positions[t]);
        slots.push_back(full.slot_mapping[t]);
      }
      batch.sequences.push_back(seq);
    }
    for (int64_t row : all_rows) {
      row_groups.push_back(token_group[static_cast<size_t>(row)]);
      if (row_groups.back() == group) rows.push_back(renumbered[static_cast<size_t>(row)]);
    }
    for (const GivenEmbedding& g : full.given_embeddings) {
      const int64_t token = renumbered[static_cast<size_t>(g.token)];
      if (token >= 0) given.push_back({.token = token, .row = g.row});
    }
    batch.token_ids = token_ids;
    batch.positions = positions;
    batch.slot_mapping = slots;
    batch.given_embeddings = given;
  }
};

// Rank 0 receives each group's logits rows from the group's first rank, and puts them back in
// the step's row order in out_logits (rank 0 only).
void gather_group_logits(dist::Comm& comm, const ParallelPlan& plan,
                         std::span<const int64_t> row_groups, int64_t vocab, const float* mine,
                         float* out_logits) {
  std::vector<int64_t> rows_of(static_cast<size_t>(plan.ep), 0);
  for (int64_t g : row_groups) ++rows_of[static_cast<size_t>(g)];
  std::vector<int64_t> counts(static_cast<size_t>(comm.size()), 0);
  for (int r = 0; r < comm.size(); ++r)
    if (plan.tp_rank(r) == 0) counts[static_cast<size_t>(r)] = rows_of[plan.ep_rank(r)] * vocab;
  const int64_t sent = counts[static_cast<size_t>(comm.rank())];
  std::vector<float> all(comm.rank() == 0 ? row_groups.size() * static_cast<size_t>(vocab) : 0);
  comm.gather(std::as_bytes(std::span(mine, static_cast<size_t>(sent))),
              std::as_writable_bytes(std::span(all)), counts, dist::WireType::kF32, 0,
              dist::kStepLayer);
  if (comm.rank() != 0) return;
  // Group g's rows arrive after those of groups before it (its first rank is g · tp).
  std::vector<int64_t> next(rows_of.size(), 0);
  std::exclusive_scan(rows_of.begin(), rows_of.end(), next.begin(), int64_t{0});
  for (size_t i = 0; i < row_groups.size(); ++i) {
    const int64_t from = next[static_cast<size_t>(row_groups[i])]++;
    std::copy_n(all.data() + from * vocab, vocab, out_logits + static_cast<int64_t>(i) * vocab);
  }
}

// One step of a data-parallel plan on any rank: this rank's group's part, then the logits to
// rank 0 (also after a failed forward, so that no rank waits for another).
Status run_group_step(CausalLm& model, dist::Comm& comm, const ParallelPlan& plan,
                      const ExecContext& ctx, int64_t kind, const ForwardBatch& batch,
                      KvCache& cache, std::span<const int64_t> rows,
                      std::span<const int64_t> groups, float* out_logits, TapSink* taps) {
  const GroupStep step(batch, rows, groups, plan.ep_rank(comm.rank()));
  const int64_t vocab = model.vocab_size();
  std::vector<float> mine(step.rows.size() * static_cast<size_t>(vocab));
  const Status status =
      run_forward(model, kind, ctx, step.batch, cache, step.rows, mine.data(), taps);
  gather_group_logits(comm, plan, step.row_groups, vocab, mine.data(), out_logits);
  return status;
}

// Logits rows every group can pick from the step's tokens.
Status check_rows(const ForwardBatch& batch, std::span<const int64_t> rows) {
  for (int64_t row : rows)
    if (row < 0 || row >= batch.num_tokens())
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, batch.num_tokens());
  return Status::ok_status();
}

}  // namespace

StepLeader::StepLeader(std::unique_ptr<CausalLm> model, dist::Comm& comm, const ParallelPlan& plan)
    : model_(std::move(model)), comm_(comm), plan_(plan) {
  DZ_CHECK(comm_.rank() == 0, "StepLeader runs on rank 0, not {}", comm_.rank());
  DZ_CHECK(comm_.size() == plan_.world_size(), "plan {} on {} ranks", plan_.describe(),
           comm_.size());
}

std::vector<int64_t> StepLeader::assign_groups(const ForwardBatch& batch, const KvCache& cache) {
  if (cache.id() != groups_cache_id_) {
    group_of_.clear();
    groups_cache_id_ = cache.id();
    next_group_ = 0;
  }
  // Sequences seen before keep their group; they are the groups' load in this step (continuous
  // batching puts every running sequence in most steps).
  const size_t num_seqs = batch.sequences.size();
  std::vector<int64_t> groups(num_seqs, -1);
  std::vector<int64_t> load(static_cast<size_t>(plan_.ep), 0);
  for (size_t i = 0; i < num_seqs; ++i) {
    const std::optional<int64_t> key = group_key(batch.sequences[i]);
    if (!key) continue;
    if (const auto known = group_of_.find(*key); known != group_of_.end()) {
      groups[i] = known->second;
      ++load[static_cast<size_t>(groups[i])];
    }
  }
  // A new one goes to the least loaded group, ties taken in turn (a sequence sharing the first
  // block of one placed just before joins it).
  for (size_t i = 0; i < num_seqs; ++i) {
    if (groups[i] >= 0) continue;
    const std::optional<int64_t> key = group_key(batch.sequences[i]);
    if (const auto known = key ? group_of_.find(*key) : group_of_.end(); known != group_of_.end()) {
      groups[i] = known->second;
    } else {
      int64_t best = next_group_;
      for (int64_t step = 1; step < plan_.ep; ++step) {
        const int64_t g = (next_group_ + step) % plan_.ep;
        if (load[static_cast<size_t>(g)] < load[static_cast<size_t>(best)]) best = g;
      }
      groups[i] = best;
      next_group_ = (best + 1) % plan_.ep;
      if (key) group_of_[*key] = best;
    }
    ++load[static_cast<size_t>(groups[i])];
  }
  return groups;
}

StepLeader::~StepLeader() {
  send(kStop, nullptr, nullptr, {});
}

void StepLeader::send(int64_t kind, const KvCache* cache, const ForwardBatch* batch,
                      std::span<const int64_t> logits_rows, std::span<const int64_t> groups) {
  message_.clear();
  message_.push_back(kind);
  if (cache != nullptr) {
    message_.insert(message_.end(), {static_cast<int64_t>(cache->id()), cache->num_blocks(),
                                     cache->block_size(), cache->num_state_slots()});
  } else {
    message_.insert(message_.end(), {0, 0, 0, 0});
  }
  message_.push_back(static_cast<int64_t>(pending_edits_.size()) / kNumbersPerEdit);
  message_.insert(message_.end(), pending_edits_.begin(), pending_edits_.end());
  if (batch != nullptr) {
    message_.insert(message_.end(),
                    {batch->num_tokens(), static_cast<int64_t>(batch->sequences.size()),
                     static_cast<int64_t>(logits_rows.size()), batch->block_size});
    message_.insert(message_.end(), batch->token_ids.begin(), batch->token_ids.end());
    message_.insert(message_.end(), batch->positions.begin(), batch->positions.end());
    message_.insert(message_.end(), batch->slot_mapping.begin(), batch->slot_mapping.end());
    for (const SequenceSlice& seq : batch->sequences) {
      message_.insert(message_.end(),
                      {seq.token_begin, seq.num_tokens, seq.pos_begin, seq.state_slot,
                       static_cast<int64_t>(seq.snapshot_slots.size())});
      message_.insert(message_.end(), seq.snapshot_slots.begin(), seq.snapshot_slots.end());
      message_.push_back(static_cast<int64_t>(seq.block_table.size()));
      message_.insert(message_.end(), seq.block_table.begin(), seq.block_table.end());
    }
    message_.insert(message_.end(), logits_rows.begin(), logits_rows.end());
    message_.insert(message_.end(), groups.begin(), groups.end());  // one per sequence at ep > 1
    append_given(message_, batch->given_embeddings, model_->hidden_size());
  }
  broadcast_message(comm_, message_, dist::Comm::Wait::kDeadline);
  // The other ranks make the edits now too.
  if (edited_cache_ != nullptr && kind != kStop)
    apply_edits(*model_, *edited_cache_, pending_edits_);
  pending_edits_.clear();
  edited_cache_ = nullptr;
}

Status StepLeader::forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                           std::span<const int64_t> logits_rows, float* out_logits, TapSink* taps) {
  return step(kForward, ctx, batch, cache, logits_rows, out_logits, taps);
}

Status StepLeader::forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                               std::span<const int64_t> logits_rows, float* out_logits,
                               TapSink* taps) {
  return step(kForwardMtp, ctx, batch, cache, logits_rows, out_logits, taps);
}

Status StepLeader::forward_mtp_chain(const ExecContext& ctx, const ForwardBatch& batch,
                                     KvCache& cache, float* out_logits, TapSink* taps) {
  std::vector<int64_t> rows(static_cast<size_t>(batch.num_tokens()));
  std::iota(rows.begin(), rows.end(), int64_t{0});
  return step(kForwardMtpChain, ctx, batch, cache, rows, out_logits, taps);
}

Status StepLeader::step(int64_t kind, const ExecContext& ctx, const ForwardBatch& batch,
                        KvCache& cache, std::span<const int64_t> logits_rows, float* out_logits,
                        TapSink* taps) {
  if (plan_.ep == 1) {
    send(kind, &cache, &batch, logits_rows);
    return run_forward(*model_, kind, ctx, batch, cache, logits_rows, out_logits, taps);
  }
  // Refused here, before any rank starts: a step refused by one group only would leave the
  // others waiting in its MoE exchanges.
  DZ_RETURN_IF_ERROR(model_->check_batch(batch, cache));
  DZ_RETURN_IF_ERROR(check_rows(batch, logits_rows));
  // An MTP batch's sequences keep the groups of the forward before it (the same first blocks).
  const std::vector<int64_t> groups = assign_groups(batch, cache);
  send(kind, &cache, &batch, logits_rows, groups);
  return run_group_step(*model_, comm_, plan_, ctx, kind, batch, cache, logits_rows, groups,
                        out_logits, taps);
}

void StepLeader::cache_created(KvCache& cache) {
  send(kCache, &cache, nullptr, {});
  comm_.barrier();  // every rank's cache is there (and paged in) before the first step is timed
}

void StepLeader::copy_block_rows(KvCache& cache, int32_t from_block, int32_t to_block,
                                 int64_t num_rows) {
  // A copied first block (a fork's partial prompt block) keeps its sequence's group.
  if (plan_.ep > 1 && cache.id() == groups_cache_id_) {
    if (const auto it = group_of_.find(from_block); it != group_of_.end())
      group_of_[to_block] = it->second;
  }
  add_edit(cache, static_cast<int64_t>(Edit::kBlockRows), from_block, to_block, num_rows);
}

void StepLeader::copy_state_slot(KvCache& cache, int32_t from, int32_t to) {
  add_edit(cache, static_cast<int64_t>(Edit::kStateSlot), from, to, 0);
}

void StepLeader::add_edit(KvCache& cache, int64_t kind, int32_t from, int32_t to, int64_t rows) {
  DZ_CHECK(edited_cache_ == nullptr || edited_cache_ == &cache,
           "cache edits of two caches between steps");
  edited_cache_ = &cache;
  pending_edits_.insert(pending_edits_.end(), {kind, from, to, rows});
}

void follow_steps(CausalLm& model, dist::Comm& comm, const ExecContext& ctx,
                  const ParallelPlan& plan) {
  DZ_CHECK(comm.rank() != 0, "rank 0 leads the steps, it does not follow them");
  // mpirun passes a signal to every rank; only rank 0 acts on it (a server drains, then stops
  // the others), so the followers must not die first.
  std::signal(SIGINT, SIG_IGN);
  std::signal(SIGTERM, SIG_IGN);
  Follower f;
  f.layers = model.cache_layers();
  std::vector<int64_t> message;
  for (;;) {
    broadcast_message(comm, message, dist::Comm::Wait::kForever);
    Reader in(message);
    const int64_t kind = in.next();
    if (kind == kStop) return;
    const auto cache_id = static_cast<uint64_t>(in.next());
    const int64_t num_blocks = in.next();
    const int64_t block_size = in.next();
    const int64_t state_slots = in.next();
    KvCache& cache =
        f.cache_for(cache_id, num_blocks, block_size, state_slots, model.cache_shard());
    const int64_t num_edits = in.next();
    std::vector<int64_t> edits;
    in.read(edits, num_edits * kNumbersPerEdit);
    apply_edits(model, cache, edits);
    if (kind == kCache) {
      comm.barrier();
      continue;
    }
    const int64_t num_tokens = in.next();
    const int64_t num_seqs = in.next();
    const int64_t num_rows = in.next();
    ForwardBatch batch;
    batch.block_size = in.next();
    in.read(f.token_ids, num_tokens);
    in.read(f.positions, num_tokens);
    in.read(f.slots, num_tokens);
    f.tables.resize(static_cast<size_t>(num_seqs));
    f.snapshots.resize(static_cast<size_t>(num_seqs));
    for (size_t i = 0; i < f.tables.size(); ++i) {
      SequenceSlice seq;
      seq.token_begin = in.next();
      seq.num_tokens = in.next();
      seq.pos_begin = in.next();
      seq.state_slot = static_cast<int32_t>(in.next());
      in.read(f.snapshots[i], in.next());
      seq.snapshot_slots = f.snapshots[i];
      in.read(f.tables[i], in.next());
      seq.block_table = f.tables[i];
      batch.sequences.push_back(seq);
    }
    in.read(f.rows, num_rows);
    if (plan.ep > 1) in.read(f.groups, num_seqs);
    in.read_given(model.hidden_size(), f.given_rows, f.given);
    batch.token_ids = f.token_ids;
    batch.positions = f.positions;
    batch.slot_mapping = f.slots;
    batch.given_embeddings = f.given;
    if (plan.ep > 1) {
      const Status status = run_group_step(model, comm, plan, ctx, kind, batch, cache, f.rows,
                                           f.groups, nullptr, nullptr);
      if (!status.ok()) spdlog::debug("rank {}: step failed: {}", comm.rank(), status.to_string());
      continue;
    }
    f.logits.resize(static_cast<size_t>(num_rows * model.vocab_size()));
    // Rank 0 reports a failed step; here it only must not stop following.
    const Status status =
        run_forward(model, kind, ctx, batch, cache, f.rows, f.logits.data(), nullptr);
    if (!status.ok()) spdlog::debug("rank {}: step failed: {}", comm.rank(), status.to_string());
  }
}

}  // namespace dz::model
