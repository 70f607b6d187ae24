#pragma once
// Text <-> token ids for the checkpoints dayzero serves. Two file formats, one interface:
//  - tokenizer.json (HF tokenizers) with a byte-level BPE model: DeepSeek-V3/V3.2, Llama-3 style;
//  - tiktoken.model + tokenizer_config.json: Kimi-K2 / Kimi-Linear / Kimi-K3.
// Both are checked against independent implementations (npm @huggingface/tokenizers and tiktoken)
// by tests/npm and python/tests/test_tokenizers.py.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dayzero/core/status.h"

namespace dz::serve {

struct EncodeOptions {
  // When false, the text of special tokens is encoded as ordinary text (user and tool content);
  // when true it becomes the special token's id (templates). HF non-special added tokens are
  // matched either way, as HF does.
  bool allow_special = true;
};

struct SpecialToken {
  int32_t id = 0;
  std::string content;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Fails only on text that is not valid UTF-8 (kInvalidArgument, naming the byte offset) or a
  // regex engine limit. Adds no BOS: chat templates place it.
  virtual Result<std::vector<int32_t>> encode(std::string_view text,
                                              const EncodeOptions& options = {}) const = 0;

  // The exact bytes of the tokens, concatenated; decode(encode(s)) == s. Bytes of one character
  // may be split across tokens, so a prefix of the ids can decode to a partial UTF-8 sequence.
  // Ids outside the vocabulary are skipped, as HF tokenizers does.
  std::string decode(std::span<const int32_t> ids) const;

  // The raw bytes of one token, or nullopt for an id with no token.
  virtual std::optional<std::string_view> token_bytes(int32_t id) const = 0;

  // One past the largest id (ids may have holes).
  virtual int32_t vocab_size() const = 0;

  // Token strings are the byte-level form HF uses in vocab files ("Ġthe"); special and added
  // tokens are their content ("<|im_end|>").
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(int32_t id) const = 0;

  virtual const std::vector<SpecialToken>& special_tokens() const = 0;
  // "tokenizer.json" or "tiktoken.model": which file the tokenizer came from.
  virtual std::string_view source() const = 0;
};

// Loads `model_dir`/tokenizer.json if present, else `model_dir`/tiktoken.model with
// `model_dir`/tokenizer_config.json. Errors name the file and the field that is wrong.
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& model_dir);

}  // namespace dz::serve
