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

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, cache::CacheCoordinator& cache,
                     const EncoderCache* encoder_cache)
    : config_(config), cache_(cache), encoder_cache_(encoder_cache) {
  DZ_CHECK(config_.max_num_batched_tokens > 0 && config_.long_prefill_threshold > 0 &&
               config_.max_num_seqs > 0,
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

Request& Scheduler::add_fork(std::unique_ptr<Request> request, Request& parent) {
  Request* r = request.get();
  DZ_CHECK(!requests_.contains(r->id), "request {} added twice", r->id);
  DZ_CHECK(parent.status == RequestStatus::kWaiting && parent.num_preemptions == 0 &&
               parent.num_output_tokens() == 0 && parent.prompt().size() == r->prompt().size() &&
               std::equal(parent.tokens.begin(), parent.tokens.end(), r->tokens.begin()),
           "request {} cannot fork from request {}", r->id, parent.id);
  r->arrival_seq = next_arrival_seq_++;
  r->status = RequestStatus::kForkPending;
  r->fork_parent = &parent;
  parent.pending_forks.push_back(r);
  requests_.emplace(r->id, std::move(request));
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

void Scheduler::preempt(Request* r) {
  // Recompute: full blocks stay cached (ref_cnt 0), so re-admission usually hits them; output
  // tokens, sampler and text state are kept.
  remove_running(r);
  cache_.free(r->cache);
  r->draft_tokens.clear();
  r->num_computed_tokens = 0;
  r->status = RequestStatus::kWaiting;
  ++r->num_preemptions;
  ++counters_.num_preemptions;
  push_waiting(r);
}

void Scheduler::queue_pending_forks(Request& parent) {
  for (Request* child : parent.pending_forks) {
    child->fork_parent = nullptr;
    child->status = RequestStatus::kWaiting;
    push_waiting(child);
  }
  parent.pending_forks.clear();
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
  } else if (r->status == RequestStatus::kForkPending) {
    std::erase(r->fork_parent->pending_forks, r);
    r->fork_parent = nullptr;
  }
  queue_pending_forks(*r);
  cache_.free(r->cache);
  r->status = RequestStatus::kFinished;
  requests_.erase(it);
}

int64_t Scheduler::clip_chunk(const Request& r, int64_t from, int64_t n) const {
  n = std::min(n, config_.max_model_len - 1 - from);
  if (n > 1) n = std::min(n, config_.long_prefill_threshold);
  return cache_.clip_to_checkpoint(r.num_prompt_tokens, from, n);
}

int64_t Scheduler::clip_to_encoder_budget(const Request& r, int64_t from, int64_t n,
                                          EncoderBudget& budget) const {
  for (const PromptImage& image : r.images) {
    if (image.offset >= from + n) break;                    // not reached
    if (image.offset + image.num_tokens <= from) continue;  // computed
    if ((encoder_cache_ != nullptr && encoder_cache_->contains(image.hash)) ||
        std::find(budget.hashes.begin(), budget.hashes.end(), image.hash) != budget.hashes.end())
      continue;
    if (budget.tokens + image.num_tokens > config_.max_num_encoder_tokens)
      return std::max<int64_t>(0, image.offset - from);
    budget.tokens += image.num_tokens;
    budget.hashes.push_back(image.hash);
  }
  return n;
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  EncoderBudget encoder_budget;

  int64_t long_in_flight = 0;
  for (const Request* r : running_)
    if (r->num_uncomputed() > config_.long_prefill_threshold) ++long_in_flight;

  // Running requests first, in (priority, arrival) order; the tail is the preemption victim.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Request* r = running_[i];
    int64_t n = clip_chunk(*r, r->num_computed_tokens,
                           std::min(r->num_uncomputed() + r->num_drafts(), budget));
    if (!r->images.empty())
      n = clip_to_encoder_budget(*r, r->num_computed_tokens, n, encoder_budget);
    if (n <= 0) {
      ++i;
      continue;
    }
    // Past the prompt (decode, or recompute of output tokens) a request may take the reserve.
    const bool decode = r->num_computed_tokens >= r->num_prompt_tokens;
    bool preempted_self = false;
    const int64_t lookahead = config_.num_lookahead_slots;
    while (!cache_.allocate_slots(r->cache, r->num_computed_tokens + n + lookahead, decode)) {
      // A prefill chunk shrinks to the blocks there are before anyone is preempted.
      const int64_t fits =
          cache_.max_tokens_holdable(r->cache, decode) - r->num_computed_tokens - lookahead;
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
    // Drafts go last: a clipped chunk verifies fewer.
    r->draft_tokens.resize(static_cast<size_t>(std::max<int64_t>(0, n - r->num_uncomputed())));
    out.chunks.push_back({r, n});
    budget -= n;
    ++i;
  }

  // Drafts of running requests that got no chunk are dropped (proposed again next step).
  for (Request* r : running_)
    if (!r->draft_tokens.empty() &&
        std::none_of(out.chunks.begin(), out.chunks.end(),
                     [r](const ScheduledChunk& c) { return c.request == r; }))
      r->draft_tokens.clear();

  if (out.preempted_ids.empty()) {
    std::vector<Request*> skipped;
    while (!waiting_.empty() && budget > 0 &&
           static_cast<int64_t>(running_.size()) < config_.max_num_seqs) {
      Request* r = waiting_.front();
      const cache::CachedPrefix prefix = cache_.get_computed_blocks(r->cache, r->cache_tokens());
      const int64_t hit = prefix.num_tokens;
      const bool is_long = r->num_tokens() - hit > config_.long_prefill_threshold;
      if (is_long && long_in_flight >= config_.max_long_partial_prefills) {
        skipped.push_back(pop_waiting());  // short prompts pass it
        continue;
      }
      int64_t n = clip_chunk(*r, hit, std::min(r->num_tokens() - hit, budget));
      DZ_CHECK(n > 0, "request {}: empty first chunk", r->id);
      if (!r->images.empty()) {
        n = clip_to_encoder_budget(*r, hit, n, encoder_budget);
        if (n == 0) break;  // head of line: its image waits for the next step's encoder budget
      }
      // The reserve is kept unless nothing runs (then there is no decode to protect, and a long
      // resumed request could never re-enter).
      const bool use_reserve = running_.empty();
      if (!cache_.can_allocate(prefix, n + config_.num_lookahead_slots, use_reserve))
        break;  // head of line

      pop_waiting();
      if (cache_.prefix_caching()) {
        counters_.prefix_query_tokens += r->num_tokens();
        counters_.prefix_hit_tokens += hit;
      }
      if (r->num_preemptions == 0) counters_.prompt_tokens += r->num_prompt_tokens;
      cache_.allocate_prefix(r->cache, prefix, n + config_.num_lookahead_slots, use_reserve);
      r->num_computed_tokens = hit;
      r->num_cached_tokens = hit;
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

void Scheduler::advance(const SchedulerOutput& output) {
  for (const ScheduledChunk& c : output.chunks) {
    Request& r = *c.request;
    if (!r.draft_tokens.empty()) continue;  // commit_verified() after verification
    r.num_computed_tokens += c.num_tokens;
    DZ_CHECK(r.num_computed_tokens <= r.num_tokens(), "request {}: {} computed of {} tokens", r.id,
             r.num_computed_tokens, r.num_tokens());
    cache_.cache_full_blocks(r.cache, r.cache_tokens(), r.num_computed_tokens);
  }
}

void Scheduler::commit_verified(Request& r, int64_t num_computed_tokens,
                                const cache::StateSnapshots& snapshots) {
  DZ_CHECK(num_computed_tokens >= r.num_computed_tokens && num_computed_tokens <= r.num_tokens(),
           "request {}: commit of {} computed tokens (had {} of {})", r.id, num_computed_tokens,
           r.num_computed_tokens, r.num_tokens());
  r.draft_tokens.clear();
  r.num_computed_tokens = num_computed_tokens;
  cache_.trim(r.cache, r.num_tokens());
  cache_.cache_full_blocks(r.cache, r.cache_tokens(), r.num_computed_tokens, snapshots);
}

std::vector<Request*> Scheduler::fork_pending(Request& parent) {
  DZ_CHECK(parent.status == RequestStatus::kRunning && parent.num_output_tokens() == 0 &&
               parent.num_computed_tokens == parent.num_prompt_tokens,
           "request {}: fork before its prompt is computed", parent.id);
  std::vector<Request*> forked;
  std::vector<Request*> children = std::move(parent.pending_forks);
  parent.pending_forks.clear();
  for (Request* child : children) {
    child->fork_parent = nullptr;
    if (static_cast<int64_t>(running_.size()) < config_.max_num_seqs &&
        cache_.fork(parent.cache, parent.num_computed_tokens, child->cache)) {
      child->num_computed_tokens = parent.num_computed_tokens;
      child->num_cached_tokens = child->num_prompt_tokens;  // none of it computed for the child
      child->first_scheduled = parent.first_scheduled;
      counters_.prompt_tokens += child->num_prompt_tokens;
      insert_running(child);
      forked.push_back(child);
    } else {
      child->status = RequestStatus::kWaiting;
      push_waiting(child);
    }
  }
  return forked;
}

Status Scheduler::check_invariants() const {
  std::vector<const cache::SequenceCache*> caches;
  const int64_t block_size = cache_.block_size();
  for (const Request* r : running_) {
    caches.push_back(&r->cache);
    if (r->status != RequestStatus::kRunning)
      return make_error(StatusCode::kInternal, "running request {} has status {}", r->id,
                        static_cast<int>(r->status));
    const auto num_blocks = static_cast<int64_t>(r->cache.block_table.size());
    if (num_blocks * block_size < r->num_computed_tokens)
      return make_error(StatusCode::kInternal,
                        "request {}: {} blocks cannot hold its {} computed tokens", r->id,
                        num_blocks, r->num_computed_tokens);
  }
  size_t num_pending = 0;
  for (const auto& [id, r] : requests_) {
    if (r->status == RequestStatus::kRunning) continue;
    if (!r->cache.block_table.empty() || r->cache.state_slot >= 0 || r->num_computed_tokens != 0)
      return make_error(StatusCode::kInternal,
                        "waiting request {} holds {} blocks, slot {}, {} computed tokens", id,
                        r->cache.block_table.size(), r->cache.state_slot, r->num_computed_tokens);
    if (r->status == RequestStatus::kForkPending) {
      ++num_pending;
      if (r->fork_parent == nullptr ||
          std::count(r->fork_parent->pending_forks.begin(), r->fork_parent->pending_forks.end(),
                     r.get()) != 1)
        return make_error(StatusCode::kInternal, "request {} pends a fork of no parent", id);
    } else if (r->status != RequestStatus::kWaiting) {
      return make_error(StatusCode::kInternal, "request {} has status {}", id,
                        static_cast<int>(r->status));
    }
  }
  if (waiting_.size() + num_pending + running_.size() != requests_.size())
    return make_error(StatusCode::kInternal,
                      "{} waiting + {} pending + {} running requests, {} known", waiting_.size(),
                      num_pending, running_.size(), requests_.size());
  return cache_.check_invariants(caches);
}

}  // namespace dz::runtime
