// `dayzero tokenize --model DIR (--text T | --ids 1,2,3 | --batch FILE.json)`: the checkpoint's
// tokenizer from the command line, and the entry point of the npm comparison test.

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "dayzero/cli/commands.h"
#include "dayzero/serve/tokenizer/tokenizer.h"

namespace dz::cli {
namespace {

struct TokenizeArgs {
  std::string model_dir;
  std::string text;
  std::string ids;
  std::string batch_path;
  bool no_special = false;
};

Result<std::vector<int32_t>> parse_ids(const std::string& list) {
  std::vector<int32_t> ids;
  std::stringstream stream(list);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      long value = std::stol(item, &used);
      if (used != item.size() || value < INT32_MIN || value > INT32_MAX)
        throw std::out_of_range("");
      ids.push_back(static_cast<int32_t>(value));
    } catch (const std::exception&) {
      return make_error(StatusCode::kInvalidArgument, "--ids: \"{}\" is not an integer", item);
    }
  }
  return ids;
}

// Encodes every string of a JSON array; prints [{"ids": [...], "decoded": "..."}, ...] with the
// decoded bytes as a JSON string (invalid UTF-8 replaced, which a round-trip check then catches).
int run_batch(const serve::Tokenizer& tok, const TokenizeArgs& args) {
  std::ifstream file(args.batch_path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "error: cannot read %s\n", args.batch_path.c_str());
    return 1;
  }
  nlohmann::json texts = nlohmann::json::parse(file, nullptr, /*allow_exceptions=*/false);
  if (!texts.is_array()) {
    std::fprintf(stderr, "error: %s is not a JSON array of strings\n", args.batch_path.c_str());
    return 1;
  }
  nlohmann::json out = nlohmann::json::array();
  for (const auto& text : texts) {
    if (!text.is_string()) {
      std::fprintf(stderr, "error: %s holds a non-string\n", args.batch_path.c_str());
      return 1;
    }
    Result<std::vector<int32_t>> ids =
        tok.encode(text.get<std::string>(), {.allow_special = !args.no_special});
    if (!ids.ok()) {
      std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
      return 1;
    }
    out.push_back({{"ids", *ids}, {"decoded", tok.decode(*ids)}});
  }
  std::puts(out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

int run_tokenize(const TokenizeArgs& args) {
  Result<std::unique_ptr<serve::Tokenizer>> loaded = serve::load_tokenizer(args.model_dir);
  if (!loaded.ok()) {
    std::fprintf(stderr, "error: %s\n", loaded.status().to_string().c_str());
    return 1;
  }
  const serve::Tokenizer& tok = **loaded;
  if (!args.batch_path.empty()) return run_batch(tok, args);
  if (!args.ids.empty()) {
    Result<std::vector<int32_t>> ids = parse_ids(args.ids);
    if (!ids.ok()) {
      std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
      return 1;
    }
    std::string text = tok.decode(*ids);
    std::fwrite(text.data(), 1, text.size(), stdout);  // exact bytes, no newline
    return 0;
  }
  Result<std::vector<int32_t>> ids = tok.encode(args.text, {.allow_special = !args.no_special});
  if (!ids.ok()) {
    std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
    return 1;
  }
  std::puts(nlohmann::json(*ids).dump().c_str());
  return 0;
}

}  // namespace

RunCommand add_tokenize_command(CLI::App& app) {
  auto* command = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids");
  auto args = std::make_shared<TokenizeArgs>();
  command->add_option("--model", args->model_dir, "folder with tokenizer.json or tiktoken.model")
      ->required();
  auto* text = command->add_option("--text", args->text, "text to encode; prints ids as JSON");
  auto* ids = command->add_option("--ids", args->ids, "comma-separated ids to decode to stdout");
  auto* batch = command->add_option("--batch", args->batch_path,
                                    "JSON array of strings; prints ids and decoded text for each");
  text->excludes(ids)->excludes(batch);
  ids->excludes(batch);
  command->add_flag("--no-special", args->no_special, "encode special-token text as ordinary text");
  command->require_option(2, 3);  // --model, one of the three inputs, maybe --no-special
  return [args] { return run_tokenize(*args); };
}

}  // namespace dz::cli
