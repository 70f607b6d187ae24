#include "dayzero/runtime/encoder_cache.h"

namespace dz::runtime {

ImageEmbeddings EncoderCache::find(const cache::BlockHash& hash) {
  auto it = entries_.find(hash);
  if (it == entries_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return it->second->embeddings;
}

void EncoderCache::insert(const cache::BlockHash& hash, ImageEmbeddings embeddings) {
  if (auto it = entries_.find(hash); it != entries_.end()) {
    bytes_ -= size_of(it->second->embeddings);
    lru_.erase(it->second);
    entries_.erase(it);
  }
  const int64_t size = size_of(embeddings);
  if (size > capacity_bytes_) return;
  lru_.push_front({hash, std::move(embeddings)});
  entries_[hash] = lru_.begin();
  bytes_ += size;
  while (bytes_ > capacity_bytes_) {
    bytes_ -= size_of(lru_.back().embeddings);
    entries_.erase(lru_.back().hash);
    lru_.pop_back();
  }
}

}  // namespace dz::runtime
