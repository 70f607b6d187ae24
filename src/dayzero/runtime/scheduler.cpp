#include "dayzero/runtime/scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "dayzero/core/check.h"

namespace dz::runtime {

namespace {

// Heap order: std::push_heap keeps the greatest on top, so "greater" means runs later.
bool runs_later(const Request* a, const Request* b) {
  return std::pair(a->priority, a->arrival_seq) > std::pair(b->priority, b->arrival_seq);
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, cache::BlockPool& blocks, cache::StatePool* states,
                     cache::BlockHash seed, std::string cache_format)
    : config_(config),
      blocks_(blocks),
      states_(states),
      seed_(seed),
      cache_format_(std::move(cache_format)),
      // A hybrid model without checkpoint slots cannot hit safely (serving.md §1.7).
      prefix_caching_(config.enable_prefix_caching &&
                      (states == nullptr || states->max_checkpoints() > 0)),
      checkpoints_(prefix_caching_ && states != nullptr) {
  DZ_CHECK(config_.max_num_batched_tokens > 0 && config_.long_prefill_threshold > 0 &&
               config_.max_num_seqs > 0 && config_.state_checkpoint_interval > 0,
           "scheduler config not resolved");
}

Request& Scheduler::add(std::unique_ptr<Request> request) {
  Request* r = request.get();
  DZ_CHECK(!requests_.contains(r->id), "request {} added twice", r->id);
  r->arrival_seq = next_arrival_seq_++;
  r->status = RequestStatus::kWaiting;
  requests_.emplace(r->id, std::move(request));
  push_waiting(r);
  return *r;
}

Request* Scheduler::find(int64_t request_id) {
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : it->second.get();
}

const Request* Scheduler::find(int64_t request_id) const {
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::push_waiting(Request* r) {
  waiting_.push_back(r);
  std::push_heap(waiting_.begin(), waiting_.end(), runs_later);
}

Request* Scheduler::pop_waiting() {
  std::pop_heap(waiting_.begin(), waiting_.end(), runs_later);
  Request* r = waiting_.back();
  waiting_.pop_back();
  return r;
}

void Scheduler::insert_running(Request* r) {
  auto it = std::upper_bound(running_.begin(), running_.end(), r,
                             [](const Request* a, const Request* b) { return runs_later(b, a); });
  running_.insert(it, r);
  r->status = RequestStatus::kRunning;
}

void Scheduler::remove_running(Request* r) {
  auto it = std::find(running_.begin(), running_.end(), r);
  DZ_CHECK(it != running_.end(), "request {} is not running", r->id);
  running_.erase(it);
}

void Scheduler::release_resources(Request& r) {
  if (!r.block_table.empty()) blocks_.free(r.block_table);
  r.block_table.clear();
  r.num_registered_blocks = 0;
  if (r.state_slot >= 0) states_->release_live(r.state_slot);
  r.state_slot = -1;
}

void Scheduler::preempt(Request* r) {
  // Recompute: full blocks stay cached (ref_cnt 0), so re-admission usually hits them; output
  // tokens, sampler and text state are kept.
  remove_running(r);
  release_resources(*r);
  r->num_computed_tokens = 0;
  r->status = RequestStatus::kWaiting;
  ++r->num_preemptions;
  ++counters_.num_preemptions;
  push_waiting(r);
}

void Scheduler::finish(int64_t request_id) {
  auto it = requests_.find(request_id);
  DZ_CHECK(it != requests_.end(), "finish: unknown request {}", request_id);
  Request* r = it->second.get();
  if (r->status == RequestStatus::kRunning) {
    remove_running(r);
  } else if (r->status == RequestStatus::kWaiting) {
    auto w = std::find(waiting_.begin(), waiting_.end(), r);
    DZ_CHECK(w != waiting_.end(), "request {} is not waiting", r->id);
    waiting_.erase(w);
    std::make_heap(waiting_.begin(), waiting_.end(), runs_later);
  }
  release_resources(*r);
  r->status = RequestStatus::kFinished;
  requests_.erase(it);
}

void Scheduler::update_block_hashes(Request& r) {
  const int64_t block_size = blocks_.block_size();
  const int64_t num_full = r.num_tokens() / block_size;
  for (auto j = static_cast<int64_t>(r.block_hashes.size()); j < num_full; ++j) {
    const cache::BlockHash parent = j == 0 ? seed_ : r.block_hashes.back();
    const std::vector<std::byte> extra = cache::block_extra_keys(j, r.cache_salt, cache_format_);
    r.block_hashes.push_back(
        cache::hash_block(parent,
                          std::span<const int32_t>(r.tokens).subspan(
                              static_cast<size_t>(j * block_size), static_cast<size_t>(block_size)),
                          extra));
  }
}

int64_t Scheduler::next_checkpoint(const Request& r, int64_t from) const {
  if (!checkpoints_) return std::numeric_limits<int64_t>::max();
  const int64_t interval = config_.state_checkpoint_interval;
  int64_t next = (from / interval + 1) * interval;
  const int64_t block_size = blocks_.block_size();
  const int64_t last_prompt_boundary = r.num_prompt_tokens / block_size * block_size;
  if (last_prompt_boundary > from) next = std::min(next, last_prompt_boundary);
  return next;
}

int64_t Scheduler::clip_chunk(const Request& r, int64_t n) const {
  n = std::min(n, config_.max_model_len - 1 - r.num_computed_tokens);
  if (n > 1) n = std::min(n, config_.long_prefill_threshold);
  // A checkpoint is the live slot after a step, so a chunk must end exactly at its position.
  const int64_t checkpoint = next_checkpoint(r, r.num_computed_tokens);
  if (checkpoint < r.num_computed_tokens + n) n = checkpoint - r.num_computed_tokens;
  return n;
}

Scheduler::Admission Scheduler::find_prefix_hit(Request& r) {
  Admission admission;
  if (!prefix_caching_) return admission;
  update_block_hashes(r);
  const int64_t block_size = blocks_.block_size();
  // At least one token must run to give logits.
  const int64_t max_hit_blocks = (r.num_tokens() - 1) / block_size;
  std::span<const cache::BlockHash> chain =
      std::span<const cache::BlockHash>(r.block_hashes).first(static_cast<size_t>(max_hit_blocks));
  const std::vector<int32_t> kv_hit = blocks_.match_prefix(chain, r.tokens);
  if (states_ == nullptr) {
    admission.hit_blocks = static_cast<int64_t>(kv_hit.size());
    return admission;
  }
  // Hybrid: the deepest checkpoint within the KV hit, none = no hit (serving.md §1.7).
  const std::optional<size_t> deepest = states_->find_deepest(chain.first(kv_hit.size()));
  if (!deepest) return admission;
  admission.hit_blocks = static_cast<int64_t>(*deepest) + 1;
  admission.checkpoint = chain[*deepest];
  const std::optional<int64_t> position = states_->checkpoint_position(chain[*deepest]);
  DZ_CHECK(position && *position == admission.hit_blocks * block_size,
           "request {}: checkpoint of block {} at position {}, expected {}", r.id, *deepest,
           position.value_or(-1), admission.hit_blocks * block_size);
  return admission;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  const int64_t block_size = blocks_.block_size();
  int64_t budget = config_.max_num_batched_tokens;

  int64_t long_in_flight = 0;
  for (const Request* r : running_)
    if (r->num_uncomputed() > config_.long_prefill_threshold) ++long_in_flight;

  // Running requests first, in (priority, arrival) order; the tail is the preemption victim.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    int64_t n = clip_chunk(*r, std::min(r->num_uncomputed(), budget));
    if (n <= 0) {
      ++i;
      continue;
    }
    // Past the prompt (decode, or recompute of output tokens) a request may take the reserve.
    const bool decode = r->num_computed_tokens >= r->num_prompt_tokens;
    bool preempted_self = false;
    while (true) {
      const int64_t needed = ceil_div(r->num_computed_tokens + n, block_size) -
                             static_cast<int64_t>(r->block_table.size());
      if (needed <= 0 || blocks_.append_blocks(r->block_table, needed, decode).ok()) break;
      // A prefill chunk shrinks to the blocks there are before anyone is preempted.
      const int64_t available = blocks_.num_allocatable(decode);
      const int64_t fits = (static_cast<int64_t>(r->block_table.size()) + available) * block_size -
                           r->num_computed_tokens;
      if (fits > 0 && fits < n) {
        n = fits;
        continue;
      }
      Request* victim = running_.back();
      out.preempted_ids.push_back(victim->id);
      preempt(victim);
      if (victim == r) {
        preempted_self = true;
        break;
      }
    }
    if (preempted_self) continue;  // r was the tail: the loop ends
    out.chunks.push_back({r, n});
    budget -= n;
    ++i;
  }

  if (out.preempted_ids.empty()) {
    std::vector<Request*> skipped;
    while (!waiting_.empty() && budget > 0 &&
           static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
      Request* r = waiting_.front();
      const Admission admission = find_prefix_hit(*r);
      const int64_t hit = admission.hit_blocks * block_size;
      const bool is_long = r->num_tokens() - hit > config_.long_prefill_threshold;
      if (is_long && long_in_flight >= config_.max_long_partial_prefills) {
        skipped.push_back(pop_waiting());  // short prompts pass it
        continue;
      }
      r->num_computed_tokens = hit;
      const int64_t n = clip_chunk(*r, std::min(r->num_tokens() - hit, budget));
      r->num_computed_tokens = 0;
      DZ_CHECK(n > 0, "request {}: empty first chunk", r->id);
      // Hits on free cached blocks take free blocks too. The reserve is kept unless nothing runs
      // (then there is no decode to protect, and a long resumed request could never re-enter).
      std::span<const cache::BlockHash> hit_chain =
          std::span<const cache::BlockHash>(r->block_hashes)
              .first(static_cast<size_t>(admission.hit_blocks));
      int64_t needed = ceil_div(hit + n, block_size) - admission.hit_blocks;
      if (admission.hit_blocks > 0)
        for (const int32_t block : blocks_.match_prefix(hit_chain, r->tokens))
          if (blocks_.ref_count(block) == 0) ++needed;
      const bool use_reserve = running_.empty();
      if (needed > blocks_.num_allocatable(use_reserve)) break;  // head of line

      pop_waiting();
      if (prefix_caching_) {
        counters_.prefix_query_tokens += r->num_tokens();
        counters_.prefix_hit_tokens += hit;
      }
      if (r->num_preemptions == 0) counters_.prompt_tokens += r->num_prompt_tokens;
      r->block_table =
          admission.hit_blocks > 0 ? blocks_.lookup(hit_chain, r->tokens) : std::vector<int32_t>{};
      DZ_CHECK(static_cast<int64_t>(r->block_table.size()) == admission.hit_blocks,
               "request {}: lookup returned {} blocks, matched {}", r->id, r->block_table.size(),
               admission.hit_blocks);
      const Status grown = blocks_.append_blocks(
          r->block_table, ceil_div(hit + n, block_size) - admission.hit_blocks, use_reserve);
      DZ_CHECK(grown.ok(), "request {}: {}", r->id, grown.message());
      r->num_registered_blocks = admission.hit_blocks;
      r->num_computed_tokens = hit;
      r->num_cached_tokens = hit;
      if (states_ != nullptr) {
        Result<int32_t> slot = states_->acquire_live();
        DZ_CHECK(slot.ok(), "request {}: {}", r->id, slot.status().message());
        r->state_slot = *slot;
        if (admission.checkpoint) {
          const Status restored = states_->restore(*admission.checkpoint, r->state_slot);
          DZ_CHECK(restored.ok(), "request {}: {}", r->id, restored.message());
        }
      }
      insert_running(r);
      if (is_long) ++long_in_flight;
      out.admitted_ids.push_back(r->id);
      out.chunks.push_back({r, n});
      budget -= n;
    }
    for (Request* r : skipped) push_waiting(r);
  }

  for (const ScheduledChunk& c : out.chunks) out.num_scheduled_tokens += c.num_tokens;
  return out;
}

void Scheduler::save_checkpoints(Request& r) {
  const int64_t block_size = blocks_.block_size();
  const int64_t p = r.num_computed_tokens;
  if (p == 0 || p % block_size != 0) return;
  const int64_t last_prompt_boundary = r.num_prompt_tokens / block_size * block_size;
  const bool fixed = p % config_.state_checkpoint_interval == 0 || p == last_prompt_boundary;
  if (!fixed && p < last_prompt_boundary) return;
  const cache::BlockHash key = r.block_hashes[static_cast<size_t>(p / block_size - 1)];
  // A checkpoint is a cache entry: failing to save one (every slot pinned) only loses a hit.
  if (!states_->save_checkpoint(r.state_slot, key, p).ok()) return;
  // Past the prompt one rolling checkpoint follows the latest crossed boundary.
  if (r.rolling_checkpoint && !(*r.rolling_checkpoint == key))
    states_->release_checkpoint(*r.rolling_checkpoint);
  r.rolling_checkpoint.reset();
  if (!fixed) r.rolling_checkpoint = key;
}

void Scheduler::advance(const SchedulerOutput& output) {
  const int64_t block_size = blocks_.block_size();
  for (const ScheduledChunk& c : output.chunks) {
    Request& r = *c.request;
    r.num_computed_tokens += c.num_tokens;
    DZ_CHECK(r.num_computed_tokens <= r.num_tokens(), "request {}: {} computed of {} tokens", r.id,
             r.num_computed_tokens, r.num_tokens());
    if (!prefix_caching_) continue;
    update_block_hashes(r);
    const int64_t num_full = r.num_computed_tokens / block_size;
    for (int64_t j = r.num_registered_blocks; j < num_full; ++j) {
      blocks_.register_full_block(
          r.block_table, j, r.block_hashes[static_cast<size_t>(j)],
          std::span<const int32_t>(r.tokens).subspan(static_cast<size_t>(j * block_size),
                                                     static_cast<size_t>(block_size)));
    }
    r.num_registered_blocks = std::max(r.num_registered_blocks, num_full);
    if (checkpoints_) save_checkpoints(r);
  }
}

Status Scheduler::check_invariants() const {
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> slots;
  const int64_t block_size = blocks_.block_size();
  for (const Request* r : running_) {
    tables.push_back(r->block_table);
    if (r->status != RequestStatus::kRunning)
      return make_error(StatusCode::kInternal, "running request {} has status {}", r->id,
                        static_cast<int>(r->status));
    if (static_cast<int64_t>(r->block_table.size()) < ceil_div(r->num_computed_tokens, block_size))
      return make_error(StatusCode::kInternal,
                        "request {}: {} blocks cannot hold its {} computed tokens", r->id,
                        r->block_table.size(), r->num_computed_tokens);
    if ((states_ != nullptr) != (r->state_slot >= 0))
      return make_error(StatusCode::kInternal, "request {}: state slot {} on a model {}", r->id,
                        r->state_slot, states_ != nullptr ? "with recurrent state" : "without");
    if (r->state_slot >= 0) slots.push_back(r->state_slot);
  }
  for (const Request* r : waiting_) {
    if (!r->block_table.empty() || r->state_slot >= 0 || r->num_computed_tokens != 0 ||
        r->status != RequestStatus::kWaiting)
      return make_error(StatusCode::kInternal,
                        "waiting request {} holds {} blocks, slot {}, {} computed tokens", r->id,
                        r->block_table.size(), r->state_slot, r->num_computed_tokens);
  }
  if (waiting_.size() + running_.size() != requests_.size())
    return make_error(StatusCode::kInternal, "{} waiting + {} running requests, {} known",
                      waiting_.size(), running_.size(), requests_.size());
  DZ_RETURN_IF_ERROR(blocks_.check_invariants(tables));
  if (states_ != nullptr) DZ_RETURN_IF_ERROR(states_->check_invariants(slots));
  return Status::ok_status();
}

}  // namespace dz::runtime
