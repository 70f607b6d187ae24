// HybridModel's MTP head (model/mtp_layer.h, docs/models.md §7.1): the layer after the main ones
// that predicts token t+2, run after forward() on the final-norm rows forward() kept.

#include <algorithm>
#include <cstring>
#include <numeric>

#include "dayzero/kernels/norms.h"
#include "dayzero/model/hybrid_model.h"

namespace dz::model {
namespace {

Status no_mtp_layer() {
  return make_error(StatusCode::kUnsupported,
                    "this checkpoint has no MTP layer (num_nextn_predict_layers 0)");
}

}  // namespace

const std::vector<float>& HybridModel::gathered_final() {
  if (kept_step_ != nullptr) {  // every CP rank is here in the same MTP step: T·d·4 bytes
    std::vector<int64_t> every(static_cast<size_t>(kept_step_->batch.num_tokens()));
    std::iota(every.begin(), every.end(), int64_t{0});
    last_final_ = kept_step_->split->gather_rows(every, kept_step_->local_final.data(),
                                                 parts_.hidden_size, -1);
    kept_step_.reset();
  }
  return last_final_;
}

void HybridModel::run_mtp_layer(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                                float* x, TapSink* taps) {
  ensure_scratch(ctx, batch);
  if (batch.num_tokens() == 0) {
    parts_.mtp->layer.ffn_without_tokens(ctx, *scratch_);
    return;
  }
  run_plain(ctx, parts_.mtp->layer, batch, cache, x, taps);
}

Status HybridModel::forward_mtp(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                                std::span<const int64_t> logits_rows, float* out_logits,
                                TapSink* taps) {
  const int64_t T = batch.num_tokens();
  if (T > static_cast<int64_t>(last_positions_.size()) ||
      !std::equal(batch.positions.begin(), batch.positions.end(), last_positions_.begin()))
    return make_error(StatusCode::kInvalidArgument,
                      "forward_mtp: the batch's {} tokens must sit at the positions of the last "
                      "forward()'s first tokens ({} kept)",
                      T, last_positions_.size());
  if (!context_parallel())
    return mtp_logits(ctx, batch, cache, last_final_.data(), logits_rows, out_logits, taps);
  if (!has_mtp()) return no_mtp_layer();
  for (int64_t row : logits_rows)
    if (row < 0 || row >= T)
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, T);
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  if (T == 0) return Status::ok_status();
  // This rank's pieces of the MTP step, each token with the kept row of its position.
  const int64_t d = parts_.hidden_size;
  const std::vector<float>& kept = gathered_final();
  const ContextSplit split(batch, *parts_.cp_comm, parts_.cp_layout);
  const ForwardBatch& local = split.local();
  std::vector<float> main_final(static_cast<size_t>(local.num_tokens() * d));
  for (int64_t t = 0; t < local.num_tokens(); ++t)
    std::memcpy(main_final.data() + t * d, kept.data() + split.full_token(t) * d,
                static_cast<size_t>(d) * sizeof(float));
  const std::vector<float> z = mtp_hidden(ctx, local, cache, main_final.data(), taps);
  mtp_head(ctx, split.gather_rows(logits_rows, z.data(), d, -1),
           static_cast<int64_t>(logits_rows.size()), out_logits, taps);
  return Status::ok_status();
}

Status HybridModel::mtp_logits(const ExecContext& ctx, const ForwardBatch& batch, KvCache& cache,
                               const float* main_final, std::span<const int64_t> logits_rows,
                               float* out_logits, TapSink* taps) {
  if (!has_mtp()) return no_mtp_layer();
  for (int64_t row : logits_rows)
    if (row < 0 || row >= batch.num_tokens())
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, batch.num_tokens());
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  const int64_t d = parts_.hidden_size;
  if (batch.num_tokens() == 0) {  // this rank's data-parallel group has no tokens: the MoE exchange
    last_mtp_rows_.clear();
    run_mtp_layer(ctx, batch, cache, nullptr, taps);
    return Status::ok_status();
  }
  const std::vector<float> z = mtp_hidden(ctx, batch, cache, main_final, taps);
  const auto num_rows = static_cast<int64_t>(logits_rows.size());
  std::vector<float> rows(static_cast<size_t>(num_rows * d));
  for (int64_t r = 0; r < num_rows; ++r)
    std::memcpy(rows.data() + r * d, z.data() + logits_rows[static_cast<size_t>(r)] * d,
                static_cast<size_t>(d) * sizeof(float));
  last_mtp_rows_ = rows;
  mtp_head(ctx, std::move(rows), num_rows, out_logits, taps);
  return Status::ok_status();
}

Status HybridModel::forward_mtp_chain(const ExecContext& ctx, const ForwardBatch& batch,
                                      KvCache& cache, float* out_logits, TapSink* taps) {
  if (!has_mtp()) return no_mtp_layer();
  if (context_parallel())
    return make_error(StatusCode::kUnsupported,
                      "the chained MTP head is not built under context parallelism");
  const int64_t d = parts_.hidden_size;
  const int64_t T = batch.num_tokens();
  if (T * d != static_cast<int64_t>(last_mtp_rows_.size()))
    return make_error(StatusCode::kInvalidArgument,
                      "forward_mtp_chain: {} tokens for {} rows of the last MTP call", T,
                      static_cast<int64_t>(last_mtp_rows_.size()) / d);
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  if (T == 0) {  // this rank's data-parallel group has no tokens: the MoE exchange
    run_mtp_layer(ctx, batch, cache, nullptr, taps);
    return Status::ok_status();
  }
  std::vector<float> z = mtp_hidden(ctx, batch, cache, last_mtp_rows_.data(), taps);
  last_mtp_rows_ = z;
  mtp_head(ctx, std::move(z), T, out_logits, taps);
  return Status::ok_status();
}

std::vector<float> HybridModel::mtp_hidden(const ExecContext& ctx, const ForwardBatch& batch,
                                           KvCache& cache, const float* main_final, TapSink* taps) {
  const MtpLayer& mtp = *parts_.mtp;
  const int64_t T = batch.num_tokens();
  const int64_t d = parts_.hidden_size;
  const float eps = mtp.layer.norm_eps;
  // z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]), embedding first.
  std::vector<float> e(static_cast<size_t>(T * d));
  std::vector<float> h(static_cast<size_t>(T * d));
  embed(mtp.embed_tokens ? *mtp.embed_tokens : parts_.embed_tokens, batch.token_ids, e.data());
  rms_norm_bf16(ctx, e.data(), mtp.enorm, e.data(), T, d, eps);
  rms_norm_bf16(ctx, main_final, mtp.hnorm, h.data(), T, d, eps);
  std::vector<float> eh(static_cast<size_t>(T * 2 * d));  // [T, 2d]
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(eh.data() + t * 2 * d, e.data() + t * d, static_cast<size_t>(d) * sizeof(float));
    std::memcpy(eh.data() + t * 2 * d + d, h.data() + t * d,
                static_cast<size_t>(d) * sizeof(float));
  }
  std::vector<float> z(static_cast<size_t>(T * d));
  mtp.eh_proj.forward(ctx, eh.data(), T, z.data());
  kernels::round_to_bf16(z.data(), T * d);
  tap(taps, mtp.layer.layer_id, "mtp_input", z.data(), {T, d});
  run_mtp_layer(ctx, batch, cache, z.data(), taps);
  return z;
}

void HybridModel::mtp_head(const ExecContext& ctx, std::vector<float> rows, int64_t num_rows,
                           float* out_logits, TapSink* taps) const {
  const MtpLayer& mtp = *parts_.mtp;
  const int64_t d = parts_.hidden_size;
  rms_norm_bf16(ctx, rows.data(), mtp.shared_head_norm, rows.data(), num_rows, d,
                mtp.layer.norm_eps);
  tap(taps, mtp.layer.layer_id, "final_norm", rows.data(), {num_rows, d});
  head_logits(ctx, mtp.head ? *mtp.head : parts_.lm_head, rows.data(), num_rows, out_logits);
  tap(taps, mtp.layer.layer_id, "logits", out_logits, {num_rows, parts_.vocab_size});
}

}  // namespace dz::model
