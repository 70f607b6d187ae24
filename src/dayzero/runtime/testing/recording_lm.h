#pragma once
// A fake CausalLm for engine tests that makes every cache or state mistake visible exactly, with no
// numerical tolerance. It declares one tiny paged layer (a BF16 "MLA" record of 4 bytes, which
// holds a token id) and, as a hybrid, one KDA layer whose 16-byte state holds (running hash of
// the tokens folded in, their count). forward() writes each token id into its slot, then gives
// logits that depend on the hash of the WHOLE history read back through the block table (and, as
// a hybrid, on the recurrent state in the slot): a wrong block table, a wrong prefix hit, a stale
// or unrestored state changes the tokens. A state that has not consumed exactly pos_begin tokens
// is refused with kInternal. expected_tokens() is the oracle: the same function on the true
// history, sampled with the same Sampler.

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include <fmt/format.h>

#include "dayzero/model/causal_lm.h"
#include "dayzero/runtime/sampler.h"

namespace dz::runtime::testing {

inline constexpr int64_t kFakeVocab = 48;
inline constexpr uint64_t kHistorySeed = 0x243f6a8885a308d3ull;

inline uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline uint64_t fold_token(uint64_t h, int32_t token) {
  return mix64(h ^ ((static_cast<uint64_t>(token) + 1) * 0x9e3779b97f4a7c15ull));
}
inline uint64_t logits_key(uint64_t kv_hash, uint64_t state_hash, bool hybrid) {
  return hybrid ? mix64(kv_hash ^ ((state_hash << 17) | (state_hash >> 47))) : kv_hash;
}
// Logits in [-4, 4), a deterministic function of the key.
inline void fill_logits(uint64_t key, float* out) {
  for (int64_t v = 0; v < kFakeVocab; ++v) {
    const uint64_t bits = mix64(key + static_cast<uint64_t>(v) * 0x632be59bd9b4e019ull) >> 40;
    out[v] = static_cast<float>(bits) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
  }
}

struct RecordedSequence {
  int64_t pos_begin = 0;
  int64_t num_tokens = 0;
  int32_t state_slot = -1;
};

class RecordingLm : public model::CausalLm {
 public:
  explicit RecordingLm(bool hybrid) : hybrid_(hybrid) {}

  int64_t vocab_size() const override { return kFakeVocab; }
  int64_t hidden_size() const override { return 8; }
  std::vector<model::LayerCacheSpec> cache_layers() const override {
    std::vector<model::LayerCacheSpec> layers(1);
    layers[0].mla = {.latent_dim = 2, .rope_dim = 0, .dtype = kernels::KvCacheDtype::kBf16};
    if (hybrid_) {
      model::LayerCacheSpec kda;
      kda.kda = {.num_heads = 1, .head_dim = 2, .conv_width = 1};
      layers.push_back(kda);
    }
    return layers;
  }

  Status forward(const ExecContext&, const model::ForwardBatch& batch, model::KvCache& cache,
                 std::span<const int64_t> logits_rows, float* out_logits,
                 model::TapSink*) override {
    ++num_forward_calls;
    if (fail_next) {
      fail_next = false;
      return make_error(StatusCode::kInternal, "recording model: injected failure");
    }
    const int64_t block_size = batch.block_size;
    const int64_t num_slots = cache.num_blocks() * block_size;
    std::byte* pool = cache.mla_layer(0).pool;
    // Every token's records are written before any is read, as each layer of a real model does.
    for (const model::SequenceSlice& seq : batch.sequences) {
      if (static_cast<int64_t>(seq.block_table.size()) * block_size < seq.num_cached_after())
        return make_error(StatusCode::kInvalidArgument, "table of {} blocks for {} positions",
                          seq.block_table.size(), seq.num_cached_after());
      for (int32_t block : seq.block_table)
        if (block <= 0 || block >= cache.num_blocks())
          return make_error(StatusCode::kInvalidArgument, "block id {} in a table", block);
      for (int64_t i = 0; i < seq.num_tokens; ++i) {
        const auto k = static_cast<size_t>(seq.token_begin + i);
        const int64_t pos = seq.pos_begin + i;
        const int32_t token = batch.token_ids[k];
        if (token < 0 || token >= kFakeVocab)
          return make_error(StatusCode::kInvalidArgument, "token {} outside the vocabulary", token);
        if (batch.positions[k] != pos)
          return make_error(StatusCode::kInvalidArgument, "position {} at row {}, want {}",
                            batch.positions[k], k, pos);
        const int64_t slot = model::slot_of(seq.block_table, block_size, pos);
        if (batch.slot_mapping[k] != slot || slot < 0 || slot >= num_slots)
          return make_error(StatusCode::kInvalidArgument, "slot {} at row {}, want {}",
                            batch.slot_mapping[k], k, slot);
        std::memcpy(pool + slot * 4, &token, 4);
      }
    }
    std::vector<int64_t> out_index(static_cast<size_t>(batch.num_tokens()), -1);
    for (size_t r = 0; r < logits_rows.size(); ++r)
      out_index.at(static_cast<size_t>(logits_rows[r])) = static_cast<int64_t>(r);
    std::vector<RecordedSequence> recorded;
    for (const model::SequenceSlice& seq : batch.sequences) {
      recorded.push_back({seq.pos_begin, seq.num_tokens, seq.state_slot});
      uint64_t st[2] = {0, 0};  // (hash, count) of the slot's state
      float* state_floats = nullptr;
      if (hybrid_) {
        const model::KdaLayerState kda = cache.kda_layer(1);
        if (seq.state_slot <= 0 || seq.state_slot >= kda.num_slots)
          return make_error(StatusCode::kInvalidArgument, "state slot {}", seq.state_slot);
        state_floats = kda.state(seq.state_slot);
        std::memcpy(st, state_floats, sizeof(st));
        if (seq.pos_begin == 0) {
          st[0] = kHistorySeed;
          st[1] = 0;
        } else if (st[1] != static_cast<uint64_t>(seq.pos_begin)) {
          return make_error(StatusCode::kInternal,
                            "state slot {} has consumed {} tokens, the sequence is at {}",
                            seq.state_slot, st[1], seq.pos_begin);
        }
      } else if (seq.state_slot != -1) {
        return make_error(StatusCode::kInvalidArgument, "state slot {} without KDA layers",
                          seq.state_slot);
      }
      const auto num_snapshots = static_cast<int64_t>(seq.snapshot_slots.size());
      if (num_snapshots > 0 && (!hybrid_ || num_snapshots >= seq.num_tokens))
        return make_error(StatusCode::kInvalidArgument, "{} snapshots of a {}-token slice",
                          num_snapshots, seq.num_tokens);
      for (int64_t i = 0; i < seq.num_tokens; ++i) {
        const auto k = static_cast<size_t>(seq.token_begin + i);
        if (hybrid_) {
          st[0] = fold_token(st[0], batch.token_ids[k]);
          ++st[1];
          // The state after this token, kept for a rollback (SequenceSlice::snapshot_slots).
          const int64_t j = i - (seq.num_tokens - 1 - num_snapshots);
          if (j >= 0 && j < num_snapshots) {
            const model::KdaLayerState kda = cache.kda_layer(1);
            const int32_t snapshot = seq.snapshot_slots[static_cast<size_t>(j)];
            if (snapshot <= 0 || snapshot >= kda.num_slots || snapshot == seq.state_slot)
              return make_error(StatusCode::kInvalidArgument, "snapshot slot {}", snapshot);
            std::memcpy(kda.state(snapshot), st, sizeof(st));
          }
        }
        if (out_index[k] < 0) continue;
        uint64_t kv = kHistorySeed;
        for (int64_t p = 0; p <= seq.pos_begin + i; ++p) {
          int32_t token = 0;
          std::memcpy(&token, pool + model::slot_of(seq.block_table, block_size, p) * 4, 4);
          kv = fold_token(kv, token);
        }
        fill_logits(logits_key(kv, st[0], hybrid_), out_logits + out_index[k] * kFakeVocab);
      }
      if (hybrid_) std::memcpy(state_floats, st, sizeof(st));
    }
    batches.push_back(std::move(recorded));
    last_positions_.assign(batch.positions.begin(), batch.positions.end());
    total_tokens += batch.num_tokens();
    return Status::ok_status();
  }

  // With_mtp: an MTP head whose row for position t is mtp_logits_key(the cached history through
  // t, then the token fed) — the main model's key of position t + 1 when that token is the
  // successor. Its batch must sit at the last forward()'s first positions, as a real head's.
  bool has_mtp() const override { return with_mtp; }
  Status forward_mtp(const ExecContext&, const model::ForwardBatch& batch, model::KvCache& cache,
                     std::span<const int64_t> logits_rows, float* out_logits,
                     model::TapSink*) override {
    if (!with_mtp) return make_error(StatusCode::kUnsupported, "recording model: no MTP head");
    ++num_mtp_calls;
    if (batch.positions.size() > last_positions_.size() ||
        !std::equal(batch.positions.begin(), batch.positions.end(), last_positions_.begin()))
      return make_error(StatusCode::kInvalidArgument,
                        "MTP batch of {} tokens off the last forward()'s positions",
                        batch.positions.size());
    const std::byte* pool = cache.mla_layer(0).pool;
    std::vector<int64_t> out_index(static_cast<size_t>(batch.num_tokens()), -1);
    for (size_t r = 0; r < logits_rows.size(); ++r)
      out_index.at(static_cast<size_t>(logits_rows[r])) = static_cast<int64_t>(r);
    last_mtp_keys_.assign(logits_rows.size(), 0);
    for (const model::SequenceSlice& seq : batch.sequences) {
      for (int64_t i = 0; i < seq.num_tokens; ++i) {
        const auto k = static_cast<size_t>(seq.token_begin + i);
        if (out_index[k] < 0) continue;
        uint64_t kv = kHistorySeed;
        for (int64_t p = 0; p <= seq.pos_begin + i; ++p) {
          int32_t token = 0;
          std::memcpy(&token, pool + model::slot_of(seq.block_table, batch.block_size, p) * 4, 4);
          kv = fold_token(kv, token);
        }
        const uint64_t key = fold_token(kv, batch.token_ids[k]);
        last_mtp_keys_[static_cast<size_t>(out_index[k])] = key;
        fill_logits(key, out_logits + out_index[k] * kFakeVocab);
      }
    }
    return Status::ok_status();
  }

  // The chained head: row i continues the key of the last MTP call's row i with the token fed,
  // the main model's key one position on when the drafts so far are right (plain model).
  Status forward_mtp_chain(const ExecContext&, const model::ForwardBatch& batch, model::KvCache&,
                           float* out_logits, model::TapSink*) override {
    if (!with_mtp) return make_error(StatusCode::kUnsupported, "recording model: no MTP head");
    ++num_mtp_chain_calls;
    if (static_cast<size_t>(batch.num_tokens()) != last_mtp_keys_.size())
      return make_error(StatusCode::kInvalidArgument, "MTP chain of {} tokens for {} rows",
                        batch.num_tokens(), last_mtp_keys_.size());
    for (size_t i = 0; i < last_mtp_keys_.size(); ++i) {
      last_mtp_keys_[i] = fold_token(last_mtp_keys_[i], batch.token_ids[i]);
      fill_logits(last_mtp_keys_[i], out_logits + static_cast<int64_t>(i) * kFakeVocab);
    }
    return Status::ok_status();
  }

  bool hybrid() const { return hybrid_; }

  bool with_mtp = false;
  int64_t num_mtp_calls = 0;
  int64_t num_mtp_chain_calls = 0;

  bool fail_next = false;
  int64_t num_forward_calls = 0;
  int64_t total_tokens = 0;
  std::vector<std::vector<RecordedSequence>> batches;

 private:
  bool hybrid_;
  std::vector<int32_t> last_positions_;
  std::vector<uint64_t> last_mtp_keys_;
};

// The logits key of the history `tokens` (plain model, or the MTP head at the last position).
inline uint64_t history_key(std::span<const int32_t> tokens, bool hybrid) {
  uint64_t h = kHistorySeed;
  for (const int32_t t : tokens) h = fold_token(h, t);
  return logits_key(h, h, hybrid);
}

// What the engine must produce for a prompt: the model's function on the true history, sampled by
// a Sampler with the same parameters (EOS and stop ids end it and are not part of it).
inline std::vector<int32_t> expected_tokens(std::span<const int32_t> prompt,
                                            const SamplingParams& params, int64_t max_tokens,
                                            bool hybrid, std::span<const int32_t> eos = {},
                                            uint32_t choice_index = 0) {
  Sampler sampler(params, eos, choice_index);
  uint64_t h = kHistorySeed;
  for (const int32_t t : prompt) h = fold_token(h, t);
  std::vector<int32_t> output;
  std::vector<float> logits(static_cast<size_t>(kFakeVocab));
  while (static_cast<int64_t>(output.size()) < max_tokens) {
    fill_logits(logits_key(h, h, hybrid), logits.data());
    const SampleResult s =
        sampler.sample(logits, static_cast<int64_t>(output.size()), prompt, output);
    if (sampler.is_stop_token(s.token)) break;
    output.push_back(s.token);
    h = fold_token(h, s.token);
  }
  return output;
}

}  // namespace dz::runtime::testing
