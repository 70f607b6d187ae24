// Plain MLA attention (docs/models.md §2.2–2.3): gather a query's keys from the cache, FP64 scores
// and a two-pass softmax. The oracle for the tiled kernels in mla_attention.cpp.
#include <algorithm>
#include <cmath>
#include <vector>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/mla_attention.h"

namespace dz::kernels {
namespace {

int64_t slot_of_position(const MlaCacheView& cache, int64_t pos) {
  return static_cast<int64_t>(cache.block_table[static_cast<size_t>(pos / cache.block_size)]) *
             cache.block_size +
         pos % cache.block_size;
}

// records [num_keys, r_kv + d_r]: the dequantized latent and rope part of each key.
std::vector<float> gather_records(const MlaCacheView& cache, std::span<const int32_t> positions) {
  const int64_t width = cache.layout.latent_dim + cache.layout.rope_dim;
  std::vector<float> records(positions.size() * static_cast<size_t>(width));
  for (size_t k = 0; k < positions.size(); ++k)
    read_mla_record(cache.layout, cache.pool, slot_of_position(cache, positions[k]),
                    records.data() + k * static_cast<size_t>(width));
  return records;
}

// Softmax weights of FP64 scores, in place.
void softmax_in_place(std::vector<double>& scores) {
  const double max_score = *std::max_element(scores.begin(), scores.end());
  double sum = 0;
  for (double& s : scores) sum += (s = std::exp(s - max_score));
  for (double& s : scores) s /= sum;
}

}  // namespace

void mla_query_key_positions(const MlaQueryKeys& keys, int64_t query, std::vector<int32_t>& out) {
  out.clear();
  const int32_t pos = keys.positions[static_cast<size_t>(query)];
  if (keys.selection_width == 0) {
    for (int32_t s = 0; s <= pos; ++s) out.push_back(s);
    return;
  }
  for (int64_t j = 0; j < keys.selection_width; ++j) {
    const int32_t s = keys.selection[static_cast<size_t>(query * keys.selection_width + j)];
    if (s < 0) continue;
    DZ_CHECK(s <= pos, "query at {} selects the later position {}", pos, s);
    out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  DZ_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(),
           "query at {} selects a position twice", pos);
  DZ_CHECK(!out.empty(), "query at {} has no keys", pos);
}

void mla_attention_absorbed_ref(const MlaCacheView& cache, const MlaQueryKeys& keys,
                                const MlaAbsorbedArgs& args) {
  const int64_t r_kv = cache.layout.latent_dim, d_r = cache.layout.rope_dim;
  const int64_t width = r_kv + d_r, num_heads = args.num_heads;
  std::vector<int32_t> positions;
  for (int64_t i = 0; i < keys.num_queries(); ++i) {
    mla_query_key_positions(keys, i, positions);
    const std::vector<float> records = gather_records(cache, positions);
    for (int64_t h = 0; h < num_heads; ++h) {
      const float* q_abs = args.q_abs + (i * num_heads + h) * r_kv;
      const float* q_pe = args.q_pe + i * args.q_pe_token_stride + h * args.q_pe_head_stride;
      std::vector<double> p(positions.size());
      for (size_t k = 0; k < positions.size(); ++k) {
        const float* rec = records.data() + k * static_cast<size_t>(width);
        double dot = 0;
        for (int64_t c = 0; c < r_kv; ++c) dot += double{q_abs[c]} * rec[c];
        for (int64_t c = 0; c < d_r; ++c) dot += double{q_pe[c]} * rec[r_kv + c];
        p[k] = dot * args.softmax_scale;
      }
      if (args.lse != nullptr) {
        const double max_score = *std::max_element(p.begin(), p.end());
        double sum = 0;
        for (double score : p) sum += std::exp(score - max_score);
        args.lse[i * num_heads + h] = static_cast<float>(max_score + std::log(sum));
      }
      softmax_in_place(p);
      float* o = args.o_lat + (i * num_heads + h) * r_kv;
      for (int64_t c = 0; c < r_kv; ++c) {
        double acc = 0;
        for (size_t k = 0; k < positions.size(); ++k)
          acc += p[k] * records[k * static_cast<size_t>(width) + static_cast<size_t>(c)];
        o[c] = static_cast<float>(acc);
      }
    }
  }
}

void mla_attention_prefill_ref(const MlaCacheView& cache, const MlaQueryKeys& keys,
                               const MlaPrefillArgs& args) {
  const int64_t r_kv = cache.layout.latent_dim, d_r = cache.layout.rope_dim;
  const int64_t width = r_kv + d_r, num_heads = args.num_heads;
  const int64_t d_n = args.nope_dim, d_v = args.v_dim;
  std::vector<int32_t> positions;
  for (int64_t i = 0; i < keys.num_queries(); ++i) {
    mla_query_key_positions(keys, i, positions);
    const std::vector<float> records = gather_records(cache, positions);
    const size_t num_keys = positions.size();
    for (int64_t h = 0; h < num_heads; ++h) {
      const uint16_t* w_uk = args.w_uk + h * d_n * r_kv;
      const uint16_t* w_uv = args.w_uv + h * d_v * r_kv;
      const float* q_nope = args.q_nope + i * args.q_token_stride + h * args.q_head_stride;
      const float* q_pe = args.q_pe + i * args.q_token_stride + h * args.q_head_stride;
      // Up-projected keys and values of this head: k_nope [num_keys, d_n], v [num_keys, d_v].
      std::vector<double> k_nope(num_keys * static_cast<size_t>(d_n));
      std::vector<double> v(num_keys * static_cast<size_t>(d_v));
      std::vector<double> p(num_keys);
      for (size_t k = 0; k < num_keys; ++k) {
        const float* rec = records.data() + k * static_cast<size_t>(width);
        for (int64_t n = 0; n < d_n; ++n) {
          double acc = 0;
          for (int64_t c = 0; c < r_kv; ++c)
            acc += double{formats::decode_bf16(w_uk[n * r_kv + c])} * rec[c];
          k_nope[k * static_cast<size_t>(d_n) + static_cast<size_t>(n)] = acc;
        }
        for (int64_t n = 0; n < d_v; ++n) {
          double acc = 0;
          for (int64_t c = 0; c < r_kv; ++c)
            acc += double{formats::decode_bf16(w_uv[n * r_kv + c])} * rec[c];
          v[k * static_cast<size_t>(d_v) + static_cast<size_t>(n)] = acc;
        }
        double dot = 0;
        for (int64_t n = 0; n < d_n; ++n)
          dot += q_nope[n] * k_nope[k * static_cast<size_t>(d_n) + static_cast<size_t>(n)];
        for (int64_t c = 0; c < d_r; ++c) dot += double{q_pe[c]} * rec[r_kv + c];
        p[k] = dot * args.softmax_scale;
      }
      softmax_in_place(p);
      float* o = args.out + (i * num_heads + h) * d_v;
      for (int64_t n = 0; n < d_v; ++n) {
        double acc = 0;
        for (size_t k = 0; k < num_keys; ++k)
          acc += p[k] * v[k * static_cast<size_t>(d_v) + static_cast<size_t>(n)];
        o[n] = static_cast<float>(acc);
      }
    }
  }
}

}  // namespace dz::kernels
