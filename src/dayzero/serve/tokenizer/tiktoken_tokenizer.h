#pragma once
// tiktoken.model checkpoints (Kimi-K2, Kimi-Linear, Kimi-K3): lines of "base64(token bytes) rank",
// byte-level BPE that merges the adjacent pair whose concatenation has the lowest rank, and
// special tokens numbered right after the ranks. The split pattern and the special-token rule are
// not in the files but in the checkpoint's tokenization_kimi.py (TikTokenTokenizer); they are
// reproduced here.

#include <string>
#include <string_view>

#include "dayzero/serve/tokenizer/bpe.h"
#include "dayzero/serve/tokenizer/regex.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::serve {

// TikTokenTokenizer.pat_str of tokenization_kimi.py (Kimi-K2 / Kimi-Linear / Kimi-K3), joined
// with "|" as there. \p{Han} is the Script property (Rust regex), and `&&` is class intersection.
inline constexpr std::string_view kKimiPattern =
    R"([\p{Han}]+|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|)"
    R"(\p{N}{1,3}|)"
    R"( ?[^\s\p{L}\p{N}]+[\r\n]*|)"
    R"(\s*[\r\n]+|)"
    R"(\s+(?!\S)|)"
    R"(\s+)";

struct TiktokenOptions {
  std::string pat_str = std::string(kKimiPattern);
  // Special ids are [num_ranks, num_ranks + num_reserved_special_tokens); those not named in
  // tokenizer_config.json's added_tokens_decoder are "<|reserved_token_{id}|>".
  int32_t num_reserved_special_tokens = 256;
  // Kimi's encode cuts text into chunks of this many code points (TIKTOKEN_MAX_ENCODE_CHARS) ...
  size_t max_encode_chars = 400'000;
  // ... and cuts runs of whitespace or of non-whitespace longer than this
  // (MAX_NO_WHITESPACES_CHARS, tiktoken issue 195), using Python's str.isspace.
  size_t max_run_chars = 25'000;
};

class TiktokenTokenizer final : public Tokenizer {
 public:
  // `config_path` may be empty: then every special token has its reserved name.
  static Result<std::unique_ptr<TiktokenTokenizer>> load(const std::string& model_path,
                                                         const std::string& config_path,
                                                         const TiktokenOptions& options = {});
  // The same from file contents; the names only label error messages. Empty `config_text`: no
  // tokenizer_config.json.
  static Result<std::unique_ptr<TiktokenTokenizer>> create(
      std::string_view ranks_text, std::string_view config_text, const TiktokenOptions& options,
      std::string_view ranks_name = "tiktoken.model",
      std::string_view config_name = "tokenizer_config.json");

  Result<std::vector<int32_t>> encode(std::string_view text,
                                      const EncodeOptions& options = {}) const override;
  std::optional<std::string_view> token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return num_ranks() + options_.num_reserved_special_tokens; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int32_t id) const override;
  const std::vector<SpecialToken>& special_tokens() const override { return special_tokens_; }
  std::string_view source() const override { return "tiktoken.model"; }

  int32_t num_ranks() const { return static_cast<int32_t>(rank_bytes_.size()); }
  // The substrings Kimi's encode hands to tiktoken one at a time.
  std::vector<std::string_view> chunks(std::string_view text) const;

 private:
  TiktokenTokenizer() = default;
  Status parse_ranks(std::string_view text);
  Status parse_specials(std::string_view config_text);
  Status encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  TiktokenOptions options_;
  Regex regex_;
  std::vector<std::string> rank_bytes_;  // [num_ranks]
  BytesToId ranks_;                      // token bytes -> rank (= id)
  std::vector<SpecialToken> special_tokens_;
  BytesToId special_ids_;
  AddedTokenSplitter specials_;
};

}  // namespace dz::serve
