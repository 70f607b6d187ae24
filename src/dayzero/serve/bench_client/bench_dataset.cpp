#include "dayzero/serve/bench_client/bench_dataset.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_set>

namespace dz::serve {
namespace {

std::vector<int32_t> random_ids(std::mt19937_64& rng, std::span<const int32_t> allowed, int64_t n) {
  std::uniform_int_distribution<size_t> pick(0, allowed.size() - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = allowed[pick(rng)];
  return ids;
}

// A length drawn uniformly from [⌊L(1 − r)⌋, ⌈L(1 + r)⌉], at least 1.
int64_t draw_length(std::mt19937_64& rng, int64_t length, double ratio) {
  double l = static_cast<double>(length);
  auto lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(l * (1.0 - ratio))));
  auto hi = std::max<int64_t>(lo, static_cast<int64_t>(std::ceil(l * (1.0 + ratio))));
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// Appends `bytes` with every invalid UTF-8 sequence replaced by U+FFFD.
void append_valid_utf8(std::string& out, std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    auto c = static_cast<unsigned char>(bytes[i]);
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    bool ok = len > 0 && i + len <= bytes.size();
    for (size_t k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (ok && len > 1) {  // reject overlong forms and surrogates, as a strict decoder does
      uint32_t cp = c & (0x7Fu >> len);
      for (size_t k = 1; k < len; ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(bytes[i + k]) & 0x3Fu);
      ok = !(len == 2 && cp < 0x80) && !(len == 3 && cp < 0x800) && !(len == 4 && cp < 0x10000) &&
           !(cp >= 0xD800 && cp <= 0xDFFF) && cp <= 0x10FFFF;
    }
    if (ok) {
      out.append(bytes.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      ++i;
    }
  }
}

}  // namespace

Result<std::vector<BenchRequest>> make_dataset(const DatasetOptions& o,
                                               std::span<const int32_t> allowed_ids) {
  if (o.name != "random" && o.name != "prefix-repetition")
    return make_error(StatusCode::kInvalidArgument,
                      "--dataset-name must be random or prefix-repetition, not '{}'", o.name);
  if (o.num_prompts <= 0)
    return make_error(StatusCode::kInvalidArgument, "--num-prompts must be positive");
  if (o.input_len <= 0 || o.output_len <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "--input-len and --output-len must be positive (got {} and {})", o.input_len,
                      o.output_len);
  if (!(o.range_ratio >= 0.0 && o.range_ratio < 1.0))
    return make_error(StatusCode::kInvalidArgument, "--range-ratio must be in [0, 1), not {}",
                      o.range_ratio);
  if (allowed_ids.empty())
    return make_error(StatusCode::kInvalidArgument, "no token ids to draw prompts from");
  std::mt19937_64 rng(o.seed);
  std::vector<BenchRequest> requests(static_cast<size_t>(o.num_prompts));
  if (o.name == "random") {
    for (BenchRequest& r : requests) {
      r.prompt_len = draw_length(rng, o.input_len, o.range_ratio);
      r.output_len = draw_length(rng, o.output_len, o.range_ratio);
      r.prompt_ids = random_ids(rng, allowed_ids, r.prompt_len);
    }
    return requests;
  }
  if (o.prefix_len <= 0 || o.num_prefixes <= 0)
    return make_error(StatusCode::kInvalidArgument,
                      "prefix-repetition needs positive --prefix-len and --num-prefixes (got {} "
                      "and {})",
                      o.prefix_len, o.num_prefixes);
  std::vector<std::vector<int32_t>> prefixes;
  for (int64_t p = 0; p < o.num_prefixes; ++p)
    prefixes.push_back(random_ids(rng, allowed_ids, o.prefix_len));
  for (size_t i = 0; i < requests.size(); ++i) {
    BenchRequest& r = requests[i];
    r.prompt_ids = prefixes[i % prefixes.size()];
    std::vector<int32_t> suffix = random_ids(rng, allowed_ids, o.input_len);
    r.prompt_ids.insert(r.prompt_ids.end(), suffix.begin(), suffix.end());
    r.prompt_len = static_cast<int64_t>(r.prompt_ids.size());
    r.output_len = o.output_len;
  }
  std::shuffle(requests.begin(), requests.end(), rng);
  return requests;
}

std::vector<int32_t> prompt_token_ids(int32_t vocab_size, const Tokenizer* tokenizer) {
  std::unordered_set<int32_t> special;
  if (tokenizer != nullptr)
    for (const SpecialToken& t : tokenizer->special_tokens()) special.insert(t.id);
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < vocab_size; ++id) {
    if (special.count(id) != 0) continue;
    if (tokenizer != nullptr && !tokenizer->token_bytes(id)) continue;  // a hole in the vocab
    ids.push_back(id);
  }
  return ids;
}

void decode_prompts(std::vector<BenchRequest>& requests, const Tokenizer& tokenizer) {
  for (BenchRequest& r : requests) {
    r.prompt_text.clear();
    append_valid_utf8(r.prompt_text, tokenizer.decode(r.prompt_ids));
  }
}

std::vector<double> arrival_times(int64_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> times(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (times.empty() || std::isinf(rate)) return times;
  std::mt19937_64 rng(seed);
  double t = 0;
  for (double& time : times) {
    if (std::isinf(burstiness)) {
      t += 1.0 / rate;
    } else {
      // Shape k = burstiness and scale θ = 1/(rate·k): the mean gap is 1/rate for every k.
      std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
      t += gap(rng);
    }
    time = t;
  }
  // vLLM rescales so the run lasts exactly n/rate, which steadies throughput across seeds.
  double scale = (static_cast<double>(n) / rate) / times.back();
  if (times.back() > 0)
    for (double& time : times) time *= scale;
  return times;
}

}  // namespace dz::serve
