#include "dayzero/serve/tokenizer/tiktoken_tokenizer.h"

#include <charconv>

#include <nlohmann/json.hpp>

#include "dayzero/core/base64.h"
#include "dayzero/core/mapped_file.h"

namespace dz::serve {
namespace {

// Python's str.isspace: Unicode White_Space plus the separators U+001C..U+001F.
bool python_isspace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

uint32_t decode_at(std::string_view text, size_t pos, size_t* num_bytes) {
  auto lead = static_cast<unsigned char>(text[pos]);
  size_t count = utf8_sequence_bytes(lead);
  uint32_t cp = count == 1 ? lead : lead & (0xFF >> (count + 1));
  for (size_t k = 1; k < count; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(text[pos + k]) & 0x3F);
  *num_bytes = count;
  return cp;
}

}  // namespace

Result<std::unique_ptr<TiktokenTokenizer>> TiktokenTokenizer::load(const std::string& model_path,
                                                                   const std::string& config_path,
                                                                   const TiktokenOptions& options) {
  DZ_ASSIGN_OR_RETURN(MappedFile ranks_file, MappedFile::open(model_path));
  std::string_view ranks(reinterpret_cast<const char*>(ranks_file.data()), ranks_file.size_bytes());
  std::string_view config;
  MappedFile config_file;
  if (!config_path.empty()) {
    DZ_ASSIGN_OR_RETURN(config_file, MappedFile::open(config_path));
    config = std::string_view(reinterpret_cast<const char*>(config_file.data()),
                              config_file.size_bytes());
  }
  return create(ranks, config, options, model_path, config_path);
}

Result<std::unique_ptr<TiktokenTokenizer>> TiktokenTokenizer::create(std::string_view ranks_text,
                                                                     std::string_view config_text,
                                                                     const TiktokenOptions& options,
                                                                     std::string_view ranks_name,
                                                                     std::string_view config_name) {
  std::unique_ptr<TiktokenTokenizer> tok(new TiktokenTokenizer());
  tok->options_ = options;
  DZ_ASSIGN_OR_RETURN(tok->regex_, Regex::compile(options.pat_str));
  if (Status status = tok->parse_ranks(ranks_text); !status.ok()) {
    return status.with_context(ranks_name);
  }
  if (Status status = tok->parse_specials(config_text); !status.ok()) {
    return status.with_context(config_name);
  }
  return tok;
}

Status TiktokenTokenizer::parse_ranks(std::string_view text) {
  std::vector<size_t> line_of_rank;  // for duplicate messages
  size_t line_number = 0;
  while (!text.empty()) {
    size_t newline = text.find('\n');
    std::string_view line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // load_tiktoken_bpe skips empty lines
    size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      return make_error(StatusCode::kCorrupt, "line {}: \"{}\" is not \"<base64> <rank>\"",
                        line_number, line);
    }
    std::string_view token_text = line.substr(0, space);
    std::string_view rank_text = line.substr(space + 1);
    std::optional<std::string> token = decode_base64(token_text);
    if (!token) {
      return make_error(StatusCode::kCorrupt, "line {}: bad base64 \"{}\"", line_number,
                        token_text);
    }
    int64_t rank = -1;
    auto [end, error] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), rank);
    if (error != std::errc() || end != rank_text.data() + rank_text.size() || rank < 0 ||
        rank >= INT32_MAX / 2) {
      return make_error(StatusCode::kCorrupt, "line {}: bad rank \"{}\"", line_number, rank_text);
    }
    if (static_cast<size_t>(rank) >= rank_bytes_.size()) {
      rank_bytes_.resize(rank + 1);
      line_of_rank.resize(rank + 1, 0);
    }
    if (line_of_rank[rank] != 0) {
      return make_error(StatusCode::kCorrupt, "line {}: rank {} is already used on line {}",
                        line_number, rank, line_of_rank[rank]);
    }
    auto [it, inserted] = ranks_.emplace(*token, static_cast<int32_t>(rank));
    if (!inserted) {
      return make_error(StatusCode::kCorrupt, "line {}: token \"{}\" already has rank {}",
                        line_number, token_text, it->second);
    }
    line_of_rank[rank] = line_number;
    rank_bytes_[rank] = std::move(*token);
  }
  if (rank_bytes_.empty()) return make_error(StatusCode::kCorrupt, "no ranks");
  // Special ids start at the number of ranks, so the ranks must be exactly 0..N-1.
  for (size_t rank = 0; rank < line_of_rank.size(); ++rank) {
    if (line_of_rank[rank] == 0) {
      return make_error(StatusCode::kCorrupt, "rank {} is missing (ranks must be 0..{})", rank,
                        rank_bytes_.size() - 1);
    }
  }
  for (int byte = 0; byte < 256; ++byte) {
    if (!ranks_.contains(std::string(1, static_cast<char>(byte)))) {
      return make_error(StatusCode::kCorrupt, "byte 0x{:02x} has no rank (every byte needs one)",
                        byte);
    }
  }
  return Status::ok_status();
}

Status TiktokenTokenizer::parse_specials(std::string_view config_text) {
  const int32_t first_id = num_ranks();
  const int32_t end_id = first_id + options_.num_reserved_special_tokens;
  std::vector<std::string> names(options_.num_reserved_special_tokens);
  if (!config_text.empty()) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(config_text);
    } catch (const nlohmann::json::exception& error) {
      return make_error(StatusCode::kInvalidArgument, "bad JSON: {}", error.what());
    }
    auto decoder = config.find("added_tokens_decoder");
    if (decoder != config.end() && !decoder->is_null()) {
      if (!decoder->is_object()) {
        return make_error(StatusCode::kInvalidArgument, "added_tokens_decoder: not an object");
      }
      for (const auto& [key, entry] : decoder->items()) {
        int64_t id = -1;
        auto [end, error] = std::from_chars(key.data(), key.data() + key.size(), id);
        if (error != std::errc() || end != key.data() + key.size()) {
          return make_error(StatusCode::kInvalidArgument,
                            "added_tokens_decoder: key \"{}\" is not an id", key);
        }
        if (id < first_id || id >= end_id) {
          return make_error(StatusCode::kInvalidArgument,
                            "added_tokens_decoder[\"{}\"]: id is outside the special range "
                            "[{}, {}) that follows the {} ranks",
                            key, first_id, end_id, first_id);
        }
        if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string() ||
            entry["content"].get<std::string>().empty()) {
          return make_error(StatusCode::kInvalidArgument,
                            "added_tokens_decoder[\"{}\"].content: missing or not a non-empty "
                            "string",
                            key);
        }
        names[id - first_id] = entry["content"].get<std::string>();
      }
    }
  }
  std::vector<AddedTokenSpec> specs;
  for (int32_t id = first_id; id < end_id; ++id) {
    std::string& name = names[id - first_id];
    if (name.empty()) name = fmt::format("<|reserved_token_{}|>", id);
    auto [it, inserted] = special_ids_.emplace(name, id);
    if (!inserted) {
      return make_error(StatusCode::kInvalidArgument,
                        "added_tokens_decoder: \"{}\" names both id {} and id {}", name, it->second,
                        id);
    }
    special_tokens_.push_back({id, name});
    specs.push_back({.id = id, .content = name, .special = true});
  }
  specials_ = AddedTokenSplitter(std::move(specs));
  return Status::ok_status();
}

std::vector<std::string_view> TiktokenTokenizer::chunks(std::string_view text) const {
  std::vector<std::string_view> out;
  size_t pos = 0;
  do {
    // One chunk of at most max_encode_chars code points, cut into runs.
    size_t chunk_start = pos;
    size_t num_chars = 0;
    size_t slice_start = pos;
    size_t run_chars = 0;
    bool run_is_space = false;
    while (pos < text.size() && num_chars < options_.max_encode_chars) {
      size_t num_bytes = 0;
      bool is_space = python_isspace(decode_at(text, pos, &num_bytes));
      if (pos == chunk_start) run_is_space = is_space;
      if (is_space != run_is_space) {
        run_chars = 1;
        run_is_space = is_space;
      } else if (++run_chars > options_.max_run_chars) {
        out.push_back(text.substr(slice_start, pos - slice_start));
        slice_start = pos;
        run_chars = 1;
      }
      pos += num_bytes;
      ++num_chars;
    }
    out.push_back(text.substr(slice_start, pos - slice_start));
  } while (pos < text.size());
  return out;
}

Status TiktokenTokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  DZ_ASSIGN_OR_RETURN(std::vector<RegexMatch> matches, regex_.find_all(text));
  // tiktoken encodes only what the pattern matches; Kimi's pattern matches every character.
  std::vector<int32_t> ids;
  for (const RegexMatch& match : matches) {
    std::string_view piece = text.substr(match.begin, match.end - match.begin);
    if (auto found = ranks_.find(piece); found != ranks_.end()) {
      out.push_back(found->second);
      continue;
    }
    ids.clear();
    for (char c : piece) ids.push_back(ranks_.find(std::string_view(&c, 1))->second);
    bpe_merge(ids, [&](int32_t, int32_t, int begin, int, int end) {
      auto found = ranks_.find(piece.substr(begin, end - begin));
      return found == ranks_.end() ? Merge{} : Merge{found->second, found->second};
    });
    out.insert(out.end(), ids.begin(), ids.end());
  }
  return Status::ok_status();
}

Result<std::vector<int32_t>> TiktokenTokenizer::encode(std::string_view text,
                                                       const EncodeOptions& options) const {
  if (size_t bad = utf8_error_offset(text); bad != std::string_view::npos) {
    return make_error(StatusCode::kInvalidArgument, "text is not valid UTF-8 at byte {}", bad);
  }
  std::vector<int32_t> ids;
  for (std::string_view chunk : chunks(text)) {
    // allowed_special="all" or disallowed_special=() in tokenization_kimi.py.
    for (const TextSegment& segment : specials_.split(chunk, options.allow_special)) {
      if (segment.token_id >= 0) {
        ids.push_back(segment.token_id);
      } else {
        DZ_RETURN_IF_ERROR(encode_ordinary(segment.text, ids));
      }
    }
  }
  return ids;
}

std::optional<std::string_view> TiktokenTokenizer::token_bytes(int32_t id) const {
  if (id >= 0 && id < num_ranks()) return std::string_view(rank_bytes_[id]);
  if (id >= num_ranks() && id < vocab_size()) {
    return std::string_view(special_tokens_[id - num_ranks()].content);
  }
  return std::nullopt;
}

std::optional<int32_t> TiktokenTokenizer::token_to_id(std::string_view token) const {
  if (auto found = special_ids_.find(token); found != special_ids_.end()) return found->second;
  std::optional<std::string> bytes = byte_level_to_bytes(token);
  if (!bytes) return std::nullopt;
  if (auto found = ranks_.find(*bytes); found != ranks_.end()) return found->second;
  return std::nullopt;
}

std::optional<std::string> TiktokenTokenizer::id_to_token(int32_t id) const {
  if (id >= 0 && id < num_ranks()) return bytes_to_byte_level(rank_bytes_[id]);
  if (id >= num_ranks() && id < vocab_size()) return special_tokens_[id - num_ranks()].content;
  return std::nullopt;
}

}  // namespace dz::serve
