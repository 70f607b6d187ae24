#include "dayzero/model/synthetic_model.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "dayzero/core/parallel.h"
#include "dayzero/core/splitmix.h"
#include "dayzero/formats/codecs.h"
#include "dayzero/formats/hf_config.h"
#include "dayzero/kernels/rope.h"
#include "dayzero/kernels/short_conv.h"

namespace dz::model {
namespace {

using formats::ConfigObject;
using kernels::LinearWeight;

constexpr float kEps = 1e-6f;
constexpr int64_t kFp8Block = 128;

// ---- Parsing ----

Status refuse_unknown_keys(const ConfigObject& obj, std::initializer_list<std::string_view> known) {
  for (const std::string& key : obj.keys())
    if (std::find(known.begin(), known.end(), key) == known.end())
      return obj.field_error(key, "unknown field");
  return Status();
}

Result<SyntheticFormat> parse_format(const ConfigObject& obj, std::string_view key) {
  DZ_ASSIGN_OR_RETURN(const std::optional<std::string> name, obj.optional_string(key));
  if (!name || *name == "bf16") return SyntheticFormat::kBf16;
  if (*name == "fp8_block") return SyntheticFormat::kFp8Block;
  if (*name == "mxfp4") return SyntheticFormat::kMxfp4;
  return obj.field_error(key,
                         "expected \"bf16\", \"fp8_block\" or \"mxfp4\", found \"" + *name + "\"");
}

Result<SyntheticMlaConfig> parse_mla(const ConfigObject& obj) {
  DZ_RETURN_IF_ERROR(
      refuse_unknown_keys(obj, {"num_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                "qk_rope_head_dim", "v_head_dim"}));
  SyntheticMlaConfig c;
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, num_heads);
  DZ_READ_CONFIG_FIELD(obj, c, required_non_negative_int, q_lora_rank);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, kv_lora_rank);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, qk_nope_head_dim);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, qk_rope_head_dim);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, v_head_dim);
  return c;
}

Result<SyntheticDsaConfig> parse_dsa(const ConfigObject& obj) {
  DZ_RETURN_IF_ERROR(refuse_unknown_keys(obj, {"index_n_heads", "index_head_dim", "index_topk"}));
  SyntheticDsaConfig c;
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, index_n_heads);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, index_head_dim);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, index_topk);
  return c;
}

Result<SyntheticKdaConfig> parse_kda(const ConfigObject& obj) {
  DZ_RETURN_IF_ERROR(
      refuse_unknown_keys(obj, {"num_heads", "head_dim", "conv_width", "gate_rank"}));
  SyntheticKdaConfig c;
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, num_heads);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, head_dim);
  DZ_ASSIGN_OR_RETURN(c.conv_width, obj.optional_non_negative_int("conv_width", 4));
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, gate_rank);
  return c;
}

Result<SyntheticFfnConfig> parse_ffn(const ConfigObject& obj) {
  DZ_RETURN_IF_ERROR(refuse_unknown_keys(
      obj, {"kind", "intermediate_size", "first_dense_layers", "num_experts", "num_experts_per_tok",
            "moe_intermediate_size", "num_shared_experts"}));
  SyntheticFfnConfig c;
  DZ_ASSIGN_OR_RETURN(const std::string kind, obj.required_string("kind"));
  if (kind != "dense" && kind != "moe")
    return obj.field_error("kind", "expected \"dense\" or \"moe\", found \"" + kind + "\"");
  c.moe = kind == "moe";
  if (!c.moe) {
    DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, intermediate_size);
    for (std::string_view key : {"first_dense_layers", "num_experts", "num_experts_per_tok",
                                 "moe_intermediate_size", "num_shared_experts"})
      if (obj.has(key)) return obj.field_error(key, "only for \"kind\": \"moe\"");
    return c;
  }
  DZ_ASSIGN_OR_RETURN(c.first_dense_layers, obj.optional_non_negative_int("first_dense_layers", 0));
  DZ_ASSIGN_OR_RETURN(c.intermediate_size, obj.optional_non_negative_int("intermediate_size", 0));
  if (c.first_dense_layers > 0 && c.intermediate_size == 0)
    return obj.field_error("intermediate_size", "required when first_dense_layers > 0");
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, num_experts);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, num_experts_per_tok);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, moe_intermediate_size);
  DZ_ASSIGN_OR_RETURN(c.num_shared_experts, obj.optional_non_negative_int("num_shared_experts", 0));
  return c;
}

// ---- Random weights ----

using Rng = SplitMix64;

// Quantised random codes by table lookup: entry i is the code of the value at the centre of the
// i-th of 2^bits equal slices of the uniform range, so drawing `bits` random bits picks a code
// with the probability that rounding the uniform value would (to within one slice). GiB of
// expert weights then cost one table read per code instead of a float encode.
template <int kBits>
struct CodeTable {
  std::array<uint8_t, size_t{1} << kBits> codes{};
  template <typename Encode>
  CodeTable(float stddev, Encode encode) {
    const float half_range = 1.7320508f * stddev;
    for (size_t i = 0; i < codes.size(); ++i) {
      const float u = (static_cast<float>(i) + 0.5f) / static_cast<float>(codes.size());
      codes[i] = encode((2.0f * u - 1.0f) * half_range);
    }
  }
};

class Builder {
 public:
  Builder(const SyntheticModelConfig& config) : Builder(config, config.seed) {}
  Builder(const SyntheticModelConfig& config, uint64_t seed)
      : config_(config),
        rng_(seed),
        out_gain_(1.0f / std::sqrt(2.0f * static_cast<float>(config.num_layers))) {}

  std::vector<float> values(int64_t n, float stddev, float mean = 0.0f) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = formats::round_to_bf16(mean + rng_.uniform(stddev));
    return v;
  }
  std::vector<float> norm_weight(int64_t n) { return values(n, 0.1f / 1.7320508f, 1.0f); }

  // W [out, in] with entries of standard deviation gain / √in.
  LinearWeight linear(int64_t out, int64_t in, SyntheticFormat format, float gain = 1.0f) {
    const float stddev = gain / std::sqrt(static_cast<float>(in));
    switch (format) {
      case SyntheticFormat::kBf16: {
        const std::vector<float> w = values(out * in, stddev);
        return LinearWeight::from_f32_as_bf16(w.data(), out, in);
      }
      case SyntheticFormat::kFp8Block:
        return fp8_block(out, in, stddev);
      case SyntheticFormat::kMxfp4:
        return mxfp4(out, in, stddev);
    }
    DZ_CHECK(false, "format");
    return {};
  }
  LinearWeight linear(int64_t out, int64_t in, float gain = 1.0f) {
    return linear(out, in, config_.weight_format, gain);
  }
  float out_gain() const { return out_gain_; }

  MlpWeights mlp(int64_t inter, SyntheticFormat format) {
    const int64_t d = config_.hidden_size;
    MlpWeights w;
    w.gate_proj = linear(inter, d, format);
    w.up_proj = linear(inter, d, format);
    w.down_proj = linear(d, inter, format, out_gain_);
    return w;
  }

  std::unique_ptr<MlaBlock> mla() {
    const SyntheticMlaConfig& m = config_.mla;
    const int64_t d = config_.hidden_size, H = m.num_heads;
    const int64_t d_qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    MlaConfig c{.hidden_size = d,
                .num_heads = H,
                .q_lora_rank = m.q_lora_rank,
                .kv_lora_rank = m.kv_lora_rank,
                .qk_nope_head_dim = m.qk_nope_head_dim,
                .qk_rope_head_dim = m.qk_rope_head_dim,
                .v_head_dim = m.v_head_dim,
                .softmax_scale = 1.0f / std::sqrt(static_cast<float>(d_qk)),
                .q_norm_eps = kEps,
                .kv_norm_eps = kEps,
                .rope = kernels::plain_rope_frequencies(m.qk_rope_head_dim, 10000.0),
                .output_gate = false};
    MlaWeights w;
    if (m.q_lora_rank > 0) {
      w.q_a_proj = linear(m.q_lora_rank, d);
      w.q_a_layernorm = norm_weight(m.q_lora_rank);
    }
    w.q_b_proj = linear(H * d_qk, m.q_lora_rank > 0 ? m.q_lora_rank : d);
    w.kv_a_proj_with_mqa = linear(m.kv_lora_rank + m.qk_rope_head_dim, d);
    w.kv_a_layernorm = norm_weight(m.kv_lora_rank);
    w.kv_b_proj = linear(H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank);
    w.o_proj = linear(d, H * m.v_head_dim, out_gain_);
    return std::make_unique<MlaBlock>(c, std::move(w));
  }

  std::unique_ptr<DsaIndexer> indexer() {
    const SyntheticDsaConfig& s = config_.dsa;
    const int64_t d = config_.hidden_size;
    DsaIndexerConfig c{
        .hidden_size = d,
        .q_lora_rank = config_.mla.q_lora_rank,
        .index_n_heads = s.index_n_heads,
        .index_head_dim = s.index_head_dim,
        .index_topk = s.index_topk,
        .rope = kernels::plain_rope_frequencies(config_.mla.qk_rope_head_dim, 10000.0)};
    DsaIndexerWeights w;
    w.wq_b = linear(s.index_n_heads * s.index_head_dim, config_.mla.q_lora_rank);
    w.wk = linear(s.index_head_dim, d);
    w.k_norm_weight = norm_weight(s.index_head_dim);
    w.k_norm_bias = values(s.index_head_dim, 0.05f);
    w.weights_proj = linear(s.index_n_heads, d);
    return std::make_unique<DsaIndexer>(c, std::move(w));
  }

  std::unique_ptr<KdaBlock> kda() {
    const SyntheticKdaConfig& k = config_.kda;
    const int64_t d = config_.hidden_size, H = k.num_heads, hd_all = H * k.head_dim;
    const int64_t W = k.conv_width, r = k.gate_rank;
    KdaConfig c{.hidden_size = d, .num_heads = H, .head_dim = k.head_dim, .conv_width = W};
    c.o_norm_eps = kEps;
    KdaWeights w;
    w.q_proj = linear(hd_all, d);
    w.k_proj = linear(hd_all, d);
    w.v_proj = linear(hd_all, d);
    // Conv taps of RMS 1/√W keep the RMS of the convolved features.
    const float tap = 1.0f / std::sqrt(static_cast<float>(W));
    w.q_conv = values(hd_all * W, tap);
    w.k_conv = values(hd_all * W, tap);
    w.v_conv = values(hd_all * W, tap);
    w.f_a_proj = linear(r, d);
    w.f_b_proj = linear(hd_all, r);
    w.b_proj = linear(H, d);
    // A_log in [−4, 0.5] as the test models use: decays from slow to fast.
    for (int64_t h = 0; h < H; ++h) w.a_log.push_back(-1.75f + rng_.uniform(2.25f / 1.7320508f));
    w.dt_bias = values(hd_all, 0.5f);
    w.g_a_proj = linear(r, d);
    w.g_b_proj = linear(hd_all, r);
    w.o_norm = norm_weight(k.head_dim);
    w.o_proj = linear(d, hd_all, out_gain_);
    return std::make_unique<KdaBlock>(c, std::move(w));
  }

  // DeepSeek-V3-style routing (σ scores + correction bias, n_group 1, top-k renormalised).
  std::unique_ptr<MoeBlock> moe() {
    const SyntheticFfnConfig& f = config_.ffn;
    const int64_t d = config_.hidden_size;
    MoeConfig c{.num_experts = f.num_experts,
                .num_experts_per_tok = f.num_experts_per_tok,
                .routed_scaling_factor = 1.0f,
                .renorm_epsilon = 1e-20f,
                .activation = MlpActivation{},
                .latent_norm_eps = kEps};
    MoeWeights w;
    w.gate_weight = values(f.num_experts * d, 1.0f / std::sqrt(static_cast<float>(d)));
    w.e_score_correction_bias = values(f.num_experts, 0.01f);
    // Experts in parallel (GiB of them in the bandwidth configs), each from its own seed drawn
    // in order, so the model does not depend on the thread count.
    std::vector<uint64_t> seeds(static_cast<size_t>(f.num_experts));
    for (uint64_t& seed : seeds) seed = rng_.next();
    w.experts.resize(static_cast<size_t>(f.num_experts));
    parallel_for(ExecContext{.num_threads = default_num_threads()}, f.num_experts, 1,
                 [&](int64_t begin, int64_t end) {
                   for (int64_t e = begin; e < end; ++e) {
                     Builder expert(config_, seeds[static_cast<size_t>(e)]);
                     w.experts[static_cast<size_t>(e)] =
                         expert.mlp(f.moe_intermediate_size, config_.expert_format);
                   }
                 });
    if (f.num_shared_experts > 0)
      w.shared_experts.push_back(
          mlp(f.num_shared_experts * f.moe_intermediate_size, config_.weight_format));
    return std::make_unique<MoeBlock>(c, std::move(w));
  }

 private:
  // E4M3 codes of values of RMS 1 times one FP32 scale per 128×128 block (stddev, jittered by
  // a power of two either way so blocks differ).
  LinearWeight fp8_block(int64_t out, int64_t in, float stddev) {
    static const CodeTable<16> table(1.0f, [](float x) { return formats::encode_e4m3(x); });
    std::vector<uint8_t> codes(static_cast<size_t>(out * in));
    for (size_t i = 0; i < codes.size(); i += 4) {
      const uint64_t r = rng_.next();
      for (size_t j = 0; j < 4 && i + j < codes.size(); ++j)
        codes[i + j] = table.codes[(r >> (16 * j)) & 0xFFFF];
    }
    const int64_t rows = (out + kFp8Block - 1) / kFp8Block, cols = (in + kFp8Block - 1) / kFp8Block;
    std::vector<float> scales(static_cast<size_t>(rows * cols));
    for (float& s : scales) s = stddev * std::exp2(static_cast<float>(rng_.next() % 3) - 1.0f);
    Result<LinearWeight> w = LinearWeight::from_fp8_block(
        TensorView(codes.data(), DType::kF8E4M3, Shape{out, in}),
        TensorView(scales.data(), DType::kF32, Shape{rows, cols}), kFp8Block, kFp8Block);
    DZ_CHECK(w.ok(), "{}", w.status().message());
    return std::move(w).value();
  }

  // E2M1 codes of values of RMS ~1.1 (|x| < 2), one E8M0 scale per 32 elements: 2^e with
  // 2^e·1.1 ≈ stddev.
  LinearWeight mxfp4(int64_t out, int64_t in, float stddev) {
    static const CodeTable<8> table(1.1f, [](float x) { return formats::encode_e2m1(x); });
    std::vector<uint8_t> packed(static_cast<size_t>(out * in / 2));
    for (size_t i = 0; i < packed.size(); i += 4) {
      const uint64_t r = rng_.next();
      for (size_t j = 0; j < 4 && i + j < packed.size(); ++j) {
        const uint8_t lo = table.codes[(r >> (16 * j)) & 0xFF];
        const uint8_t hi = table.codes[(r >> (16 * j + 8)) & 0xFF];
        packed[i + j] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
    const int exponent = static_cast<int>(std::lround(std::log2(stddev / 1.1f)));
    std::vector<uint8_t> scales(static_cast<size_t>(out * in / 32), formats::encode_e8m0(exponent));
    Result<LinearWeight> w = LinearWeight::from_mxfp4(
        TensorView(packed.data(), DType::kU8, Shape{out, in / 2}),
        TensorView(scales.data(), DType::kU8, Shape{out, in / 32}), config_.mxfp4_activations);
    DZ_CHECK(w.ok(), "{}", w.status().message());
    return std::move(w).value();
  }

  const SyntheticModelConfig& config_;
  Rng rng_;
  float out_gain_;
};

// Holds the embedding table the Embedding view borrows. A base class listed before HybridModel,
// so it is built first and destroyed last.
struct OwnedTable {
  std::vector<uint16_t> codes;
};

class SyntheticHybridModel : private OwnedTable, public HybridModel {
 public:
  SyntheticHybridModel(std::vector<uint16_t> table, HybridModelParts parts)
      : OwnedTable{std::move(table)}, HybridModel(std::move(parts)) {}
};

int64_t linear_bytes(int64_t out, int64_t in, SyntheticFormat format) {
  switch (format) {
    case SyntheticFormat::kBf16:
      return 2 * out * in;
    case SyntheticFormat::kFp8Block:
      return out * in +
             4 * ((out + kFp8Block - 1) / kFp8Block) * ((in + kFp8Block - 1) / kFp8Block);
    case SyntheticFormat::kMxfp4:
      return out * in / 2 + out * in / 32;
  }
  return 0;
}

}  // namespace

std::string_view synthetic_mixer_name(SyntheticMixer mixer) {
  switch (mixer) {
    case SyntheticMixer::kMla:
      return "mla";
    case SyntheticMixer::kMlaDsa:
      return "mla_dsa";
    case SyntheticMixer::kKda:
      return "kda";
  }
  return "?";
}

std::string_view synthetic_format_name(SyntheticFormat format) {
  switch (format) {
    case SyntheticFormat::kBf16:
      return "bf16";
    case SyntheticFormat::kFp8Block:
      return "fp8_block";
    case SyntheticFormat::kMxfp4:
      return "mxfp4";
  }
  return "?";
}

Result<SyntheticModelConfig> parse_synthetic_config(std::string_view text) {
  DZ_ASSIGN_OR_RETURN(const ConfigObject obj, ConfigObject::parse(text, "synthetic config"));
  DZ_RETURN_IF_ERROR(refuse_unknown_keys(
      obj, {"description", "vocab_size", "hidden_size", "num_layers", "mixer_pattern", "mla", "dsa",
            "kda", "ffn", "weight_format", "expert_format", "kv_cache_dtype", "seed"}));
  SyntheticModelConfig c;
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, vocab_size);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, hidden_size);
  DZ_READ_CONFIG_FIELD(obj, c, required_positive_int, num_layers);
  DZ_ASSIGN_OR_RETURN(const std::vector<std::string> pattern,
                      obj.optional_string_list("mixer_pattern"));
  if (pattern.empty()) return obj.field_error("mixer_pattern", "expected a non-empty list");
  bool uses_mla = false, uses_dsa = false, uses_kda = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const std::string& name = pattern[i];
    if (name == "mla") {
      c.mixer_pattern.push_back(SyntheticMixer::kMla);
    } else if (name == "mla_dsa") {
      c.mixer_pattern.push_back(SyntheticMixer::kMlaDsa);
    } else if (name == "kda") {
      c.mixer_pattern.push_back(SyntheticMixer::kKda);
    } else {
      return obj.field_error("mixer_pattern[" + std::to_string(i) + "]",
                             "expected \"mla\", \"mla_dsa\" or \"kda\", found \"" + name + "\"");
    }
    uses_mla |= name != "kda";
    uses_dsa |= name == "mla_dsa";
    uses_kda |= name == "kda";
  }
  auto section = [&](std::string_view key, bool used) -> Result<std::optional<ConfigObject>> {
    DZ_ASSIGN_OR_RETURN(std::optional<ConfigObject> sub, obj.optional_object(key));
    if (used && !sub) return obj.field_error(key, "required by mixer_pattern");
    return sub;
  };
  DZ_ASSIGN_OR_RETURN(const std::optional<ConfigObject> mla, section("mla", uses_mla));
  if (mla) {
    DZ_ASSIGN_OR_RETURN(c.mla, parse_mla(*mla));
  }
  DZ_ASSIGN_OR_RETURN(const std::optional<ConfigObject> dsa, section("dsa", uses_dsa));
  if (dsa) {
    DZ_ASSIGN_OR_RETURN(c.dsa, parse_dsa(*dsa));
  }
  DZ_ASSIGN_OR_RETURN(const std::optional<ConfigObject> kda, section("kda", uses_kda));
  if (kda) {
    DZ_ASSIGN_OR_RETURN(c.kda, parse_kda(*kda));
  }
  DZ_ASSIGN_OR_RETURN(const ConfigObject ffn, obj.required_object("ffn"));
  DZ_ASSIGN_OR_RETURN(c.ffn, parse_ffn(ffn));
  DZ_ASSIGN_OR_RETURN(c.weight_format, parse_format(obj, "weight_format"));
  DZ_ASSIGN_OR_RETURN(c.expert_format, parse_format(obj, "expert_format"));
  DZ_ASSIGN_OR_RETURN(const std::optional<std::string> kv, obj.optional_string("kv_cache_dtype"));
  if (kv && *kv == "fp8") {
    c.kv_cache_dtype = kernels::KvCacheDtype::kFp8;
  } else if (kv && *kv != "bf16") {
    return obj.field_error("kv_cache_dtype", "expected \"bf16\" or \"fp8\", found \"" + *kv + "\"");
  }
  DZ_ASSIGN_OR_RETURN(const int64_t seed, obj.optional_non_negative_int("seed", 1));
  c.seed = static_cast<uint64_t>(seed);
  const Status status = validate_synthetic_config(c);
  if (!status.ok()) return status.with_context("synthetic config");
  return c;
}

Result<SyntheticModelConfig> load_synthetic_config(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr)
    return make_error(StatusCode::kNotFound, "{}: cannot open: {}", path, std::strerror(errno));
  std::string text;
  std::array<char, 4096> buf{};
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;) text.append(buf.data(), n);
  std::fclose(f);
  Result<SyntheticModelConfig> config = parse_synthetic_config(text);
  if (!config.ok()) return config.status().with_context(path);
  return config;
}

Status validate_synthetic_config(const SyntheticModelConfig& c) {
  auto invalid = [](std::string message) {
    return make_error(StatusCode::kInvalidArgument, "{}", message);
  };
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.num_layers <= 0)
    return invalid("vocab_size, hidden_size and num_layers must be positive");
  if (c.mixer_pattern.empty()) return invalid("mixer_pattern: expected a non-empty list");
  if (c.weight_format == SyntheticFormat::kMxfp4)
    return invalid("weight_format: \"mxfp4\" is for routed experts only (expert_format)");
  bool uses_mla = false, uses_dsa = false;
  for (SyntheticMixer m : c.mixer_pattern) {
    uses_mla |= m != SyntheticMixer::kKda;
    uses_dsa |= m == SyntheticMixer::kMlaDsa;
  }
  const bool uses_kda = std::find(c.mixer_pattern.begin(), c.mixer_pattern.end(),
                                  SyntheticMixer::kKda) != c.mixer_pattern.end();
  if (uses_kda && (c.kda.conv_width < 1 || c.kda.conv_width > kernels::kMaxShortConvWidth))
    return invalid("kda.conv_width: expected 1 to " + std::to_string(kernels::kMaxShortConvWidth));
  if (uses_dsa && c.dsa.index_head_dim != 128)
    return invalid("dsa.index_head_dim: expected 128 (the indexer's FP8 key groups)");
  if (uses_dsa && c.mla.qk_rope_head_dim > 128)
    return invalid("mla.qk_rope_head_dim: at most index_head_dim (128) with mla_dsa layers");
  if (uses_dsa && c.mla.q_lora_rank == 0)
    return invalid("mla.q_lora_rank: mla_dsa layers need a q LoRA (the indexer reads it)");
  if (uses_mla && c.kv_cache_dtype == kernels::KvCacheDtype::kFp8 && c.mla.kv_lora_rank % 128 != 0)
    return invalid("mla.kv_lora_rank: a multiple of 128 with kv_cache_dtype \"fp8\"");
  if (uses_mla && c.mla.qk_rope_head_dim % 2 != 0)
    return invalid("mla.qk_rope_head_dim: expected an even number");
  const SyntheticFfnConfig& f = c.ffn;
  if (!f.moe && f.intermediate_size <= 0)
    return invalid("ffn.intermediate_size: expected a positive integer");
  if (f.moe) {
    if (f.num_experts_per_tok > f.num_experts)
      return invalid("ffn.num_experts_per_tok: more than num_experts");
    if (f.first_dense_layers > 0 && f.intermediate_size <= 0)
      return invalid("ffn.intermediate_size: required when first_dense_layers > 0");
    if (c.expert_format == SyntheticFormat::kMxfp4 &&
        (c.hidden_size % 32 != 0 || f.moe_intermediate_size % 32 != 0))
      return invalid(
          "expert_format \"mxfp4\": hidden_size and moe_intermediate_size must be "
          "multiples of 32");
  }
  return Status();
}

SyntheticWeightBytes synthetic_weight_bytes(const SyntheticModelConfig& c) {
  SyntheticWeightBytes out;
  const int64_t d = c.hidden_size;
  const SyntheticFormat wf = c.weight_format;
  // (params, bytes read per step, bytes held beyond them)
  auto add = [&](int64_t out_f, int64_t in_f, SyntheticFormat format) {
    out.per_step_bytes += linear_bytes(out_f, in_f, format);
    out.total_bytes += linear_bytes(out_f, in_f, format);
    out.num_params += out_f * in_f;
    out.active_params += out_f * in_f;
  };
  auto add_f32 = [&](int64_t n) {
    out.per_step_bytes += 4 * n;
    out.total_bytes += 4 * n;
    out.num_params += n;
  };
  out.total_bytes += 2 * c.vocab_size * d;  // embedding (BF16), rows read per token only
  out.num_params += c.vocab_size * d;
  add(c.vocab_size, d, wf);  // lm_head
  add_f32(d);                // final norm
  for (int64_t i = 0; i < c.num_layers; ++i) {
    add_f32(2 * d);
    const SyntheticMixer mixer = c.mixer(i);
    if (mixer == SyntheticMixer::kKda) {
      const SyntheticKdaConfig& k = c.kda;
      const int64_t hd = k.num_heads * k.head_dim;
      for (int j = 0; j < 3; ++j) add(hd, d, wf);
      add_f32(3 * hd * k.conv_width + k.num_heads + hd + k.head_dim);
      add(k.gate_rank, d, wf), add(hd, k.gate_rank, wf), add(k.num_heads, d, wf);
      add(k.gate_rank, d, wf), add(hd, k.gate_rank, wf), add(d, hd, wf);
    } else {
      const SyntheticMlaConfig& m = c.mla;
      const int64_t H = m.num_heads, d_qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      if (m.q_lora_rank > 0) add(m.q_lora_rank, d, wf), add_f32(m.q_lora_rank);
      add(H * d_qk, m.q_lora_rank > 0 ? m.q_lora_rank : d, wf);
      add(m.kv_lora_rank + m.qk_rope_head_dim, d, wf);
      add_f32(m.kv_lora_rank);
      // kv_b_proj: held as stored and as BF16 W_UK/W_UV (both forms read these).
      const int64_t kv_b = H * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank;
      out.total_bytes += linear_bytes(H * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, wf);
      out.num_params += kv_b;
      out.active_params += kv_b;
      out.per_step_bytes += 2 * kv_b;
      out.total_bytes += 2 * kv_b;
      add(d, H * m.v_head_dim, wf);
      if (mixer == SyntheticMixer::kMlaDsa) {
        const SyntheticDsaConfig& s = c.dsa;
        add(s.index_n_heads * s.index_head_dim, m.q_lora_rank, wf);
        add(s.index_head_dim, d, wf), add(s.index_n_heads, d, wf);
        add_f32(2 * s.index_head_dim);
      }
    }
    const SyntheticFfnConfig& f = c.ffn;
    if (!c.is_moe_layer(i)) {
      for (int j = 0; j < 3; ++j) add(f.intermediate_size, d, wf);
      continue;
    }
    ++out.num_moe_layers;
    add_f32(f.num_experts * d + f.num_experts);
    if (f.num_shared_experts > 0)
      for (int j = 0; j < 3; ++j) add(f.num_shared_experts * f.moe_intermediate_size, d, wf);
    const int64_t expert = 3 * linear_bytes(f.moe_intermediate_size, d, c.expert_format);
    out.per_expert_bytes = expert;
    out.total_bytes += f.num_experts * expert;
    out.num_params += f.num_experts * 3 * f.moe_intermediate_size * d;
    out.active_params += f.num_experts_per_tok * 3 * f.moe_intermediate_size * d;
  }
  return out;
}

Result<std::unique_ptr<HybridModel>> build_synthetic_model(const SyntheticModelConfig& config) {
  DZ_RETURN_IF_ERROR(validate_synthetic_config(config));
  Builder b(config);
  const int64_t V = config.vocab_size, d = config.hidden_size;
  std::vector<uint16_t> table(static_cast<size_t>(V * d));
  {
    const std::vector<float> values = b.values(V * d, 1.0f);
    for (size_t i = 0; i < values.size(); ++i) table[i] = formats::encode_bf16(values[i]);
  }
  HybridModelParts parts;
  parts.vocab_size = V;
  parts.hidden_size = d;
  parts.final_norm_eps = kEps;
  parts.kv_cache_dtype = config.kv_cache_dtype;
  DZ_ASSIGN_OR_RETURN(
      parts.embed_tokens,
      Embedding::from_view(TensorView(table.data(), DType::kBF16, Shape{V, d}), "embed_tokens"));
  parts.final_norm = b.norm_weight(d);
  parts.lm_head = b.linear(V, d);
  for (int64_t i = 0; i < config.num_layers; ++i) {
    DecoderLayer layer;
    layer.layer_id = static_cast<int>(i);
    layer.hidden_size = d;
    layer.norm_eps = kEps;
    layer.input_layernorm = b.norm_weight(d);
    layer.post_attention_layernorm = b.norm_weight(d);
    switch (config.mixer(i)) {
      case SyntheticMixer::kMla:
        layer.mla = b.mla();
        break;
      case SyntheticMixer::kMlaDsa:
        layer.mla = b.mla();
        layer.indexer = b.indexer();
        break;
      case SyntheticMixer::kKda:
        layer.kda = b.kda();
        break;
    }
    if (config.is_moe_layer(i)) {
      layer.moe = b.moe();
    } else {
      layer.dense_mlp = b.mlp(config.ffn.intermediate_size, config.weight_format);
    }
    parts.layers.push_back(std::move(layer));
  }
  return std::unique_ptr<HybridModel>(
      std::make_unique<SyntheticHybridModel>(std::move(table), std::move(parts)));
}

}  // namespace dz::model
