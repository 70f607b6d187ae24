#include "dayzero/model/step_broadcast.h"

#include <csignal>
#include <optional>

#include <spdlog/spdlog.h>

#include "dayzero/core/check.h"

namespace dz::model {

namespace {

// One message, as int64 numbers: kind, the cache (id, blocks, block size, state slots), the cache
// edits since the last message (kind, from, to, rows each), then for a forward the batch: token
// count, sequence count, logits row count, block size, the token ids, positions and slots, per
// sequence (token_begin, num_tokens, pos_begin, state_slot, table length, table), the rows.
enum StepKind : int64_t { kForward, kForwardMtp, kCache, kStop };

enum class Edit : int64_t { kBlockRows, kStateSlot };
constexpr int64_t kNumbersPerEdit = 4;

void broadcast_message(dist::Comm& comm, std::vector<int64_t>& message, dist::Comm::Wait wait) {
  auto size = static_cast<int64_t>(message.size());
  comm.broadcast(std::as_writable_bytes(std::span(&size, 1)), 0, dist::kStepLayer, wait);
  message.resize(static_cast<size_t>(size));
  comm.broadcast(std::as_writable_bytes(std::span(message)), 0, dist::kStepLayer);
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
  std::vector<int64_t> slots, rows;
  std::vector<std::vector<int32_t>> tables;
  std::vector<float> logits;

  // The cache rank 0 names, created (and the previous one dropped) when it names a new one.
  KvCache& cache_for(uint64_t id, int64_t num_blocks, int64_t block_size, int64_t state_slots) {
    if (!cache || id != leader_cache_id) {
      cache.reset();
      Result<KvCache> created = KvCache::create(layers, num_blocks, block_size, state_slots);
      DZ_CHECK(created.ok(), "rank 0's cache geometry does not fit this rank: {}",
               created.status().to_string());
      cache = std::move(created).value();
      leader_cache_id = id;
    }
    return *cache;
  }
};

}  // namespace

StepLeader::StepLeader(std::unique_ptr<CausalLm> model, dist::Comm& comm)
    : model_(std::move(model)), comm_(comm) {
  DZ_CHECK(comm_.rank() == 0, "StepLeader runs on rank 0, not {}", comm_.rank());
}

StepLeader::~StepLeader() {
  send(kStop, nullptr, nullptr, {});
}

void StepLeader::send(int64_t kind, const KvCache* cache, const ForwardBatch* batch,
                      std::span<const int64_t> logits_rows) {
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
  pending_edits_.clear();
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
                       static_cast<int64_t>(seq.block_table.size())});
      message_.insert(message_.end(), seq.block_table.begin(), seq.block_table.end());
    }
    message_.insert(message_.end(), logits_rows.begin(), logits_rows.end());
  }
  broadcast_message(comm_, message_, dist::Comm::Wait::kDeadline);
}

Status StepLeader::forward(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                           std::span<const int64_t> logits_rows, float* out_logits, TapSink* taps) {
  send(kForward, &cache, &batch, logits_rows);
  return model_->forward(ctx, batch, cache, logits_rows, out_logits, taps);
}

Status StepLeader::forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                               std::span<const int64_t> logits_rows, float* out_logits,
                               TapSink* taps) {
  send(kForwardMtp, &cache, &batch, logits_rows);
  return model_->forward_mtp(ctx, batch, cache, logits_rows, out_logits, taps);
}

void StepLeader::cache_created(KvCache& cache) {
  send(kCache, &cache, nullptr, {});
  comm_.barrier();  // every rank's cache is there (and paged in) before the first step is timed
}

void StepLeader::copy_block_rows(KvCache& cache, int32_t from_block, int32_t to_block,
                                 int64_t num_rows) {
  model_->copy_block_rows(cache, from_block, to_block, num_rows);
  pending_edits_.insert(pending_edits_.end(),
                        {static_cast<int64_t>(Edit::kBlockRows), from_block, to_block, num_rows});
}

void StepLeader::copy_state_slot(KvCache& cache, int32_t from, int32_t to) {
  model_->copy_state_slot(cache, from, to);
  pending_edits_.insert(pending_edits_.end(),
                        {static_cast<int64_t>(Edit::kStateSlot), from, to, 0});
}

void follow_steps(CausalLm& model, dist::Comm& comm, const ExecContext& ctx) {
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
    KvCache& cache = f.cache_for(cache_id, num_blocks, block_size, state_slots);
    const int64_t num_edits = in.next();
    for (int64_t e = 0; e < num_edits; ++e) {
      const int64_t edit = in.next();
      const auto from = static_cast<int32_t>(in.next());
      const auto to = static_cast<int32_t>(in.next());
      const int64_t rows = in.next();
      if (edit == static_cast<int64_t>(Edit::kBlockRows)) {
        model.copy_block_rows(cache, from, to, rows);
      } else {
        model.copy_state_slot(cache, from, to);
      }
    }
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
    for (auto& table : f.tables) {
      SequenceSlice seq;
      seq.token_begin = in.next();
      seq.num_tokens = in.next();
      seq.pos_begin = in.next();
      seq.state_slot = static_cast<int32_t>(in.next());
      in.read(table, in.next());
      seq.block_table = table;
      batch.sequences.push_back(seq);
    }
    in.read(f.rows, num_rows);
    batch.token_ids = f.token_ids;
    batch.positions = f.positions;
    batch.slot_mapping = f.slots;
    f.logits.resize(static_cast<size_t>(num_rows * model.vocab_size()));
    // Rank 0 reports a failed step; here it only must not stop following.
    const Status status =
        kind == kForward ? model.forward(ctx, batch, cache, f.rows, f.logits.data(), nullptr)
                         : model.forward_mtp(ctx, batch, cache, f.rows, f.logits.data(), nullptr);
    if (!status.ok()) spdlog::debug("rank {}: step failed: {}", comm.rank(), status.to_string());
  }
}

}  // namespace dz::model
