#include "dayzero/cache/block_pool.h"

#include <algorithm>
#include <limits>

#include "dayzero/core/check.h"

namespace dz::cache {

Result<BlockPool> BlockPool::create(int64_t num_blocks, int64_t block_size,
                                    int64_t reserve_blocks) {
  if (num_blocks < 2 || num_blocks >= std::numeric_limits<int32_t>::max())
    return make_error(StatusCode::kInvalidArgument,
                      "block pool: num_blocks {} out of [2, 2^31 - 1) (block 0 is null)",
                      num_blocks);
  if (block_size <= 0)
    return make_error(StatusCode::kInvalidArgument, "block pool: block_size {} must be positive",
                      block_size);
  if (reserve_blocks < 0 || reserve_blocks > num_blocks - 1)
    return make_error(StatusCode::kInvalidArgument,
                      "block pool: reserve of {} blocks out of [0, {}]", reserve_blocks,
                      num_blocks - 1);
  return BlockPool(num_blocks, block_size, reserve_blocks);
}

BlockPool::BlockPool(int64_t num_blocks, int64_t block_size, int64_t reserve_blocks)
    : blocks_(static_cast<size_t>(num_blocks)),
      head_(static_cast<int32_t>(num_blocks)),
      tail_(static_cast<int32_t>(num_blocks)),
      block_size_(block_size),
      reserve_blocks_(reserve_blocks) {
  // Ascending ids from the head, so a fresh pool hands out 1, 2, 3, ...
  for (int32_t id = 1; id < static_cast<int32_t>(num_blocks); ++id) push_back_free(id);
}

int64_t BlockPool::num_allocatable(bool for_running_decode) const {
  return for_running_decode ? num_free_ : std::max<int64_t>(num_free_ - reserve_blocks_, 0);
}

void BlockPool::push_back_free(int32_t block) {
  Block& b = blocks_[block];
  b.prev_free = tail_;
  b.next_free = sentinel();
  next(tail_) = block;
  tail_ = block;
  ++num_free_;
  if (b.hashed) ++num_cached_free_;
}

void BlockPool::unlink_free(int32_t block) {
  Block& b = blocks_[block];
  DZ_CHECK(b.prev_free >= 0 && b.next_free >= 0, "block {} is not in the free list", block);
  next(b.prev_free) = b.next_free;
  prev(b.next_free) = b.prev_free;
  b.prev_free = b.next_free = -1;
  --num_free_;
  if (b.hashed) --num_cached_free_;
}

void BlockPool::evict(int32_t block) {
  Block& b = blocks_[block];
  if (!b.hashed) return;
  const BlockHash hash = b.hash;
  index_.erase(hash);
  b.hashed = false;
  b.hash = {};
  b.token_ids.clear();
  if (eviction_listener_) eviction_listener_(hash);
}

void BlockPool::check_block_id(int32_t block) const {
  DZ_CHECK(block > kNullBlock && block < static_cast<int32_t>(blocks_.size()),
           "block id {} out of [1, {})", block, blocks_.size());
}

void BlockPool::take_reference(int32_t block) {
  check_block_id(block);
  Block& b = blocks_[block];
  if (b.ref_cnt == 0) unlink_free(block);
  ++b.ref_cnt;
}

namespace {

Status check_allocatable(int64_t n, int64_t allocatable, int64_t num_free, int64_t reserve,
                         bool for_running_decode) {
  DZ_CHECK(n >= 0, "allocate({})", n);
  if (n > allocatable)
    return make_error(StatusCode::kResourceExhausted,
                      "block pool: {} blocks wanted, {} allocatable ({} free, reserve {}{})", n,
                      allocatable, num_free, reserve,
                      for_running_decode ? " open to decodes" : " kept");
  return Status::ok_status();
}

}  // namespace

void BlockPool::take_free(int32_t block) {
  unlink_free(block);
  // Drop the hash before the listener runs, so the pool is consistent when it is called.
  evict(block);
  blocks_[block].ref_cnt = 1;
}

int32_t BlockPool::free_block_near_head(int64_t wanted) const {
  int32_t block = head_;
  for (int scanned = 0; block != sentinel() && scanned < kShardScan;
       block = blocks_[block].next_free, ++scanned)
    if (block % shard_count_ == wanted % shard_count_) return block;
  return head_;
}

Result<std::vector<int32_t>> BlockPool::allocate(int64_t n, bool for_running_decode) {
  DZ_RETURN_IF_ERROR(check_allocatable(n, num_allocatable(for_running_decode), num_free_,
                                       reserve_blocks_, for_running_decode));
  std::vector<int32_t> blocks;
  blocks.reserve(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    blocks.push_back(head_);
    take_free(head_);
  }
  return blocks;
}

Status BlockPool::append_blocks(std::vector<int32_t>& table, int64_t n, bool for_running_decode) {
  DZ_RETURN_IF_ERROR(check_allocatable(n, num_allocatable(for_running_decode), num_free_,
                                       reserve_blocks_, for_running_decode));
  for (int64_t i = 0; i < n; ++i) {
    const int32_t block =
        shard_count_ > 1 ? free_block_near_head(static_cast<int64_t>(table.size())) : head_;
    take_free(block);
    table.push_back(block);
  }
  return Status::ok_status();
}

void BlockPool::set_shard_count(int count) {
  DZ_CHECK(count >= 1, "block pool: shard count {}", count);
  shard_count_ = count;
}

void BlockPool::free(std::span<const int32_t> table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int32_t block = *it;
    check_block_id(block);
    Block& b = blocks_[block];
    DZ_CHECK(b.ref_cnt > 0, "double free of block {}", block);
    if (--b.ref_cnt == 0) push_back_free(block);
  }
}

void BlockPool::fork(std::span<const int32_t> table) {
  for (const int32_t block : table) {
    check_block_id(block);
    DZ_CHECK(blocks_[block].ref_cnt > 0, "fork of block {}, which no table holds", block);
    ++blocks_[block].ref_cnt;
  }
}

bool BlockPool::register_full_block(std::span<const int32_t> table, int64_t index,
                                    const BlockHash& hash, std::span<const int32_t> token_ids) {
  DZ_CHECK(index >= 0 && index < static_cast<int64_t>(table.size()),
           "register entry {} of a table of {}", index, table.size());
  const int32_t block = table[static_cast<size_t>(index)];
  check_block_id(block);
  Block& b = blocks_[block];
  DZ_CHECK(b.ref_cnt > 0, "register of free block {}", block);
  DZ_CHECK(static_cast<int64_t>(token_ids.size()) == block_size_,
           "register of block {} with {} token ids, want {}", block, token_ids.size(), block_size_);
  if (b.hashed) {
    DZ_CHECK(b.hash == hash, "block {} registered again under another hash", block);
    return true;
  }
  if (index_.contains(hash)) return false;
  b.hashed = true;
  b.hash = hash;
  b.token_ids.assign(token_ids.begin(), token_ids.end());
  index_.emplace(hash, block);
  return true;
}

std::vector<int32_t> BlockPool::match_prefix(std::span<const BlockHash> hashes,
                                             std::span<const int32_t> tokens) const {
  std::vector<int32_t> hits;
  const size_t num_full = tokens.size() / static_cast<size_t>(block_size_);
  const size_t limit = std::min(hashes.size(), num_full);
  for (size_t j = 0; j < limit; ++j) {
    const auto it = index_.find(hashes[j]);
    if (it == index_.end()) break;
    const Block& b = blocks_[it->second];
    const std::span<const int32_t> want =
        tokens.subspan(j * static_cast<size_t>(block_size_), static_cast<size_t>(block_size_));
    if (!std::equal(want.begin(), want.end(), b.token_ids.begin(), b.token_ids.end())) break;
    hits.push_back(it->second);
  }
  return hits;
}

void BlockPool::touch(std::span<const int32_t> blocks) {
  for (const int32_t block : blocks) take_reference(block);
}

int64_t BlockPool::evict_free_cached() {
  int64_t count = 0;
  for (int32_t block = head_; block != sentinel(); block = blocks_[block].next_free) {
    if (!blocks_[block].hashed) continue;
    evict(block);
    --num_cached_free_;
    ++count;
  }
  return count;
}

int32_t BlockPool::ref_count(int32_t block) const {
  DZ_CHECK(block >= 0 && block < static_cast<int32_t>(blocks_.size()), "block id {} out of [0, {})",
           block, blocks_.size());
  return blocks_[block].ref_cnt;
}

std::optional<BlockHash> BlockPool::hash_of(int32_t block) const {
  DZ_CHECK(block >= 0 && block < static_cast<int32_t>(blocks_.size()), "block id {} out of [0, {})",
           block, blocks_.size());
  if (!blocks_[block].hashed) return std::nullopt;
  return blocks_[block].hash;
}

BlockPoolMetrics BlockPool::metrics() const {
  BlockPoolMetrics m;
  m.num_blocks = num_blocks();
  m.free = num_free_;
  m.used = num_blocks() - 1 - num_free_;
  m.cached = num_cached_free_;
  m.allocatable = num_allocatable(false);
  m.reserve = reserve_blocks_;
  return m;
}

Status BlockPool::check_invariants(std::span<const std::vector<int32_t>> all_tables) const {
  const auto n = static_cast<int32_t>(blocks_.size());
  std::vector<int32_t> owners(blocks_.size(), 0);
  for (size_t t = 0; t < all_tables.size(); ++t)
    for (const int32_t block : all_tables[t]) {
      if (block == kNullBlock)
        return make_error(StatusCode::kInternal, "table {} holds the null block 0", t);
      if (block < 0 || block >= n)
        return make_error(StatusCode::kInternal, "table {} holds block id {} out of [1, {})", t,
                          block, n);
      ++owners[static_cast<size_t>(block)];
    }
  if (blocks_[0].ref_cnt != 0 || blocks_[0].prev_free != -1 || blocks_[0].hashed)
    return make_error(StatusCode::kInternal, "null block 0 is owned, free-listed or hashed");
  int64_t zero_ref = 0, hashed_free = 0, hashed = 0;
  for (int32_t id = 1; id < n; ++id) {
    const Block& b = blocks_[id];
    if (b.ref_cnt != owners[static_cast<size_t>(id)])
      return make_error(StatusCode::kInternal, "block {} has ref_cnt {} but {} owning tables", id,
                        b.ref_cnt, owners[static_cast<size_t>(id)]);
    if (b.ref_cnt == 0) ++zero_ref;
    if (b.ref_cnt > 0 && (b.prev_free != -1 || b.next_free != -1))
      return make_error(StatusCode::kInternal, "block {} is held ({}) yet linked in the free list",
                        id, b.ref_cnt);
    if (!b.hashed) continue;
    ++hashed;
    if (b.ref_cnt == 0) ++hashed_free;
    const auto it = index_.find(b.hash);
    if (it == index_.end() || it->second != id)
      return make_error(StatusCode::kInternal, "hashed block {} is not indexed under its hash", id);
    if (static_cast<int64_t>(b.token_ids.size()) != block_size_)
      return make_error(StatusCode::kInternal, "hashed block {} keeps {} token ids, want {}", id,
                        b.token_ids.size(), block_size_);
  }
  if (static_cast<int64_t>(index_.size()) != hashed)
    return make_error(StatusCode::kInternal, "hash index has {} entries for {} hashed blocks",
                      index_.size(), hashed);
  // Walk the free list: each block once, ref_cnt 0, links consistent both ways.
  std::vector<bool> seen(blocks_.size(), false);
  int64_t listed = 0;
  int32_t previous = n;  // the sentinel
  for (int32_t block = head_; block != n; block = blocks_[block].next_free) {
    if (block <= kNullBlock || block > n)
      return make_error(StatusCode::kInternal, "free list links to block id {}", block);
    if (seen[static_cast<size_t>(block)])
      return make_error(StatusCode::kInternal, "block {} is in the free list twice", block);
    seen[static_cast<size_t>(block)] = true;
    const Block& b = blocks_[block];
    if (b.ref_cnt != 0)
      return make_error(StatusCode::kInternal, "free list holds block {} with ref_cnt {}", block,
                        b.ref_cnt);
    if (b.prev_free != previous)
      return make_error(StatusCode::kInternal, "block {} links back to {}, not {}", block,
                        b.prev_free, previous);
    previous = block;
    ++listed;
  }
  if (tail_ != previous)
    return make_error(StatusCode::kInternal, "free-list tail is {}, the walk ends at {}", tail_,
                      previous);
  if (listed != zero_ref)
    return make_error(StatusCode::kInternal, "free list holds {} blocks, {} have ref_cnt 0", listed,
                      zero_ref);
  if (listed != num_free_ || hashed_free != num_cached_free_)
    return make_error(StatusCode::kInternal,
                      "counters: {} free and {} cached counted, {} and {} found", num_free_,
                      num_cached_free_, listed, hashed_free);
  return Status::ok_status();
}

}  // namespace dz::cache
