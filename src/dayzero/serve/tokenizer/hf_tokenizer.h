#pragma once
// HF tokenizers' tokenizer.json, byte-level BPE only (DeepSeek-V3/V3.2, Llama-3, GPT-2 style):
// added tokens are cut out first (leftmost-longest), the rest goes through the pre-tokenizer
// (Split steps, then ByteLevel), each piece through BPE with the file's merge ranks. Anything
// else a tokenizer.json can hold (normalizers, Metaspace, WordPiece, ...) is refused by name.

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>

#include "dayzero/serve/tokenizer/bpe.h"
#include "dayzero/serve/tokenizer/regex.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::serve {

// HF's SplitDelimiterBehavior.
enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct SplitStep {
  std::variant<Regex, std::string> pattern;  // a regex, or a literal string
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
};

struct ByteLevelStep {
  bool add_prefix_space = true;  // HF's default
  bool use_regex = true;         // split with GPT-2's pattern first
};

class HfTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<HfTokenizer>> load(const std::string& path);
  // `json_text` is the file's content; `file_name` prefixes error messages.
  static Result<std::unique_ptr<HfTokenizer>> from_json(std::string_view json_text,
                                                        std::string_view file_name);

  Result<std::vector<int32_t>> encode(std::string_view text,
                                      const EncodeOptions& options = {}) const override;
  std::optional<std::string_view> token_bytes(int32_t id) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_to_token_.size()); }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(int32_t id) const override;
  const std::vector<SpecialToken>& special_tokens() const override { return special_tokens_; }
  std::string_view source() const override { return "tokenizer.json"; }

  // The pieces the pre-tokenizer cuts `text` into (raw bytes, before the byte-level map); for
  // tests and `dayzero tokenize --pieces`.
  Result<std::vector<std::string>> pre_tokenize(std::string_view text) const;

 private:
  struct Parser;
  HfTokenizer() = default;
  Status apply_split(const SplitStep& step, std::vector<std::string>& pieces) const;
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  // Model.
  BytesToId bytes_to_id_;                       // vocab tokens by their raw bytes
  std::array<int32_t, 256> byte_ids_{};         // id of each single-byte token, or -1
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank, merged id
  std::optional<int32_t> unk_id_;
  bool ignore_merges_ = false;
  // Pre-tokenizer: Split steps in order, then the final ByteLevel.
  std::vector<SplitStep> splits_;
  ByteLevelStep byte_level_;
  std::optional<Regex> byte_level_regex_;
  // Added tokens and the id tables.
  AddedTokenSplitter added_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  std::vector<std::optional<std::string>> id_to_token_;  // [vocab_size]
  std::vector<std::optional<std::string>> id_to_bytes_;  // [vocab_size]
  std::vector<SpecialToken> special_tokens_;
};

}  // namespace dz::serve
