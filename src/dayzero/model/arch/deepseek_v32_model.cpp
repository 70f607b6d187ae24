#include "dayzero/model/arch/deepseek_v32_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "dayzero/core/check.h"
#include "dayzero/kernels/norms.h"
#include "dayzero/kernels/rope.h"
#include "dayzero/model/tensor_table_builder.h"

namespace dz::model {
namespace {

kernels::RopeFrequencies rope_frequencies(const DeepseekV32Config& c) {
  if (!c.rope_scaling) return kernels::plain_rope_frequencies(c.qk_rope_head_dim, c.rope_theta);
  const formats::RopeScaling& r = *c.rope_scaling;
  return kernels::yarn_rope_frequencies(
      c.qk_rope_head_dim, c.rope_theta,
      {.factor = r.factor,
       .original_max_position_embeddings = r.original_max_position_embeddings,
       .beta_fast = r.beta_fast,
       .beta_slow = r.beta_slow,
       .mscale = r.mscale,
       .mscale_all_dim = r.mscale_all_dim});
}

// y = round_bf16(RMSNorm(x)) over num_rows rows of width dim (docs/models.md §1.1: FP32, rounded
// once).
void rms_norm_bf16(const ExecContext& ctx, const float* x, const std::vector<float>& weight,
                   float* y, int64_t num_rows, int64_t dim, float eps) {
  kernels::rms_norm(ctx, x, dim, weight.data(), y, dim, num_rows, dim, eps);
  kernels::round_to_bf16(y, num_rows * dim);
}

}  // namespace

MlaConfig deepseek_v32_mla_config(const DeepseekV32Config& c) {
  // softmax_scale = (d_n + d_r)^(−1/2) · M(s, mscale_all_dim)², docs/models.md §1.3.
  double mscale = c.rope_scaling
                      ? kernels::yarn_mscale(c.rope_scaling->factor, c.rope_scaling->mscale_all_dim)
                      : 1.0;
  double scale = std::pow(static_cast<double>(c.qk_nope_head_dim + c.qk_rope_head_dim), -0.5) *
                 mscale * mscale;
  return MlaConfig{
      .hidden_size = c.hidden_size,
      .num_heads = c.num_attention_heads,
      .q_lora_rank = c.q_lora_rank,
      .kv_lora_rank = c.kv_lora_rank,
      .qk_nope_head_dim = c.qk_nope_head_dim,
      .qk_rope_head_dim = c.qk_rope_head_dim,
      .v_head_dim = c.v_head_dim,
      .softmax_scale = static_cast<float>(scale),
      .q_norm_eps = static_cast<float>(c.rms_norm_eps),
      .kv_norm_eps = static_cast<float>(c.rms_norm_eps),
      .rope = rope_frequencies(c),
      .output_gate = false,
  };
}

DsaIndexerConfig deepseek_v32_indexer_config(const DeepseekV32Config& c) {
  return DsaIndexerConfig{
      .hidden_size = c.hidden_size,
      .q_lora_rank = c.q_lora_rank,
      .index_n_heads = c.index_n_heads,
      .index_head_dim = c.index_head_dim,
      .index_topk = c.index_topk,
      .rope = rope_frequencies(c),
      .rope_layout = c.indexer_rope_interleave ? kernels::RopeLayout::kInterleaved
                                               : kernels::RopeLayout::kRotateHalf,
      .k_norm_eps = 1e-6f,
  };
}

MoeConfig deepseek_v32_moe_config(const DeepseekV32Config& c) {
  return MoeConfig{
      .num_experts = c.n_routed_experts,
      .num_experts_per_tok = c.num_experts_per_tok,
      .n_group = c.n_group,
      .topk_group = c.topk_group,
      .norm_topk_prob = c.norm_topk_prob,
      .routed_scaling_factor = static_cast<float>(c.routed_scaling_factor),
      .renorm_epsilon = 0.0f,
      .activation = MlpActivation{},  // SwiGLU
      .latent_norm_eps = 0.0f,        // no latent MoE
      .hidden_size = c.hidden_size,
      .intermediate_size = c.moe_intermediate_size,
      .num_shared_experts = c.n_shared_experts,
  };
}

namespace {

DecoderLayerConfig layer_config(const DeepseekV32Config& c, const LayerSpec& spec) {
  DecoderLayerConfig layer{.spec = spec,
                           .hidden_size = c.hidden_size,
                           .norm_eps = static_cast<float>(c.rms_norm_eps),
                           .mla = deepseek_v32_mla_config(c),
                           .indexer = deepseek_v32_indexer_config(c),
                           .dense_intermediate_size = c.intermediate_size};
  if (spec.ffn == FfnKind::kMoe) layer.moe = deepseek_v32_moe_config(c);
  return layer;
}

}  // namespace

struct DeepseekV32Model::Mtp {
  std::vector<float> enorm;             // [d], on the embedding of x_{t+1}
  std::vector<float> hnorm;             // [d], on the main hidden state h_t
  kernels::LinearWeight eh_proj;        // [d, 2d], input [enorm(e) ; hnorm(h)]
  std::vector<float> shared_head_norm;  // [d]
  // The published embed_tokens / shared_head.head are copies of the main ones (docs/models.md
  // §7.1): loaded only when their bytes differ.
  std::optional<Embedding> embed_tokens;
  std::optional<kernels::LinearWeight> head;
  DecoderLayer layer;
};

namespace {

struct DeepseekV32Weights {
  HybridModelParts parts;                   // the globals
  std::vector<DecoderLayerWeights> layers;  // main layers, then the visited MTP layers
  std::vector<DeepseekV32Model::Mtp> mtp;   // the MTP layers' own tensors
};

// The model's tensors: globals, the main layers, then `num_mtp_layers` MTP layers, each a decoder
// layer plus its own tensors (eh_proj's dtype is (unverified): FP8 or plain accepted).
void visit_deepseek_v32(TensorVisitor& v, const DeepseekV32Config& c, const std::string& prefix,
                        int64_t num_mtp_layers, DeepseekV32Weights& w) {
  using Scope = TensorVisitor::Scope;
  const int64_t d = c.hidden_size;
  Scope root(v, {.prefix = prefix});
  visit_model_globals(v, c.vocab_size, d, c.tie_word_embeddings, w.parts);
  const std::string main_embedding = v.full_name("model.embed_tokens.weight");
  const std::string main_head =
      v.full_name(c.tie_word_embeddings ? "model.embed_tokens" : "lm_head");
  const LayerSchedule schedule = deepseek_v32_schedule(c);
  const auto num_layers = static_cast<size_t>(c.num_hidden_layers + num_mtp_layers);
  w.layers.resize(num_layers);
  w.mtp.resize(static_cast<size_t>(num_mtp_layers));
  for (size_t i = 0; i < num_layers; ++i) {
    const LayerSpec& spec = schedule.layers[i];
    visit_decoder_layer_tensors(v, layer_config(c, spec), w.layers[i]);
    if (!spec.is_mtp) continue;
    DeepseekV32Model::Mtp& mtp = w.mtp[i - static_cast<size_t>(c.num_hidden_layers)];
    Scope layer(v, {.prefix = decoder_layer_prefix(spec.layer_id),
                    .component = Component::kMtp,
                    .layer_id = spec.layer_id,
                    .is_mtp = true});
    v.floats("enorm.weight", {d}, DType::kBF16, Split::kReplicated, mtp.enorm);
    v.floats("hnorm.weight", {d}, DType::kBF16, Split::kReplicated, mtp.hnorm);
    v.linear("eh_proj", d, 2 * d, Split::kReplicated, Quantizable::kYes, mtp.eh_proj);
    v.floats("shared_head.norm.weight", {d}, DType::kBF16, Split::kReplicated,
             mtp.shared_head_norm);
    v.embedding_copy("embed_tokens.weight", c.vocab_size, d, main_embedding, mtp.embed_tokens);
    v.linear_copy("shared_head.head", c.vocab_size, d, main_head, mtp.head);
  }
}

}  // namespace

TensorTable deepseek_v32_tensors(const DeepseekV32Config& c, const std::string& prefix) {
  const formats::QuantizationConfig& q = c.quantization_config;
  const bool fp8 = q.method == formats::QuantMethod::kFp8Block;
  TensorTableBuilder builder(TensorTable(fp8 ? q.block_rows : 128, fp8 ? q.block_cols : 128, 32),
                             [fp8](Component component) {
                               if (!fp8) return WeightFormat::kPlain;
                               return component == Component::kMtp ? WeightFormat::kFp8BlockOrPlain
                                                                   : WeightFormat::kFp8Block;
                             });
  DeepseekV32Weights declared;
  visit_deepseek_v32(builder, c, prefix, c.num_nextn_predict_layers, declared);
  return std::move(builder).take();
}

DeepseekV32Model::DeepseekV32Model(HybridModelParts parts, DeepseekV32Config config)
    : HybridModel(std::move(parts)), config_(std::move(config)) {}

DeepseekV32Model::~DeepseekV32Model() = default;

Result<std::unique_ptr<DeepseekV32Model>> DeepseekV32Model::load(
    const DeepseekV32Config& config, const std::string& prefix,
    std::unique_ptr<formats::Checkpoint> checkpoint, const ModelOptions& options) {
  const RankShard shard = RankShard::of(options.plan, options.rank);
  WeightLoader loader(*checkpoint, config.quantization_config);
  WeightReader reader(loader, shard);
  DeepseekV32Weights w;
  const int64_t mtp_layers = std::min<int64_t>(config.num_nextn_predict_layers, 1);
  visit_deepseek_v32(reader, config, prefix, mtp_layers, w);
  DZ_RETURN_IF_ERROR(reader.status());

  HybridModelParts parts = std::move(w.parts);
  parts.vocab_size = config.vocab_size;
  parts.hidden_size = config.hidden_size;
  parts.final_norm_eps = static_cast<float>(config.rms_norm_eps);
  parts.kv_cache_dtype = options.kv_cache_dtype.value_or(kernels::KvCacheDtype::kFp8);
  const LayerSchedule schedule = deepseek_v32_schedule(config);
  parts.comm = options.tp_group();
  parts.cp_comm = options.cp_group();
  parts.cp_layout = options.cp_layout;
  for (size_t i = 0; i < static_cast<size_t>(config.num_hidden_layers); ++i)
    parts.layers.push_back(make_decoder_layer(layer_config(config, schedule.layers[i]),
                                              std::move(w.layers[i]), shard, options.tp_group(),
                                              options.expert_group()));
  parts.checkpoint = std::move(checkpoint);
  std::unique_ptr<DeepseekV32Model> m(new DeepseekV32Model(std::move(parts), config));
  if (!w.mtp.empty()) {
    auto mtp = std::make_unique<Mtp>(std::move(w.mtp.front()));
    const size_t l = static_cast<size_t>(config.num_hidden_layers);
    mtp->layer =
        make_decoder_layer(layer_config(config, schedule.layers[l]), std::move(w.layers[l]), shard,
                           options.tp_group(), options.expert_group());
    m->add_extra_layer(&mtp->layer);  // its caches follow the main layers'
    m->mtp_ = std::move(mtp);
  }
  return m;
}

void DeepseekV32Model::keep_final_norm(const ForwardBatch& batch, std::vector<float>& normed) {
  if (mtp_ == nullptr) return;
  last_final_ = std::move(normed);
  last_positions_.assign(batch.positions.begin(), batch.positions.end());
}

Status DeepseekV32Model::forward_mtp(const ExecContext& ctx, const ForwardBatch& batch,
                                     KvCache& cache, std::span<const int64_t> logits_rows,
                                     float* out_logits, TapSink* taps) {
  const int64_t T = batch.num_tokens();
  if (T > static_cast<int64_t>(last_positions_.size()) ||
      !std::equal(batch.positions.begin(), batch.positions.end(), last_positions_.begin()))
    return make_error(StatusCode::kInvalidArgument,
                      "forward_mtp: the batch's {} tokens must sit at the positions of the last "
                      "forward()'s first tokens ({} kept)",
                      T, last_positions_.size());
  if (!context_parallel())
    return mtp_logits(ctx, batch, cache, last_final_.data(), logits_rows, out_logits, taps);
  if (mtp_ == nullptr)
    return make_error(StatusCode::kUnsupported, "this checkpoint has no MTP layer");
  for (int64_t row : logits_rows)
    if (row < 0 || row >= T)
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, T);
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  if (T == 0) return Status::ok_status();
  // This rank's pieces of the MTP step, each token with the kept row of its position.
  const int64_t d = config_.hidden_size;
  const ContextSplit split(batch, cp_comm(), cp_layout());
  const ForwardBatch& local = split.local();
  std::vector<float> main_final(static_cast<size_t>(local.num_tokens() * d));
  for (int64_t t = 0; t < local.num_tokens(); ++t)
    std::memcpy(main_final.data() + t * d, last_final_.data() + split.full_token(t) * d,
                static_cast<size_t>(d) * sizeof(float));
  const std::vector<float> z = mtp_hidden(ctx, local, cache, main_final.data(), taps);
  mtp_head(ctx, split.gather_rows(logits_rows, z.data(), d, -1),
           static_cast<int64_t>(logits_rows.size()), out_logits, taps);
  return Status::ok_status();
}

Status DeepseekV32Model::mtp_logits(const ExecContext& ctx, const ForwardBatch& batch,
                                    KvCache& cache, const float* main_final,
                                    std::span<const int64_t> logits_rows, float* out_logits,
                                    TapSink* taps) {
  if (mtp_ == nullptr)
    return make_error(StatusCode::kUnsupported,
                      "this checkpoint has no MTP layer "
                      "(num_nextn_predict_layers 0)");
  for (int64_t row : logits_rows)
    if (row < 0 || row >= batch.num_tokens())
      return make_error(StatusCode::kInvalidArgument, "logits row {} outside the batch's {} tokens",
                        row, batch.num_tokens());
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  const int64_t d = config_.hidden_size;
  if (batch.num_tokens() == 0) {  // this rank's data-parallel group has no tokens: the MoE exchange
    last_mtp_rows_.clear();
    run_extra_layer(ctx, mtp_->layer, batch, cache, nullptr, taps);
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

Status DeepseekV32Model::forward_mtp_chain(const ExecContext& ctx, const ForwardBatch& batch,
                                           KvCache& cache, float* out_logits, TapSink* taps) {
  if (mtp_ == nullptr)
    return make_error(StatusCode::kUnsupported,
                      "this checkpoint has no MTP layer (num_nextn_predict_layers 0)");
  if (context_parallel())
    return make_error(StatusCode::kUnsupported,
                      "the chained MTP head is not built under context parallelism");
  const int64_t d = config_.hidden_size;
  const int64_t T = batch.num_tokens();
  if (T * d != static_cast<int64_t>(last_mtp_rows_.size()))
    return make_error(StatusCode::kInvalidArgument,
                      "forward_mtp_chain: {} tokens for {} rows of the last MTP call", T,
                      static_cast<int64_t>(last_mtp_rows_.size()) / d);
  DZ_RETURN_IF_ERROR(check_batch(batch, cache));
  if (T == 0) {  // this rank's data-parallel group has no tokens: the MoE exchange
    run_extra_layer(ctx, mtp_->layer, batch, cache, nullptr, taps);
    return Status::ok_status();
  }
  std::vector<float> z = mtp_hidden(ctx, batch, cache, last_mtp_rows_.data(), taps);
  last_mtp_rows_ = z;
  mtp_head(ctx, std::move(z), T, out_logits, taps);
  return Status::ok_status();
}

std::vector<float> DeepseekV32Model::mtp_hidden(const ExecContext& ctx, const ForwardBatch& batch,
                                                KvCache& cache, const float* main_final,
                                                TapSink* taps) {
  const int64_t T = batch.num_tokens();
  const int64_t d = config_.hidden_size;
  const auto eps = static_cast<float>(config_.rms_norm_eps);
  // z = eh_proj([enorm(Emb(x_{t+1})) ; hnorm(h_t)]), embedding first.
  std::vector<float> e(static_cast<size_t>(T * d));
  std::vector<float> h(static_cast<size_t>(T * d));
  embed(mtp_->embed_tokens ? *mtp_->embed_tokens : embed_tokens(), batch.token_ids, e.data());
  rms_norm_bf16(ctx, e.data(), mtp_->enorm, e.data(), T, d, eps);
  rms_norm_bf16(ctx, main_final, mtp_->hnorm, h.data(), T, d, eps);
  std::vector<float> eh(static_cast<size_t>(T * 2 * d));  // [T, 2d]
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(eh.data() + t * 2 * d, e.data() + t * d, static_cast<size_t>(d) * sizeof(float));
    std::memcpy(eh.data() + t * 2 * d + d, h.data() + t * d,
                static_cast<size_t>(d) * sizeof(float));
  }
  std::vector<float> z(static_cast<size_t>(T * d));
  mtp_->eh_proj.forward(ctx, eh.data(), T, z.data());
  kernels::round_to_bf16(z.data(), T * d);
  tap(taps, mtp_->layer.layer_id, "mtp_input", z.data(), {T, d});
  run_extra_layer(ctx, mtp_->layer, batch, cache, z.data(), taps);
  return z;
}

void DeepseekV32Model::mtp_head(const ExecContext& ctx, std::vector<float> rows, int64_t num_rows,
                                float* out_logits, TapSink* taps) const {
  const int64_t d = config_.hidden_size;
  const int mtp_layer_id = mtp_->layer.layer_id;
  rms_norm_bf16(ctx, rows.data(), mtp_->shared_head_norm, rows.data(), num_rows, d,
                static_cast<float>(config_.rms_norm_eps));
  tap(taps, mtp_layer_id, "final_norm", rows.data(), {num_rows, d});
  if (mtp_->head) {
    head_logits(ctx, *mtp_->head, rows.data(), num_rows, out_logits);
  } else {
    std::vector<int64_t> picked(static_cast<size_t>(num_rows));
    for (int64_t r = 0; r < num_rows; ++r) picked[static_cast<size_t>(r)] = r;
    lm_head(ctx, rows.data(), picked, out_logits);
  }
  tap(taps, mtp_layer_id, "logits", out_logits, {num_rows, config_.vocab_size});
}

}  // namespace dz::model
