#include "dayzero/serve/tokenizer/tokenizer.h"

#include <filesystem>

#include "dayzero/serve/tokenizer/hf_tokenizer.h"
#include "dayzero/serve/tokenizer/tiktoken_tokenizer.h"

namespace dz::serve {

std::string Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string text;
  for (int32_t id : ids) {
    if (std::optional<std::string_view> bytes = token_bytes(id)) text.append(*bytes);
  }
  return text;
}

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  std::error_code error;
  if (!fs::is_directory(dir, error)) {
    return make_error(StatusCode::kNotFound, "{}: not a directory", model_dir);
  }
  if (fs::exists(dir / "tokenizer.json", error)) {
    DZ_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tok,
                        HfTokenizer::load((dir / "tokenizer.json").string()));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  if (fs::exists(dir / "tiktoken.model", error)) {
    const fs::path config = dir / "tokenizer_config.json";
    DZ_ASSIGN_OR_RETURN(
        std::unique_ptr<TiktokenTokenizer> tok,
        TiktokenTokenizer::load((dir / "tiktoken.model").string(),
                                fs::exists(config, error) ? config.string() : std::string()));
    return std::unique_ptr<Tokenizer>(std::move(tok));
  }
  return make_error(StatusCode::kNotFound, "{}: has neither tokenizer.json nor tiktoken.model",
                    model_dir);
}

}  // namespace dz::serve
