#pragma once
// Inner loops of the tiled MLA attention kernels (private to kernels/): a generic variant and an
// AVX-512 one, chosen once from the CPU features (docs/style.md §5). Both accumulate in FP32.

#include <cstddef>
#include <cstdint>
#include <span>

#include "dayzero/kernels/mla_attention.h"

namespace dz::kernels::detail {

struct MlaVecOps {
  const char* name;
  // out[k] = Σ_c x[c] · rows[k·row_stride + c] for k < num_rows, c < dim.
  void (*dot_rows)(const float* x, const float* rows, int64_t row_stride, int64_t num_rows,
                   int64_t dim, float* out);
  // acc[c] += Σ_k p[k] · rows[k·row_stride + c] for c < dim.
  void (*accumulate_rows)(const float* p, const float* rows, int64_t row_stride, int64_t num_rows,
                          int64_t dim, float* acc);
  // The same for four queries against the same rows (each row read once for the four), every
  // output bit for bit what the one-query function gives.
  void (*dot_rows_x4)(const float* const x[4], const float* rows, int64_t row_stride,
                      int64_t num_rows, int64_t dim, float* const out[4]);
  void (*accumulate_rows_x4)(const float* const p[4], const float* rows, int64_t row_stride,
                             int64_t num_rows, int64_t dim, float* const acc[4]);
  // The first half of an online-softmax step of the prefill form, one head of one query: scores
  // [n] become s = (scores + rope) · scale where allowed ≠ 0 (−inf elsewhere), then the weights
  // e^(s − m_new) (all 0 when no key is allowed); m, l and acc [dim] are brought to the new
  // maximum m_new. Returns whether any key was allowed. The variants' exp and sum differ in
  // rounding only (≈ 1 ulp per weight).
  bool (*prefill_weights)(float* scores, const float* rope, const float* allowed, int64_t n,
                          float scale, float& m, float& l, float* acc, int64_t dim);
};

MlaVecOps mla_vec_ops_generic();
MlaVecOps mla_vec_ops_avx512();  // only callable where the CPU has AVX-512 F
// The variant this CPU runs (AVX-512 when present), decided once.
const MlaVecOps& mla_vec_ops();

inline int64_t mla_slot_of_position(const MlaCacheView& cache, int64_t pos) {
  return static_cast<int64_t>(cache.block_table[static_cast<size_t>(pos / cache.block_size)]) *
             cache.block_size +
         pos % cache.block_size;
}
// Number of key entries of query i before −1 skipping: the prefix length or the selection width.
inline int64_t mla_num_key_entries(const MlaQueryKeys& keys, int64_t i) {
  return keys.selection_width == 0 ? keys.positions[static_cast<size_t>(i)] + 1
                                   : keys.selection_width;
}
inline int32_t mla_key_entry(const MlaQueryKeys& keys, int64_t i, int64_t j) {
  return keys.selection_width == 0
             ? static_cast<int32_t>(j)
             : keys.selection[static_cast<size_t>(i * keys.selection_width + j)];
}

// One flash-decoding split of the absorbed form: every head of query `query` against its key
// entries [entry_begin, entry_end), leaving the split's unnormalised online-softmax state.
struct MlaSplit {
  const MlaCacheView* cache = nullptr;
  const MlaQueryKeys* keys = nullptr;
  int64_t query = 0, entry_begin = 0, entry_end = 0;
  int64_t num_heads = 0;
  float softmax_scale = 0;
  const float* q_cat = nullptr;  // [H, r_kv + d_r]: q_abs then q_pe of each head
  float* acc = nullptr;          // [H, r_kv] Σ_s e^(S_h[s] − m_h)·c_kv(s)
  float* m = nullptr;            // [H] running maxima (−inf: no key yet)
  float* l = nullptr;            // [H] Σ_s e^(S_h[s] − m_h)
};

// True where mla_attention_absorbed decodes records through BF16 (the two splits below), which is
// exact except below BF16's normal range (the tests' tolerance there follows it).
bool mla_absorbed_reads_records_as_bf16();
// The split with every head against each tile of records decoded once (AVX-512 and VBMI), on
// FP32 products.
size_t mla_split_fp32_scratch_bytes(const MlaCacheLayout& layout, int64_t num_heads);
void mla_split_fp32_avx512(const MlaSplit& split, std::span<std::byte> scratch);
// The same on AMX tiles (AMX-BF16 with AVX-512 BF16 and VBMI): 16 heads by 64 records per tile
// product, q and the probabilities split into three BF16 terms each against the exact BF16
// records, so the results agree with FP32 products to FP32 rounding.
size_t mla_split_amx_scratch_bytes(const MlaCacheLayout& layout, int64_t num_heads);
void mla_split_amx(const MlaSplit& split, std::span<std::byte> scratch);

}  // namespace dz::kernels::detail
