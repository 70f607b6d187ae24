#pragma once
// Everything one forward step needs (docs/style.md §7), passed from the recipe to each block and
// kernel. All scheduled tokens are flattened into one array; each sequence owns a contiguous range
// of it.

#include <cstdint>
#include <span>
#include <vector>

namespace dz::model {

class ContextSplit;  // model/context_parallel.h

struct SequenceSlice {
  int64_t token_begin = 0;  // first index into the flattened token arrays
  int64_t num_tokens = 0;   // tokens of this sequence in this step
  int64_t pos_begin = 0;    // position of its first token = tokens of it already in the cache
  // Physical block ids covering positions [0, pos_begin + num_tokens): position p lives in block
  // block_table[p / block_size] at offset p % block_size (docs/formats.md §5.1).
  std::span<const int32_t> block_table;
  // Recurrent-state slot of the sequence (KDA layers, docs/serving.md §1.6); −1: none (models
  // without recurrent layers).
  int32_t state_slot = -1;
  // Speculative verification on a recurrent model (docs/serving.md §4): with S slots here, slot j
  // receives the recurrent state (and conv rows) after the slice's token num_tokens − 1 − S + j,
  // i.e. after its last non-draft token and after each draft but the last, so that a rejection
  // restores the state at the accepted length without recomputing anything. Empty: none.
  std::span<const int32_t> snapshot_slots{};

  int64_t num_cached_after() const { return pos_begin + num_tokens; }
};

// A token whose input embedding is given rather than looked up: an image embedding at a
// placeholder position (docs/vision.md §4). `row` holds hidden_size BF16-valued floats.
struct GivenEmbedding {
  int64_t token = 0;  // index into the batch's tokens
  const float* row = nullptr;
};

struct ForwardBatch {
  std::span<const int32_t> token_ids;     // [num_tokens]
  std::span<const int32_t> positions;     // [num_tokens], pos_begin + i within each sequence
  std::span<const int64_t> slot_mapping;  // [num_tokens], cache slot written by each token
  std::vector<SequenceSlice> sequences;
  int64_t block_size = 64;  // tokens per cache block
  // Context parallelism: this rank's part of a step its CP group shares (the blocks gather the
  // cache rows and KDA summaries of the other ranks' pieces through it); null otherwise.
  const ContextSplit* context = nullptr;
  // Embedding rows that replace the table's for some tokens (images); empty for text.
  std::span<const GivenEmbedding> given_embeddings{};

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
  // Decode: every sequence advances by exactly one token.
  bool is_decode() const {
    for (const auto& seq : sequences)
      if (seq.num_tokens != 1) return false;
    return true;
  }
};

// Slot of position `pos` of a sequence: block_table[pos / block_size] · block_size + pos %
// block_size.
inline int64_t slot_of(std::span<const int32_t> block_table, int64_t block_size, int64_t pos) {
  return static_cast<int64_t>(block_table[static_cast<size_t>(pos / block_size)]) * block_size +
         pos % block_size;
}

}  // namespace dz::model
