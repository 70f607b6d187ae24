// Tiled MLA attention over the paged cache (mla_attention.h). Keys stream in tiles with an online
// softmax: per head a running max m, sum l and accumulator; a tile rescales them by exp(m − m').
// The absorbed form splits one query's keys over threads (flash-decoding) and merges the
// partial (m, l, acc) afterwards; the prefill form up-projects each key block once for all queries.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "dayzero/core/check.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/kernels/cpu_features.h"
#include "dayzero/kernels/linear_onednn.h"
#include "dayzero/kernels/mla_attention.h"
#include "dayzero/kernels/mla_attention_vec.h"

namespace dz::kernels {
namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

namespace detail {
namespace {

// The first half of an online-softmax step for one head: scores [n] (already scaled, −inf =
// masked) become the tile's weights e^(s − m_new) (all 0 when every key is masked), and m, l and
// acc [dim] are brought to the new maximum. Returns whether any key was allowed.
bool online_softmax_weights(float* scores, int64_t n, float& m, float& l, float* acc, int64_t dim) {
  float tile_max = kNegInf;
  for (int64_t k = 0; k < n; ++k) tile_max = std::max(tile_max, scores[k]);
  if (tile_max == kNegInf) {
    std::fill_n(scores, n, 0.0f);
    return false;
  }
  const float m_new = std::max(m, tile_max);
  const float correction = std::exp(m - m_new);  // 0 on the first tile (m = −inf)
  if (correction != 1.0f)
    for (int64_t c = 0; c < dim; ++c) acc[c] *= correction;
  float sum = 0;
  for (int64_t k = 0; k < n; ++k) sum += (scores[k] = std::exp(scores[k] - m_new));
  l = l * correction + sum;
  m = m_new;
  return true;
}

bool prefill_weights_generic(float* scores, const float* rope, const float* allowed, int64_t n,
                             float scale, float& m, float& l, float* acc, int64_t dim) {
  for (int64_t k = 0; k < n; ++k)
    scores[k] = allowed[k] != 0 ? (scores[k] + rope[k]) * scale : kNegInf;
  return online_softmax_weights(scores, n, m, l, acc, dim);
}

void dot_rows_generic(const float* x, const float* rows, int64_t row_stride, int64_t num_rows,
                      int64_t dim, float* out) {
  for (int64_t k = 0; k < num_rows; ++k) {
    const float* r = rows + k * row_stride;
    float partial[8] = {};  // eight interleaved sums, vectorizable without -ffast-math
    int64_t c = 0;
    for (; c + 8 <= dim; c += 8)
      for (int j = 0; j < 8; ++j) partial[j] += x[c + j] * r[c + j];
    float sum = 0;
    for (; c < dim; ++c) sum += x[c] * r[c];
    for (float v : partial) sum += v;
    out[k] = sum;
  }
}

void accumulate_rows_generic(const float* p, const float* rows, int64_t row_stride,
                             int64_t num_rows, int64_t dim, float* acc) {
  for (int64_t k = 0; k < num_rows; ++k) {
    const float* r = rows + k * row_stride;
    const float pk = p[k];
    for (int64_t c = 0; c < dim; ++c) acc[c] += pk * r[c];
  }
}

void dot_rows_x4_generic(const float* const x[4], const float* rows, int64_t row_stride,
                         int64_t num_rows, int64_t dim, float* const out[4]) {
  for (int q = 0; q < 4; ++q) dot_rows_generic(x[q], rows, row_stride, num_rows, dim, out[q]);
}

void accumulate_rows_x4_generic(const float* const p[4], const float* rows, int64_t row_stride,
                                int64_t num_rows, int64_t dim, float* const acc[4]) {
  for (int q = 0; q < 4; ++q)
    accumulate_rows_generic(p[q], rows, row_stride, num_rows, dim, acc[q]);
}

}  // namespace

MlaVecOps mla_vec_ops_generic() {
  return {.name = "generic",
          .dot_rows = dot_rows_generic,
          .accumulate_rows = accumulate_rows_generic,
          .dot_rows_x4 = dot_rows_x4_generic,
          .accumulate_rows_x4 = accumulate_rows_x4_generic,
          .prefill_weights = prefill_weights_generic};
}

const MlaVecOps& mla_vec_ops() {
  static const MlaVecOps ops = cpu_features().avx512 ? mla_vec_ops_avx512() : mla_vec_ops_generic();
  return ops;
}

}  // namespace detail

namespace {

constexpr int64_t kKeyTile = 32;           // keys per tile in the absorbed form
constexpr int64_t kMinKeysPerSplit = 128;  // a flash-decoding split is at least this many keys
constexpr int64_t kKeyBlock = 64;          // keys up-projected together in the prefill form

size_t align64(size_t num_bytes) {
  return (num_bytes + 63) / 64 * 64;
}

// Carves typed arrays out of the caller's workspace.
class Carver {
 public:
  explicit Carver(std::span<std::byte> workspace) : workspace_(workspace) {}
  template <typename T>
  T* take(int64_t num_elems) {
    const size_t num_bytes = align64(static_cast<size_t>(num_elems) * sizeof(T));
    DZ_CHECK(used_ + num_bytes <= workspace_.size(), "MLA workspace of {} bytes is too small",
             workspace_.size());
    T* p = reinterpret_cast<T*>(workspace_.data() + used_);
    used_ += num_bytes;
    return p;
  }

 private:
  std::span<std::byte> workspace_;
  size_t used_ = 0;
};

int64_t max_splits_per_query(const ExecContext& ctx, int64_t num_queries) {
  return std::max<int64_t>(1,
                           (ctx.num_threads + num_queries - 1) / std::max<int64_t>(num_queries, 1));
}

// One online-softmax step for one head: scores [n] (already scaled, −inf = masked) against rows.
void online_softmax_step(const detail::MlaVecOps& ops, float* scores, int64_t n, const float* rows,
                         int64_t row_stride, int64_t dim, float& m, float& l, float* acc) {
  if (detail::online_softmax_weights(scores, n, m, l, acc, dim))
    ops.accumulate_rows(scores, rows, row_stride, n, dim, acc);
}

// Per thread in the prefill form: scores, rope scores and allowed flags of a group of four
// queries, and one d_v row the repeats of a short group accumulate into (never read).
int64_t prefill_thread_floats(int64_t v_dim) {
  return 4 * 3 * kKeyBlock + v_dim;
}

// The FP32 split (mla_attention_vec.h): each head's own pass over every tile of records.
size_t split_fp32_scratch_bytes(const MlaCacheLayout& layout) {
  const int64_t width = layout.latent_dim + layout.rope_dim;
  return align64(static_cast<size_t>(kKeyTile * width) * 4) +  // records
         align64(static_cast<size_t>(kKeyTile) * 4);           // scores
}

void split_fp32(const detail::MlaSplit& split, std::span<std::byte> scratch) {
  const detail::MlaVecOps& ops = detail::mla_vec_ops();
  const MlaCacheView& cache = *split.cache;
  const int64_t r_kv = cache.layout.latent_dim, width = r_kv + cache.layout.rope_dim;
  Carver carver(scratch);
  float* records = carver.take<float>(kKeyTile * width);
  float* scores = carver.take<float>(kKeyTile);
  std::fill_n(split.acc, split.num_heads * r_kv, 0.0f);
  std::fill_n(split.m, split.num_heads, kNegInf);
  std::fill_n(split.l, split.num_heads, 0.0f);
  for (int64_t j = split.entry_begin; j < split.entry_end;) {
    int64_t num_keys = 0;  // gather the next tile of valid keys
    for (; j < split.entry_end && num_keys < kKeyTile; ++j) {
      const int32_t pos = detail::mla_key_entry(*split.keys, split.query, j);
      if (pos < 0) continue;
      read_mla_record(cache.layout, cache.pool, detail::mla_slot_of_position(cache, pos),
                      records + num_keys * width);
      ++num_keys;
    }
    if (num_keys == 0) continue;
    for (int64_t h = 0; h < split.num_heads; ++h) {
      ops.dot_rows(split.q_cat + h * width, records, width, num_keys, width, scores);
      for (int64_t k = 0; k < num_keys; ++k) scores[k] *= split.softmax_scale;
      online_softmax_step(ops, scores, num_keys, records, width, r_kv, split.m[h], split.l[h],
                          split.acc + h * r_kv);
    }
  }
}

// The split this CPU runs: AMX tiles, else every head per record tile on AVX-512 (VBMI decodes the
// records), else each head's own pass (portable, or AVX-512 without VBMI).
struct SplitKernel {
  void (*run)(const detail::MlaSplit&, std::span<std::byte>);
  size_t (*scratch_bytes)(const MlaCacheLayout&, int64_t num_heads);
};

const SplitKernel& split_kernel() {
  static const SplitKernel kernel = [] {
    const CpuFeatures& f = cpu_features();
    if (f.amx_bf16 && f.avx512_vbmi)
      return SplitKernel{detail::mla_split_amx, detail::mla_split_amx_scratch_bytes};
    if (f.avx512 && f.avx512_vbmi)
      return SplitKernel{detail::mla_split_fp32_avx512, detail::mla_split_fp32_scratch_bytes};
    return SplitKernel{split_fp32, [](const MlaCacheLayout& layout, int64_t) {
                         return split_fp32_scratch_bytes(layout);
                       }};
  }();
  return kernel;
}

}  // namespace

bool detail::mla_absorbed_reads_records_as_bf16() {
  return split_kernel().run != split_fp32;  // the two vector splits
}

size_t mla_absorbed_workspace_bytes(const ExecContext& ctx, const MlaCacheLayout& layout,
                                    int64_t num_queries, int64_t num_heads) {
  const int64_t width = layout.latent_dim + layout.rope_dim;
  const int64_t num_partials = num_queries * max_splits_per_query(ctx, num_queries);
  const int64_t num_threads = std::max(ctx.num_threads, 1);
  return align64(static_cast<size_t>(num_partials * num_heads * (layout.latent_dim + 2)) * 4) +
         static_cast<size_t>(num_threads) *
             (align64(static_cast<size_t>(num_heads * width) * 4) +  // q_cat
              align64(split_kernel().scratch_bytes(layout, num_heads)));
}

void mla_attention_absorbed(const ExecContext& ctx, const MlaCacheView& cache,
                            const MlaQueryKeys& keys, const MlaAbsorbedArgs& args,
                            std::span<std::byte> workspace) {
  const SplitKernel& kernel = split_kernel();
  const int64_t r_kv = cache.layout.latent_dim, d_r = cache.layout.rope_dim;
  const int64_t width = r_kv + d_r, num_heads = args.num_heads;
  const int64_t num_queries = keys.num_queries();
  const int64_t max_splits = max_splits_per_query(ctx, num_queries);
  const int64_t num_threads = std::max(ctx.num_threads, 1);
  const int64_t partial_elems = num_heads * (r_kv + 2);  // acc [H, r_kv], then m [H], l [H]
  const size_t split_scratch_bytes = align64(kernel.scratch_bytes(cache.layout, num_heads));

  Carver carver(workspace);
  float* partials = carver.take<float>(num_queries * max_splits * partial_elems);
  float* q_cat_all = carver.take<float>(num_threads * num_heads * width);
  std::byte* split_scratch_all =
      carver.take<std::byte>(num_threads * static_cast<int64_t>(split_scratch_bytes));

  // Work item (query, split): split s of query i covers key entries [s·n/S, (s+1)·n/S).
  auto num_splits = [&](int64_t i) {
    return std::clamp<int64_t>(detail::mla_num_key_entries(keys, i) / kMinKeysPerSplit, 1,
                               max_splits);
  };
  // Scores and values over r_kv + d_r channels per key entry and head (≈ 4 FLOPs per channel).
  int64_t total_entries = 0;
  for (int64_t i = 0; i < num_queries; ++i) total_entries += detail::mla_num_key_entries(keys, i);
  const int64_t item_flops = total_entries * num_heads * width * 4 / (num_queries * max_splits);
  const int64_t grain = grain_for_work(item_flops, kMinParallelFlops);
  parallel_for(ctx, num_queries * max_splits, grain, [&](int64_t begin, int64_t end) {
    // Per-thread scratch: the kernels are not called from inside another parallel region.
    const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
    DZ_DCHECK(thread < num_threads, "thread {} of {}", thread, num_threads);
    float* q_cat = q_cat_all + thread * num_heads * width;
    const std::span<std::byte> split_scratch(split_scratch_all + thread * split_scratch_bytes,
                                             split_scratch_bytes);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / max_splits, split = item % max_splits;
      const int64_t splits = num_splits(i);
      if (split >= splits) continue;
      const int64_t num_entries = detail::mla_num_key_entries(keys, i);
      for (int64_t h = 0; h < num_heads; ++h) {  // q_cat [H, r_kv + d_r] = [q_abs ; q_pe]
        std::copy_n(args.q_abs + (i * num_heads + h) * r_kv, r_kv, q_cat + h * width);
        std::copy_n(args.q_pe + i * args.q_pe_token_stride + h * args.q_pe_head_stride, d_r,
                    q_cat + h * width + r_kv);
      }
      float* acc = partials + item * partial_elems;
      kernel.run({.cache = &cache,
                  .keys = &keys,
                  .query = i,
                  .entry_begin = split * num_entries / splits,
                  .entry_end = (split + 1) * num_entries / splits,
                  .num_heads = num_heads,
                  .softmax_scale = args.softmax_scale,
                  .q_cat = q_cat,
                  .acc = acc,
                  .m = acc + num_heads * r_kv,
                  .l = acc + num_heads * r_kv + num_heads},
                 split_scratch);
    }
  });

  // Merge the splits of each query: o = Σ_s acc_s·e^(m_s − M) / Σ_s l_s·e^(m_s − M).
  parallel_for(ctx, num_queries * num_heads, 16, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / num_heads, h = item % num_heads;
      const int64_t splits = num_splits(i);
      float* o = args.o_lat + (i * num_heads + h) * r_kv;
      float max_m = kNegInf;
      for (int64_t s = 0; s < splits; ++s)
        max_m =
            std::max(max_m, partials[(i * max_splits + s) * partial_elems + num_heads * r_kv + h]);
      DZ_CHECK(max_m != kNegInf, "query {} has no keys", i);
      std::fill_n(o, r_kv, 0.0f);
      float total = 0;
      for (int64_t s = 0; s < splits; ++s) {
        const float* part = partials + (i * max_splits + s) * partial_elems;
        const float m_s = part[num_heads * r_kv + h], l_s = part[num_heads * r_kv + num_heads + h];
        if (m_s == kNegInf) continue;
        const float weight = std::exp(m_s - max_m);
        total += l_s * weight;
        for (int64_t c = 0; c < r_kv; ++c) o[c] += weight * part[h * r_kv + c];
      }
      const float inv_total = 1.0f / total;
      for (int64_t c = 0; c < r_kv; ++c) o[c] *= inv_total;
      if (args.lse != nullptr) args.lse[i * num_heads + h] = max_m + std::log(total);
    }
  });
}

namespace {

// out [kKeyBlock, cols] = latents [kKeyBlock, r_kv] · Wᵀ for W [cols, r_kv] (W_UK or W_UV, all
// heads), an FP32 GEMM through oneDNN: not rounded, so that the prefill form agrees with the
// absorbed one to FP32 precision. Key by key this was a GEMV per head re-reading W from L2 (about
// 9 % of a 512-token prefill of the V2-Lite shape on Zen 5). Primitives by (r_kv, cols), per
// thread.
void up_project(const ExecContext& ctx, const float* latents, const float* w, int64_t r_kv,
                int64_t cols, float* out) {
  thread_local std::map<int64_t, detail::MatmulCache> caches;  // by r_kv
  detail::OmpThreads threads(ctx.num_threads);
  caches[r_kv].run({.num_tokens = kKeyBlock,
                    .in_features = r_kv,
                    .cols = cols,
                    .y_stride = cols,
                    .f32 = true,
                    .x = latents,
                    .weights_desc = detail::tile_weights_desc(r_kv, cols, true),
                    .weights = w,
                    .y = out});
}

// BF16 codes to FP32 (exact).
void widen_bf16(const ExecContext& ctx, const uint16_t* codes, int64_t n, float* out) {
  parallel_for(ctx, n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = formats::decode_bf16(codes[i]);
  });
}

}  // namespace

size_t mla_prefill_workspace_bytes(const ExecContext& ctx, const MlaCacheLayout& layout,
                                   const MlaQueryKeys& keys, int64_t num_heads, int64_t nope_dim,
                                   int64_t v_dim) {
  const int64_t width = layout.latent_dim + layout.rope_dim;
  const int64_t num_queries = keys.num_queries();
  const int64_t num_threads = std::max(ctx.num_threads, 1);
  return align64(static_cast<size_t>(num_queries * num_heads * (v_dim + 2)) * 4) +  // state
         align64(static_cast<size_t>(num_queries * keys.selection_width) * 4) +     // sorted
         align64(static_cast<size_t>(num_queries) * 8) +                            // cursors
         align64(static_cast<size_t>(kKeyBlock * width) * 4) +                      // records
         align64(static_cast<size_t>(kKeyBlock * layout.latent_dim) * 4) +          // latents
         align64(static_cast<size_t>(num_heads * kKeyBlock * (nope_dim + v_dim)) * 4) +
         align64(static_cast<size_t>(num_threads * prefill_thread_floats(v_dim)) * 4) +
         align64(static_cast<size_t>(num_heads * (nope_dim + v_dim) * layout.latent_dim) * 4);
}

void mla_attention_prefill(const ExecContext& ctx, const MlaCacheView& cache,
                           const MlaQueryKeys& keys, const MlaPrefillArgs& args,
                           std::span<std::byte> workspace) {
  const detail::MlaVecOps& ops = detail::mla_vec_ops();
  const int64_t r_kv = cache.layout.latent_dim, d_r = cache.layout.rope_dim;
  const int64_t width = r_kv + d_r, num_heads = args.num_heads;
  const int64_t d_n = args.nope_dim, d_v = args.v_dim;
  const int64_t num_queries = keys.num_queries(), sel_width = keys.selection_width;
  const int64_t num_threads = std::max(ctx.num_threads, 1);
  const int64_t state_elems = num_heads * (d_v + 2);  // o [H, d_v], then m [H], l [H]

  Carver carver(workspace);
  float* state = carver.take<float>(num_queries * state_elems);
  int32_t* sorted = carver.take<int32_t>(num_queries * sel_width);
  int64_t* cursors = carver.take<int64_t>(num_queries);
  float* records = carver.take<float>(kKeyBlock * width);
  float* latents = carver.take<float>(kKeyBlock * r_kv);            // c_kv of each record
  float* k_nope = carver.take<float>(kKeyBlock * num_heads * d_n);  // [kKeyBlock, H, d_n]
  float* values = carver.take<float>(kKeyBlock * num_heads * d_v);  // [kKeyBlock, H, d_v]
  float* thread_scratch = carver.take<float>(num_threads * prefill_thread_floats(d_v));
  // W_UK and W_UV widened once per call for the FP32 GEMMs of every key block.
  float* w_uk = carver.take<float>(num_heads * d_n * r_kv);
  float* w_uv = carver.take<float>(num_heads * d_v * r_kv);
  widen_bf16(ctx, args.w_uk, num_heads * d_n * r_kv, w_uk);
  widen_bf16(ctx, args.w_uv, num_heads * d_v * r_kv, w_uv);

  // Key range [0, key_end); each query's selection sorted ascending with −1 dropped, so that a
  // key block meets a contiguous run of it.
  int64_t key_end = 0;
  for (int64_t i = 0; i < num_queries; ++i) {
    float* st = state + i * state_elems;
    std::fill_n(st, num_heads * d_v, 0.0f);
    std::fill_n(st + num_heads * d_v, num_heads, kNegInf);
    std::fill_n(st + num_heads * d_v + num_heads, num_heads, 0.0f);
    cursors[i] = 0;
    if (sel_width == 0) {
      key_end = std::max<int64_t>(key_end, keys.positions[static_cast<size_t>(i)] + 1);
      continue;
    }
    int32_t* row = sorted + i * sel_width;
    int64_t num_valid = 0;
    for (int64_t j = 0; j < sel_width; ++j) {
      const int32_t pos = keys.selection[static_cast<size_t>(i * sel_width + j)];
      DZ_DCHECK(pos <= keys.positions[static_cast<size_t>(i)], "selected a later position {}", pos);
      if (pos >= 0) row[num_valid++] = pos;
    }
    std::sort(row, row + num_valid);
    std::fill(row + num_valid, row + sel_width, std::numeric_limits<int32_t>::max());
    if (num_valid > 0) key_end = std::max<int64_t>(key_end, row[num_valid - 1] + 1);
  }

  for (int64_t block_begin = 0; block_begin < key_end; block_begin += kKeyBlock) {
    const int64_t block_keys = std::min(kKeyBlock, key_end - block_begin);
    const int64_t block_end = block_begin + block_keys;
    if (sel_width > 0) {  // skip a block no query selected from
      bool needed = false;
      for (int64_t i = 0; i < num_queries && !needed; ++i)
        needed = cursors[i] < sel_width && sorted[i * sel_width + cursors[i]] < block_end;
      if (!needed) continue;
    }
    for (int64_t k = 0; k < block_keys; ++k) {
      read_mla_record(cache.layout, cache.pool,
                      detail::mla_slot_of_position(cache, block_begin + k), records + k * width);
      std::copy_n(records + k * width, r_kv, latents + k * r_kv);
    }
    // A short last block: the GEMMs below always take kKeyBlock rows (one primitive per shape).
    std::fill(latents + block_keys * r_kv, latents + kKeyBlock * r_kv, 0.0f);
    up_project(ctx, latents, w_uk, r_kv, num_heads * d_n, k_nope);
    up_project(ctx, latents, w_uv, r_kv, num_heads * d_v, values);
    // Queries in groups of four share each key and value row read (ops.*_x4); a query's numbers
    // do not depend on its group. The group's keys run to its longest query's; the others' extra
    // scores are never used and their probabilities there are 0 (acc + 0 · v = acc). Causal
    // queries have more keys the later they come: chunks of four queries go to the workers in
    // turn (worker w: chunks w, w + W, …), so every key block's work is split evenly; contiguous
    // halves left the first thread waiting through the second half of a prompt's blocks.
    const int64_t num_chunks = (num_queries + 3) / 4;
    const int64_t num_workers = std::min(num_threads, num_chunks);
    parallel_for(ctx, num_workers, 1, [&](int64_t worker_begin, int64_t worker_end) {
      const int64_t thread = omp_in_parallel() ? omp_get_thread_num() : 0;
      float* scratch = thread_scratch + thread * prefill_thread_floats(d_v);
      float* scores[4];
      float* rope_scores[4];
      float* allowed[4];  // 1 allowed, 0 not
      for (int g = 0; g < 4; ++g) {
        scores[g] = scratch + g * 3 * kKeyBlock;
        rope_scores[g] = scores[g] + kKeyBlock;
        allowed[g] = rope_scores[g] + kKeyBlock;
      }
      int64_t group[4], group_keys[4];
      int group_size = 0;
      const auto run_group = [&] {
        int64_t max_keys = 0;
        for (int g = 0; g < group_size; ++g) max_keys = std::max(max_keys, group_keys[g]);
        const float* q_nope[4];
        const float* q_pe[4];
        const float* probabilities[4];
        float* acc[4];
        for (int64_t h = 0; h < num_heads; ++h) {
          for (int g = 0; g < 4; ++g) {  // a short group repeats its first query
            const int64_t i = group[g < group_size ? g : 0];
            q_nope[g] = args.q_nope + i * args.q_token_stride + h * args.q_head_stride;
            q_pe[g] = args.q_pe + i * args.q_token_stride + h * args.q_head_stride;
          }
          ops.dot_rows_x4(q_nope, k_nope + h * d_n, num_heads * d_n, max_keys, d_n, scores);
          ops.dot_rows_x4(q_pe, records + r_kv, width, max_keys, d_r, rope_scores);
          for (int g = 0; g < 4; ++g) {
            float* st = state + group[g < group_size ? g : 0] * state_elems;
            float* s = scores[g];
            const int64_t n = g < group_size ? group_keys[g] : 0;
            if (n > 0)
              ops.prefill_weights(s, rope_scores[g], allowed[g], n, args.softmax_scale,
                                  st[num_heads * d_v + h], st[num_heads * d_v + num_heads + h],
                                  st + h * d_v, d_v);
            std::fill(s + std::max<int64_t>(n, 0), s + max_keys, 0.0f);
            probabilities[g] = s;
            // The repeats of a short group accumulate into a scratch row nobody reads.
            acc[g] = g < group_size ? st + h * d_v : scratch + 4 * 3 * kKeyBlock;
          }
          ops.accumulate_rows_x4(probabilities, values + h * d_v, num_heads * d_v, max_keys, d_v,
                                 acc);
        }
        group_size = 0;
      };
      const auto add_query = [&](int64_t i) {
        float* allow = allowed[group_size];
        int64_t num_keys = 0;  // keys [block_begin, block_begin + num_keys) cover the allowed ones
        if (sel_width == 0) {
          num_keys = std::min(block_end, int64_t{keys.positions[static_cast<size_t>(i)]} + 1) -
                     block_begin;
          std::fill_n(allow, std::max<int64_t>(num_keys, 0), 1.0f);
        } else {
          std::fill_n(allow, block_keys, 0.0f);
          const int32_t* row = sorted + i * sel_width;
          for (int64_t& c = cursors[i]; c < sel_width && row[c] < block_end; ++c) {
            allow[row[c] - block_begin] = 1.0f;
            num_keys = row[c] - block_begin + 1;
          }
        }
        if (num_keys <= 0) return;
        group[group_size] = i;
        group_keys[group_size] = num_keys;
        if (++group_size == 4) run_group();
      };
      for (int64_t worker = worker_begin; worker < worker_end; ++worker)
        for (int64_t chunk = worker; chunk < num_chunks; chunk += num_workers)
          for (int64_t i = 4 * chunk; i < std::min(4 * chunk + 4, num_queries); ++i) add_query(i);
      if (group_size > 0) run_group();
    });
  }

  parallel_for(ctx, num_queries, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* st = state + i * state_elems;
      for (int64_t h = 0; h < num_heads; ++h) {
        const float l = st[num_heads * d_v + num_heads + h];
        DZ_CHECK(l > 0, "query {} has no keys", i);
        for (int64_t c = 0; c < d_v; ++c)
          args.out[(i * num_heads + h) * d_v + c] = st[h * d_v + c] / l;
      }
    }
  });
}

}  // namespace dz::kernels
