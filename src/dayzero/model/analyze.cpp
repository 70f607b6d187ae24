#include "dayzero/model/analyze.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "dayzero/dist/comm.h"
#include "dayzero/formats/json_text.h"
#include "dayzero/kernels/paged_cache.h"
#include "dayzero/model/blocks/kda.h"
#include "dayzero/model/registry.h"

namespace dz::model {
namespace {

// The batch's sequences spread over the ep data-parallel groups; the busiest group's share.
int64_t sequences_per_group(const AnalyzeOptions& o) {
  return (o.batch + o.plan.ep - 1) / o.plan.ep;
}

void count_layers(const LayerSchedule& schedule, Analysis& a) {
  a.num_main_layers = schedule.num_main_layers();
  a.num_mtp_layers = schedule.num_mtp_layers();
  a.mla_layers = schedule.count(AttentionKind::kMla);
  a.mla_dsa_layers = schedule.count(AttentionKind::kMlaDsa);
  a.kda_layers = schedule.count(AttentionKind::kKda);
  a.dense_mlp_layers = schedule.count(FfnKind::kDenseMlp);
  a.moe_layers = schedule.count(FfnKind::kMoe);
  a.latent_moe_layers = schedule.count(FfnKind::kLatentMoe);
  for (const LayerSpec& layer : schedule.layers)
    a.attn_res_layers += !layer.is_mtp && layer.attn_res;
  a.pattern = describe_schedule(schedule);
  a.mixer_period = mixer_period(schedule);
}

void count_caches(const ModelDims& d, const AnalyzeOptions& o, Analysis& a) {
  const int mla = a.mla_layers + a.mla_dsa_layers;
  const kernels::MlaCacheLayout bf16{.latent_dim = d.kv_lora_rank,
                                     .rope_dim = d.qk_rope_head_dim,
                                     .dtype = kernels::KvCacheDtype::kBf16};
  kernels::MlaCacheLayout fp8 = bf16;
  fp8.dtype = kernels::KvCacheDtype::kFp8;
  const bool fp8_fits = d.kv_lora_rank % 128 == 0;
  a.mla_bytes_per_token_bf16 = mla * bf16.record_bytes();
  a.mla_bytes_per_token_fp8 = fp8_fits ? mla * fp8.record_bytes() : 0;
  // One FP8 key and its FP32 scale per pool of index_kpool tokens.
  a.index_bytes_per_token = a.mla_dsa_layers * (d.index_head_dim + 4) / d.index_kpool;
  if (d.kda_heads > 0 && d.kda_heads % o.plan.tp == 0) {
    const KdaStateLayout state{.num_heads = d.kda_heads / o.plan.tp,
                               .head_dim = d.kda_head_dim,
                               .conv_width = d.kda_conv_size};
    a.state_bytes_per_sequence = a.kda_layers * state.slot_bytes();
  }
  const int64_t per_token =
      (fp8_fits ? a.mla_bytes_per_token_fp8 : a.mla_bytes_per_token_bf16) + a.index_bytes_per_token;
  const int64_t sequences = sequences_per_group(o);
  // Under context parallelism each CP rank stores every cp-th block (docs/parallel.md §9.4); the
  // recurrent states are kept whole on every rank.
  a.cache_bytes_per_rank = (o.context * sequences * per_token + o.plan.cp - 1) / o.plan.cp +
                           sequences * a.state_bytes_per_sequence;
}

// The collectives of one step of T tokens, `rows` of which ask for logits.
std::vector<CommLine> step_comm(const ModelDims& d, const Analysis& a, const ParallelPlan& plan,
                                int64_t step_tokens, int64_t rows, bool prefill) {
  std::vector<CommLine> lines;
  auto add = [&](std::string dimension, std::string what, std::string formula, int64_t per_layer,
                 int64_t layers, bool implemented) {
    if (layers == 0) return;
    lines.push_back({.dimension = std::move(dimension),
                     .what = std::move(what),
                     .formula = std::move(formula),
                     .bytes_per_layer = per_layer,
                     .layers = layers,
                     .bytes_per_step = per_layer * layers,
                     .implemented = implemented});
  };
  const int64_t h = d.hidden_size;
  // Under context parallelism a prompt of T tokens is cut into 2·cp pieces; rank 0 runs pieces 0
  // and 2cp−1 (zigzag), so its TP collectives carry those tokens.
  const int64_t pieces = 2 * int64_t{plan.cp};
  const auto piece_tokens = [&](int64_t j) {
    return step_tokens * (j + 1) / pieces - step_tokens * j / pieces;
  };
  const bool split = plan.cp > 1 && prefill && step_tokens >= pieces;
  const int64_t tokens = split ? piece_tokens(0) + piece_tokens(pieces - 1) : step_tokens;
  const int64_t others_tokens = step_tokens - tokens;  // what rank 0 gathers
  if (plan.tp > 1) {
    // Rank 0's share; every rank receives the same where tp divides T·h.
    const int64_t reduce =
        dist::all_reduce_received_bytes(tokens * h, plan.tp, 0, dist::WireType::kF32);
    const std::string formula = "2(tp-1)/tp * T * h * 4";
    const bool built = a.runnable;  // the forward splits every runnable model by --tp
    add("tp", "all-reduce after the embedding (rows split by vocabulary)", formula, reduce, 1,
        built);
    add("tp", "all-reduce after o_proj (MLA and KDA heads split)", formula, reduce,
        a.num_main_layers, built);
    add("tp", "all-reduce after the FFN (dense MLP, shared experts, this rank's routed experts)",
        formula, reduce, a.num_main_layers, built);
    // Latent MoE: the routed sum [T, r] is reduced before its norm (its experts live on every
    // rank).
    add("tp", "all-reduce of the latent routed sum (latent MoE, before its norm)",
        "2(tp-1)/tp * T * h_r * 4",
        dist::all_reduce_received_bytes(tokens * d.routed_hidden_size, plan.tp, 0,
                                        dist::WireType::kF32),
        a.latent_moe_layers, built);
    add("tp", "logit columns all-gathered (head split by vocabulary)", "(tp-1)/tp * R * V * 4",
        (plan.tp - 1) * rows * (d.vocab_size / plan.tp) * 4, 1, built);
  }
  const int moe = a.moe_layers + a.latent_moe_layers;
  if (plan.ep > 1 && moe > 0) {
    // Experts spread over all tp·ep ranks; each rank of a TP group sends its 1/tp share of the
    // group's tokens once to every other rank holding one of their experts.
    const int ranks = plan.tp * plan.ep;
    const int64_t hr = d.routed_hidden_size;
    const int64_t k = d.num_experts_per_token;
    const double remote = expected_remote_ranks(d.num_routed_experts, k, ranks);
    const double local_tokens = static_cast<double>(tokens) / plan.tp;
    // First every rank's byte count for every other (8 B each); then per (token, remote rank)
    // the BF16 activations and the choice count, per expert choice on a remote rank its id and
    // FP32 weight. Means over the ranks where tp does not divide T.
    const auto dispatch =
        (ranks - 1) * 8 + static_cast<int64_t>(std::llround(
                              local_tokens * (remote * static_cast<double>(hr * 2 + 4) +
                                              static_cast<double>(k * 8 * (ranks - 1)) / ranks)));
    const auto combine =
        static_cast<int64_t>(std::llround(local_tokens * remote * static_cast<double>(hr * 4)));
    add("ep",
        fmt::format("dispatch to the experts' ranks (r = {:.2f} other ranks per token)", remote),
        "(N-1)*8 + T/tp * (r * (h_r*2 + 4) + k*8*(N-1)/N), N = tp*ep", dispatch, moe, a.runnable);
    add("ep", "combine: weighted FP32 outputs back to the token's rank", "T/tp * r * h_r * 4",
        combine, moe, a.runnable);
  }
  const int mla = a.mla_layers + a.mla_dsa_layers;
  const bool fp8 = d.mla_cache_fp8 && d.kv_lora_rank % 128 == 0;  // the recipe's default cache
  const int64_t record =
      mla > 0 ? (fp8 ? a.mla_bytes_per_token_fp8 : a.mla_bytes_per_token_bf16) / mla : 0;
  const int64_t local_heads = d.kda_heads / plan.tp, kda_d = d.kda_head_dim;
  if (split) {
    add("cp", "all-gather of the other pieces' latent records", "(T - T_0) * b_kv",
        others_tokens * record, mla, a.runnable);
    add("cp", "all-gather of the other pieces' indexer keys", "(T - T_0) * (d_I + 4)",
        others_tokens * (d.index_head_dim + 4), a.mla_dsa_layers, a.runnable);
    add("cp", "all-gather of the KDA pieces' last W-1 pre-conv rows (q, k, v)",
        "2 * (cp-1) * 3 * (W-1) * H/tp * d * 4",
        2 * (plan.cp - 1) * 3 * (d.kda_conv_size - 1) * local_heads * kda_d * 4, a.kda_layers,
        a.runnable);
    add("cp", "all-gather of the KDA pieces' summaries [P | dX]", "2 * (cp-1) * H/tp * 2 * d^2 * 4",
        2 * (plan.cp - 1) * local_heads * 2 * kda_d * kda_d * 4, a.kda_layers, a.runnable);
    // The asked rows are the last R tokens; rank 0 ran the last piece (and the first).
    const int64_t rank0_rows = std::min(rows, piece_tokens(pieces - 1)) +
                               std::max<int64_t>(0, rows - (step_tokens - piece_tokens(0)));
    add("cp", "final-norm rows of the asked logits, from the ranks that ran them",
        "(R - R_0) * h * 4", (rows - rank0_rows) * h * 4, 1, a.runnable);
  }
  if (plan.cp > 1 && !prefill) {  // decode rows: each rank reads its own blocks' keys (DCP)
    add("cp", "all-gather of the partial outputs and their log-sum-exp (MLA)",
        "(cp-1) * B * H/tp * (r_kv + 1) * 4",
        (plan.cp - 1) * tokens * (d.mla_heads / plan.tp) * (d.kv_lora_rank + 1) * 4, mla,
        a.runnable);
    add("cp", "all-gather of the indexer's top-k (score, position) candidates",
        "(cp-1) * B * k * 8", (plan.cp - 1) * tokens * d.index_topk * 8, a.mla_dsa_layers,
        a.runnable);
  }
  return lines;
}

void list_requirements(const Architecture& arch, const std::string& refusal,
                       const formats::ConfigObject& root, const ModelDims& d, const Analysis& a,
                       const ParallelPlan& plan, Analysis& out) {
  auto need = [&](std::string item, bool supported, std::string note) {
    out.requirements.push_back({std::move(item), supported, std::move(note)});
  };
  // The model as a whole, then each operator and format it uses: built or not, whether or not
  // this model's recipe is.
  if (!refusal.empty()) {
    need(fmt::format("model_type \"{}\"", out.model_type), false, refusal);
  } else {
    need(fmt::format("model_type \"{}\" (recipe {})", out.model_type, arch.recipe_name()), true,
         "tensor table, loader and forward");
  }
  if (a.mla_layers + a.mla_dsa_layers > 0) {
    need(d.mla_uses_rope ? "MLA with RoPE" : "MLA without RoPE (NoPE)", true,
         fmt::format("{} heads, kv_lora_rank {}, rope dim {}", d.mla_heads, d.kv_lora_rank,
                     d.qk_rope_head_dim));
  }
  if (a.mla_dsa_layers > 0) {
    need("DSA lightning indexer", true,
         fmt::format("index_topk {}, {} heads x {}", d.index_topk, d.index_n_heads,
                     d.index_head_dim));
  }
  if (a.kda_layers > 0) {
    need("Kimi Delta Attention (KDA)", true,
         fmt::format("{} heads x {}, short conv {}", d.kda_heads, d.kda_head_dim, d.kda_conv_size));
  }
  if (a.moe_layers + a.latent_moe_layers > 0) {
    need("MoE routing", true,
         fmt::format("{} routed, top {}, {} shared, {} groups / {} chosen", d.num_routed_experts,
                     d.num_experts_per_token, d.num_shared_experts, d.num_expert_groups,
                     d.topk_groups));
  }
  if (a.latent_moe_layers > 0) {
    need("latent MoE", true, fmt::format("routed experts at width {}", d.routed_hidden_size));
  }
  if (a.attn_res_layers > 0) need("attention residuals (AttnRes)", true, "");
  if (a.num_mtp_layers > 0) {
    need("MTP layers", true, fmt::format("{} layer(s)", a.num_mtp_layers));
  }
  need(fmt::format("weights: {}", arch.quantization().describe()), true, "");
  if (root.has("vision_config") || out.summary.by_component.contains("vision")) {
    need("vision tower (images in)", d.vision_layers > 0,
         d.vision_layers > 0 ? fmt::format("MoonViT, {} blocks", d.vision_layers)
                             : "text only: the tower's tensors are accepted, not run");
  }
  const char* under_mpirun = "every command that runs the model, under mpirun";
  if (plan.tp > 1)
    need("tensor parallelism (--tp)", a.runnable,
         a.runnable ? under_mpirun : "the model is not runnable");
  if (plan.ep > 1)
    need("expert parallelism (--ep)", a.runnable,
         a.runnable ? under_mpirun : "the model is not runnable");
  if (plan.cp > 1)
    need("context parallelism (--cp)", a.runnable && plan.ep == 1,
         !a.runnable    ? "the model is not runnable"
         : plan.ep == 1 ? under_mpirun
                        : "not built yet with --ep > 1");
}

std::string bytes_text(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.2f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

}  // namespace

std::string mixer_period(const LayerSchedule& schedule) {
  std::vector<std::string> kinds;
  for (const LayerSpec& layer : schedule.layers) {
    if (!layer.is_mtp) kinds.push_back(attention_kind_name(layer.attention));
  }
  const size_t n = kinds.size();
  if (n == 0) return "";
  // The unit repeated at least twice that covers most layers from the start, the shorter one on a
  // tie; the whole stack once when nothing repeats.
  size_t best_unit = n, best_reps = 1, best_covered = 0;
  for (size_t unit = 1; unit < n; ++unit) {
    size_t covered = unit;
    while (covered < n && kinds[covered] == kinds[covered - unit]) ++covered;
    const size_t reps = covered / unit;
    if (reps >= 2 && reps * unit > best_covered) {
      best_unit = unit;
      best_reps = reps;
      best_covered = reps * unit;
    }
  }
  auto join = [&](size_t begin, size_t end) {
    std::string out;
    for (size_t i = begin; i < end; ++i) out += (i == begin ? "" : " ") + kinds[i];
    return out;
  };
  std::string out = fmt::format("[{}] x {}", join(0, best_unit), best_reps);
  if (best_unit * best_reps < n) out += ", then " + join(best_unit * best_reps, n);
  return out;
}

double expected_remote_ranks(int64_t num_experts, int64_t top_k, int ep) {
  if (ep <= 1 || num_experts <= 0 || top_k <= 0) return 0.0;
  // P(a given other rank holds none of the k choices) = C(E - E/ep, k) / C(E, k).
  const int64_t per_rank = num_experts / ep;
  double none = 1.0;
  for (int64_t i = 0; i < top_k; ++i) {
    none *= static_cast<double>(num_experts - per_rank - i) / static_cast<double>(num_experts - i);
    if (none <= 0.0) {
      none = 0.0;
      break;
    }
  }
  return (ep - 1) * (1.0 - none);
}

Result<Analysis> analyze_config(const formats::ConfigObject& root, const AnalyzeOptions& options) {
  Analysis a;
  a.options = options;
  DZ_ASSIGN_OR_RETURN(a.model_type, root.required_string("model_type"));
  DZ_ASSIGN_OR_RETURN(AnalysisTarget target, parse_model_config_for_analysis(root));
  const Architecture* arch = target.arch.get();
  a.recipe = std::string(arch->recipe_name());
  a.runnable = target.refusal.empty();
  a.dims = arch->dims();
  const TensorTable table = arch->tensor_table();
  a.summary = summarize_architecture(*arch, table);
  count_layers(arch->schedule(), a);
  a.plan_status = validate_plan(options.plan, a.dims);
  if (a.plan_status.ok()) {
    const RankWeights weights = weights_per_rank(table, options.plan);
    a.weight_bytes_per_rank = weights.bytes;
    a.replicated_weight_bytes = weights.replicated_bytes;
    count_caches(a.dims, options, a);
    a.total_bytes_per_rank = a.weight_bytes_per_rank + a.cache_bytes_per_rank;
    const int64_t decode_tokens = sequences_per_group(options);
    a.decode_comm = step_comm(a.dims, a, options.plan, decode_tokens, decode_tokens, false);
    a.prefill_comm = step_comm(a.dims, a, options.plan, options.prefill_tokens, 1, true);
  }
  list_requirements(*arch, target.refusal, root, a.dims, a, options.plan, a);
  for (const auto& [item, note] : arch->missing()) a.requirements.push_back({item, false, note});
  return a;
}

Result<Analysis> analyze_config_path(const std::string& path, const AnalyzeOptions& options) {
  const std::string file = std::filesystem::is_directory(path)
                               ? (std::filesystem::path(path) / "config.json").string()
                               : path;
  DZ_ASSIGN_OR_RETURN(formats::ConfigObject root, formats::ConfigObject::load(file));
  return analyze_config(root, options);
}

std::string format_analysis_text(const Analysis& a) {
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  const ModelDims& d = a.dims;
  const AnalyzeOptions& o = a.options;
  line(fmt::format("model_type   {} ({})", a.model_type,
                   a.runnable ? "recipe " + a.recipe : "not runnable: see the requirements below"));
  line(fmt::format(
      "layers       {} main + {} MTP: {} MLA, {} MLA+DSA, {} KDA; {} dense MLP, {} MoE, "
      "{} latent MoE; {} with AttnRes",
      a.num_main_layers, a.num_mtp_layers, a.mla_layers, a.mla_dsa_layers, a.kda_layers,
      a.dense_mlp_layers, a.moe_layers, a.latent_moe_layers, a.attn_res_layers));
  const int mixers = a.mla_layers + a.mla_dsa_layers + a.kda_layers;
  if (mixers > 0) {
    line(fmt::format("proportions  attention {:.1f}% MLA, {:.1f}% KDA",
                     100.0 * (a.mla_layers + a.mla_dsa_layers) / mixers,
                     100.0 * a.kda_layers / mixers));
  }
  line("mixers       " + a.mixer_period);
  line("pattern");
  for (const std::string& run : a.pattern) line("  " + run);
  if (a.mla_dsa_layers > 0) {
    line(fmt::format("sparse attn  index_topk {}, indexer {} heads x {}, one key per {} token{}",
                     d.index_topk, d.index_n_heads, d.index_head_dim, d.index_kpool,
                     d.index_kpool == 1 ? "" : "s (pooled)"));
  }
  line(fmt::format("parameters   {} ({} active per token), {}", a.summary.total_params,
                   a.summary.active_params, bytes_text(a.summary.total_bytes)));
  for (const auto& [component, entry] : a.summary.by_component) {
    line(fmt::format("  {:<16} {:>16} params {:>12}", component, entry.num_params,
                     bytes_text(entry.num_bytes)));
  }
  for (const auto& [dtype, entry] : a.summary.by_dtype) {
    line(fmt::format("  {:<16} {:>16} params {:>12}", dtype, entry.num_params,
                     bytes_text(entry.num_bytes)));
  }
  line(fmt::format("plan         {}; context {}, batch {}, prefill step {} tokens",
                   o.plan.describe(), o.context, o.batch, o.prefill_tokens));
  if (!a.plan_status.ok()) {
    line("  impossible: " + a.plan_status.message());
  } else {
    line(fmt::format("memory/rank  {} = weights {} ({} replicated) + cache {}",
                     bytes_text(a.total_bytes_per_rank), bytes_text(a.weight_bytes_per_rank),
                     bytes_text(a.replicated_weight_bytes), bytes_text(a.cache_bytes_per_rank)));
    line(
        fmt::format("per token    MLA latent {} B (BF16) / {} B (FP8), indexer keys {} B "
                    "({})",
                    a.mla_bytes_per_token_bf16, a.mla_bytes_per_token_fp8, a.index_bytes_per_token,
                    o.plan.cp > 1 ? "on the CP rank storing its block" : "every rank"));
    line(fmt::format("per sequence KDA state and conv rows {} per rank",
                     bytes_text(a.state_bytes_per_sequence)));
    for (const auto* comm : {&a.decode_comm, &a.prefill_comm}) {
      const bool decode = comm == &a.decode_comm;
      line(fmt::format("comm/step    {} (T = {} per TP group), bytes received per rank:",
                       decode ? "decode" : "prefill",
                       decode ? sequences_per_group(o) : o.prefill_tokens));
      if (comm->empty()) line("  none (one rank per group)");
      for (const CommLine& c : *comm) {
        line(fmt::format("  {:<3} {} x {} = {}  {}: {}{}", c.dimension,
                         bytes_text(c.bytes_per_layer), c.layers, bytes_text(c.bytes_per_step),
                         c.what, c.formula, c.implemented ? "" : " [not built yet]"));
      }
    }
  }
  line("requirements");
  for (const Requirement& r : a.requirements) {
    line(fmt::format("  [{}] {}{}", r.supported ? "yes" : "NO ", r.item,
                     r.note.empty() ? "" : " -- " + r.note));
  }
  return out;
}

std::string format_analysis_json(const Analysis& a) {
  nlohmann::ordered_json j;
  j["model_type"] = a.model_type;
  j["recipe"] = a.recipe;
  j["runnable"] = a.runnable;
  j["layers"] = {{"main", a.num_main_layers},     {"mtp", a.num_mtp_layers},
                 {"mla", a.mla_layers},           {"mla_dsa", a.mla_dsa_layers},
                 {"kda", a.kda_layers},           {"dense_mlp", a.dense_mlp_layers},
                 {"moe", a.moe_layers},           {"latent_moe", a.latent_moe_layers},
                 {"attn_res", a.attn_res_layers}, {"pattern", a.pattern},
                 {"mixer_period", a.mixer_period}};
  const ModelDims& d = a.dims;
  j["sparse_attention"] = {{"index_topk", d.index_topk},
                           {"index_n_heads", d.index_n_heads},
                           {"index_head_dim", d.index_head_dim},
                           {"tokens_per_key", d.index_kpool}};
  j["params"] = {{"total", a.summary.total_params},
                 {"active", a.summary.active_params},
                 {"bytes", a.summary.total_bytes}};
  for (const auto& [component, entry] : a.summary.by_component) {
    j["by_component"][component] = {{"params", entry.num_params}, {"bytes", entry.num_bytes}};
  }
  for (const auto& [dtype, entry] : a.summary.by_dtype) {
    j["by_dtype"][dtype] = {{"params", entry.num_params}, {"bytes", entry.num_bytes}};
  }
  const AnalyzeOptions& o = a.options;
  j["plan"] = {{"tp", o.plan.tp},
               {"ep", o.plan.ep},
               {"cp", o.plan.cp},
               {"ranks", o.plan.world_size()},
               {"context", o.context},
               {"batch", o.batch},
               {"prefill_tokens", o.prefill_tokens},
               {"error", a.plan_status.ok() ? "" : a.plan_status.message()}};
  j["memory_per_rank"] = {{"weights", a.weight_bytes_per_rank},
                          {"replicated_weights", a.replicated_weight_bytes},
                          {"cache", a.cache_bytes_per_rank},
                          {"total", a.total_bytes_per_rank}};
  j["cache"] = {{"mla_bytes_per_token_bf16", a.mla_bytes_per_token_bf16},
                {"mla_bytes_per_token_fp8", a.mla_bytes_per_token_fp8},
                {"index_bytes_per_token", a.index_bytes_per_token},
                {"state_bytes_per_sequence", a.state_bytes_per_sequence}};
  for (const auto* comm : {&a.decode_comm, &a.prefill_comm}) {
    nlohmann::ordered_json lines = nlohmann::ordered_json::array();
    for (const CommLine& c : *comm) {
      lines.push_back({{"dimension", c.dimension},
                       {"what", c.what},
                       {"formula", c.formula},
                       {"bytes_per_layer", c.bytes_per_layer},
                       {"layers", c.layers},
                       {"bytes_per_step", c.bytes_per_step},
                       {"implemented", c.implemented}});
    }
    j[comm == &a.decode_comm ? "decode_comm" : "prefill_comm"] = lines;
  }
  for (const Requirement& r : a.requirements) {
    j["requirements"].push_back({{"item", r.item}, {"supported", r.supported}, {"note", r.note}});
  }
  return j.dump(2);
}

}  // namespace dz::model
