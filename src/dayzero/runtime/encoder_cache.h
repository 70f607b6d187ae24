#pragma once
// Image embeddings the vision encoder produced, kept by image content hash so that a repeated
// image is encoded once (docs/vision.md §4), at most a byte budget; the least recently used go
// first. Entries are shared: a step holding one keeps it alive past an eviction.

#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

#include "dayzero/cache/prefix_hash.h"

namespace dz::runtime {

using ImageEmbeddings = std::shared_ptr<const std::vector<float>>;  // [tokens, hidden]

class EncoderCache {
 public:
  explicit EncoderCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  // Whether the entry is there (its recency unchanged).
  bool contains(const cache::BlockHash& hash) const { return entries_.contains(hash); }
  // The entry, now the most recently used; null when absent.
  ImageEmbeddings find(const cache::BlockHash& hash);
  // Adds (or replaces) an entry and evicts the least recently used beyond the budget; an entry
  // larger than the whole budget is not kept.
  void insert(const cache::BlockHash& hash, ImageEmbeddings embeddings);

  int64_t bytes() const { return bytes_; }
  int64_t num_entries() const { return static_cast<int64_t>(entries_.size()); }

 private:
  struct Entry {
    cache::BlockHash hash;
    ImageEmbeddings embeddings;
  };
  static int64_t size_of(const ImageEmbeddings& e) {
    return static_cast<int64_t>(e->size() * sizeof(float));
  }

  int64_t capacity_bytes_;
  int64_t bytes_ = 0;
  std::list<Entry> lru_;  // most recently used first
  std::unordered_map<cache::BlockHash, std::list<Entry>::iterator, cache::BlockHashHasher> entries_;
};

}  // namespace dz::runtime
