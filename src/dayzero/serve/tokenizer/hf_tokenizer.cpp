#include "dayzero/serve/tokenizer/hf_tokenizer.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "dayzero/core/mapped_file.h"

namespace dz::serve {

using nlohmann::json;

namespace {

// GPT-2's pattern, which ByteLevel applies when use_regex is true (HF byte_level.rs).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status field_error(StatusCode code, std::string_view field, std::string_view problem) {
  return make_error(code, "{}: {}", field, problem);
}

Result<bool> get_bool(const json& object, const char* key, bool fallback, std::string_view path) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) {
    return field_error(StatusCode::kInvalidArgument, fmt::format("{}.{}", path, key),
                       "must be true or false");
  }
  return it->get<bool>();
}

// A string field that dayzero only accepts null or empty for (BPE options it does not implement).
Status require_unset(const json& object, const char* key, std::string_view path) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty()) ||
      (it->is_number() && it->get<double>() == 0.0) || (it->is_boolean() && !it->get<bool>())) {
    return Status::ok_status();
  }
  return field_error(
      StatusCode::kUnsupported, fmt::format("{}.{}", path, key),
      fmt::format("{} is not supported (byte-level BPE leaves it unset)", it->dump()));
}

std::string type_of(const json& object) {
  auto it = object.find("type");
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

Result<SplitBehavior> parse_behavior(const json& step, std::string_view path) {
  auto it = step.find("behavior");
  if (it == step.end() || !it->is_string()) {
    return field_error(StatusCode::kInvalidArgument, fmt::format("{}.behavior", path),
                       "missing or not a string");
  }
  const std::string name = it->get<std::string>();
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return field_error(StatusCode::kUnsupported, fmt::format("{}.behavior", path),
                     fmt::format("\"{}\" is not a split behavior", name));
}

}  // namespace

// Reads the parts of tokenizer.json into an HfTokenizer; messages carry the JSON path.
struct HfTokenizer::Parser {
  HfTokenizer& tok;

  Status model(const json& root) {
    auto it = root.find("model");
    if (it == root.end() || !it->is_object()) {
      return field_error(StatusCode::kInvalidArgument, "model", "missing or not an object");
    }
    const json& model = *it;
    if (type_of(model) != "BPE") {
      return field_error(
          StatusCode::kUnsupported, "model.type",
          fmt::format("\"{}\" is not supported (only byte-level \"BPE\")", type_of(model)));
    }
    for (const char* key :
         {"dropout", "continuing_subword_prefix", "end_of_word_suffix", "byte_fallback"}) {
      DZ_RETURN_IF_ERROR(require_unset(model, key, "model"));
    }
    DZ_ASSIGN_OR_RETURN(tok.ignore_merges_, get_bool(model, "ignore_merges", false, "model"));
    auto vocab = model.find("vocab");
    if (vocab == model.end() || !vocab->is_object()) {
      return field_error(StatusCode::kInvalidArgument, "model.vocab", "missing or not an object");
    }
    for (const auto& [token, id_json] : vocab->items()) {
      if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
          id_json.get<int64_t>() >= INT32_MAX) {
        return field_error(StatusCode::kInvalidArgument, fmt::format("model.vocab[\"{}\"]", token),
                           fmt::format("id {} is not a non-negative integer", id_json.dump()));
      }
      auto id = static_cast<int32_t>(id_json.get<int64_t>());
      if (!set_token(id, token)) {
        return field_error(StatusCode::kInvalidArgument, fmt::format("model.vocab[\"{}\"]", token),
                           fmt::format("id {} is also used by \"{}\"", id, *tok.id_to_token_[id]));
      }
      tok.token_to_id_[token] = id;
      std::optional<std::string> bytes = byte_level_to_bytes(token);
      // Rust's ByteLevel decoder falls back to the token's own UTF-8 when a character is not in
      // the byte alphabet; such tokens cannot come out of byte-level BPE.
      tok.id_to_bytes_[id] = bytes ? *bytes : token;
      if (bytes) tok.bytes_to_id_[*bytes] = id;
    }
    tok.byte_ids_.fill(-1);
    for (int byte = 0; byte < 256; ++byte) {
      auto found = tok.bytes_to_id_.find(std::string(1, static_cast<char>(byte)));
      if (found != tok.bytes_to_id_.end()) tok.byte_ids_[byte] = found->second;
    }
    auto unk = model.find("unk_token");
    if (unk != model.end() && !unk->is_null()) {
      if (!unk->is_string() || !tok.token_to_id_.contains(unk->get<std::string>())) {
        return field_error(StatusCode::kInvalidArgument, "model.unk_token",
                           fmt::format("{} is not a token of model.vocab", unk->dump()));
      }
      tok.unk_id_ = tok.token_to_id_.find(unk->get<std::string>())->second;
    }
    return merges(model);
  }

  Status merges(const json& model) {
    auto merges = model.find("merges");
    if (merges == model.end() || !merges->is_array()) {
      return field_error(StatusCode::kInvalidArgument, "model.merges", "missing or not an array");
    }
    for (size_t rank = 0; rank < merges->size(); ++rank) {
      const json& entry = (*merges)[rank];
      const std::string path = fmt::format("model.merges[{}]", rank);
      std::string left, right;
      if (entry.is_string()) {  // "a b", the format before tokenizers 0.20
        const std::string text = entry.get<std::string>();
        size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos) {
          return field_error(StatusCode::kInvalidArgument, path,
                             fmt::format("\"{}\" is not two tokens separated by one space", text));
        }
        left = text.substr(0, space);
        right = text.substr(space + 1);
      } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
                 entry[1].is_string()) {  // ["a", "b"]
        left = entry[0].get<std::string>();
        right = entry[1].get<std::string>();
      } else {
        return field_error(StatusCode::kInvalidArgument, path,
                           fmt::format("{} is neither \"a b\" nor [\"a\", \"b\"]", entry.dump()));
      }
      int32_t ids[3];
      const std::string parts[3] = {left, right, left + right};
      for (int k = 0; k < 3; ++k) {
        auto found = tok.token_to_id_.find(parts[k]);
        if (found == tok.token_to_id_.end()) {
          return field_error(
              StatusCode::kInvalidArgument, path,
              fmt::format("references \"{}\", which is not in model.vocab", parts[k]));
        }
        ids[k] = found->second;
      }
      // A repeated pair keeps its last rank, as HF's HashMap collect does.
      uint64_t key = (static_cast<uint64_t>(ids[0]) << 32) | static_cast<uint32_t>(ids[1]);
      tok.merges_[key] = Merge{static_cast<int32_t>(rank), ids[2]};
    }
    return Status::ok_status();
  }

  Status normalizer(const json& root) {
    auto it = root.find("normalizer");
    if (it == root.end() || it->is_null()) return Status::ok_status();
    if (type_of(*it) == "Sequence" && it->contains("normalizers") &&
        (*it)["normalizers"].is_array() && (*it)["normalizers"].empty()) {
      return Status::ok_status();
    }
    return field_error(StatusCode::kUnsupported, "normalizer.type",
                       fmt::format("\"{}\" is not supported (byte-level BPE checkpoints have none)",
                                   type_of(*it)));
  }

  Status pre_tokenizer(const json& root) {
    auto it = root.find("pre_tokenizer");
    if (it == root.end() || it->is_null()) {
      return field_error(StatusCode::kUnsupported, "pre_tokenizer",
                         "missing; byte-level BPE needs a ByteLevel step");
    }
    std::vector<std::pair<const json*, std::string>> steps;
    if (type_of(*it) == "Sequence") {
      auto list = it->find("pretokenizers");
      if (list == it->end() || !list->is_array()) {
        return field_error(StatusCode::kInvalidArgument, "pre_tokenizer.pretokenizers",
                           "missing or not an array");
      }
      for (size_t k = 0; k < list->size(); ++k) {
        steps.emplace_back(&(*list)[k], fmt::format("pre_tokenizer.pretokenizers[{}]", k));
      }
    } else {
      steps.emplace_back(&*it, "pre_tokenizer");
    }
    for (size_t k = 0; k < steps.size(); ++k) {
      const auto& [step, path] = steps[k];
      const std::string type = type_of(*step);
      const bool last = k + 1 == steps.size();
      if (type == "Split" && !last) {
        DZ_RETURN_IF_ERROR(split(*step, path));
      } else if (type == "ByteLevel" && last) {
        DZ_ASSIGN_OR_RETURN(tok.byte_level_.add_prefix_space,
                            get_bool(*step, "add_prefix_space", true, path));
        DZ_ASSIGN_OR_RETURN(tok.byte_level_.use_regex, get_bool(*step, "use_regex", true, path));
        if (tok.byte_level_.use_regex) {
          DZ_ASSIGN_OR_RETURN(tok.byte_level_regex_, Regex::compile(kGpt2Pattern));
        }
      } else if (type == "Split" || type == "ByteLevel") {
        return field_error(StatusCode::kUnsupported, path + ".type",
                           "ByteLevel must be the last pre-tokenizer step and come once");
      } else {
        return field_error(StatusCode::kUnsupported, path + ".type",
                           fmt::format("\"{}\" is not supported (Split and ByteLevel are)", type));
      }
    }
    return Status::ok_status();
  }

  Status split(const json& step, const std::string& path) {
    SplitStep out;
    DZ_ASSIGN_OR_RETURN(out.behavior, parse_behavior(step, path));
    DZ_ASSIGN_OR_RETURN(out.invert, get_bool(step, "invert", false, path));
    auto pattern = step.find("pattern");
    if (pattern != step.end() && pattern->is_object() && pattern->contains("Regex") &&
        (*pattern)["Regex"].is_string()) {
      Result<Regex> regex = Regex::compile((*pattern)["Regex"].get<std::string>());
      if (!regex.ok()) return regex.status().with_context(path + ".pattern.Regex");
      out.pattern = std::move(regex).value();
    } else if (pattern != step.end() && pattern->is_object() && pattern->contains("String") &&
               (*pattern)["String"].is_string()) {
      out.pattern = (*pattern)["String"].get<std::string>();
    } else {
      return field_error(StatusCode::kInvalidArgument, path + ".pattern",
                         "must be {\"Regex\": \"...\"} or {\"String\": \"...\"}");
    }
    tok.splits_.push_back(std::move(out));
    return Status::ok_status();
  }

  Status decoder(const json& root) {
    auto it = root.find("decoder");
    const json* decoder = it != root.end() ? &*it : nullptr;
    if (decoder != nullptr && type_of(*decoder) == "Sequence" && decoder->contains("decoders") &&
        (*decoder)["decoders"].is_array() && (*decoder)["decoders"].size() == 1) {
      decoder = &(*decoder)["decoders"][0];
    }
    if (decoder == nullptr || decoder->is_null() || type_of(*decoder) != "ByteLevel") {
      return field_error(StatusCode::kUnsupported, "decoder",
                         fmt::format("{} is not supported (byte-level BPE decodes with ByteLevel)",
                                     decoder == nullptr ? "null" : decoder->dump()));
    }
    return Status::ok_status();
  }

  Status added_tokens(const json& root) {
    auto it = root.find("added_tokens");
    if (it == root.end() || it->is_null()) return Status::ok_status();
    if (!it->is_array()) {
      return field_error(StatusCode::kInvalidArgument, "added_tokens", "not an array");
    }
    std::vector<AddedTokenSpec> specs;
    for (size_t k = 0; k < it->size(); ++k) {
      const json& entry = (*it)[k];
      const std::string path = fmt::format("added_tokens[{}]", k);
      if (!entry.is_object() || !entry.contains("id") || !entry["id"].is_number_integer() ||
          entry["id"].get<int64_t>() < 0 || entry["id"].get<int64_t>() >= INT32_MAX ||
          !entry.contains("content") || !entry["content"].is_string() ||
          entry["content"].get<std::string>().empty()) {
        return field_error(StatusCode::kInvalidArgument, path,
                           "needs a non-negative integer \"id\" and a non-empty \"content\"");
      }
      AddedTokenSpec spec;
      spec.id = static_cast<int32_t>(entry["id"].get<int64_t>());
      spec.content = entry["content"].get<std::string>();
      DZ_ASSIGN_OR_RETURN(spec.special, get_bool(entry, "special", false, path));
      DZ_ASSIGN_OR_RETURN(spec.single_word, get_bool(entry, "single_word", false, path));
      DZ_ASSIGN_OR_RETURN(spec.lstrip, get_bool(entry, "lstrip", false, path));
      DZ_ASSIGN_OR_RETURN(spec.rstrip, get_bool(entry, "rstrip", false, path));
      // An added token may repeat its vocab entry (DeepSeek's BOS); it then wins for its id.
      set_token(spec.id, spec.content, /*overwrite=*/true);
      tok.id_to_bytes_[spec.id] = spec.content;
      tok.token_to_id_[spec.content] = spec.id;
      if (spec.special) tok.special_tokens_.push_back({spec.id, spec.content});
      specs.push_back(std::move(spec));
    }
    tok.added_ = AddedTokenSplitter(std::move(specs));
    return Status::ok_status();
  }

  // Records `token` as the string of `id`; false if a different token already holds the id.
  bool set_token(int32_t id, const std::string& token, bool overwrite = false) {
    if (static_cast<size_t>(id) >= tok.id_to_token_.size()) {
      tok.id_to_token_.resize(id + 1);
      tok.id_to_bytes_.resize(id + 1);
    }
    auto& slot = tok.id_to_token_[id];
    if (slot && *slot != token && !overwrite) return false;
    slot = token;
    return true;
  }
};

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::load(const std::string& path) {
  DZ_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  std::string_view text(reinterpret_cast<const char*>(file.data()), file.size_bytes());
  return from_json(text, path);
}

Result<std::unique_ptr<HfTokenizer>> HfTokenizer::from_json(std::string_view json_text,
                                                            std::string_view file_name) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& error) {
    return make_error(StatusCode::kInvalidArgument, "{}: bad JSON: {}", file_name, error.what());
  }
  if (!root.is_object()) {
    return make_error(StatusCode::kInvalidArgument, "{}: not a JSON object", file_name);
  }
  std::unique_ptr<HfTokenizer> tok(new HfTokenizer());
  Parser parser{*tok};
  Status status = parser.model(root);
  if (status.ok()) status = parser.normalizer(root);
  if (status.ok()) status = parser.pre_tokenizer(root);
  if (status.ok()) status = parser.decoder(root);
  if (status.ok()) status = parser.added_tokens(root);
  // post_processor is read by nobody: dayzero's chat templates place BOS themselves.
  if (!status.ok()) return status.with_context(file_name);
  return tok;
}

Status HfTokenizer::apply_split(const SplitStep& step, std::vector<std::string>& pieces) const {
  std::vector<std::string> out;
  for (const std::string& piece : pieces) {
    std::vector<RegexMatch> matches;
    if (const auto* regex = std::get_if<Regex>(&step.pattern)) {
      DZ_ASSIGN_OR_RETURN(matches, regex->find_all(piece));
    } else if (const auto& literal = std::get<std::string>(step.pattern); !literal.empty()) {
      for (size_t at = piece.find(literal); at != std::string::npos;
           at = piece.find(literal, at + literal.size())) {
        matches.push_back({at, at + literal.size()});
      }
    }
    // (begin, end, is_match) covering the piece, as HF's Pattern::find_matches.
    struct Part {
      size_t begin, end;
      bool is_match;
    };
    std::vector<Part> parts;
    size_t prev = 0;
    for (const RegexMatch& match : matches) {
      if (prev < match.begin) parts.push_back({prev, match.begin, false});
      parts.push_back({match.begin, match.end, true});
      prev = match.end;
    }
    if (prev < piece.size()) parts.push_back({prev, piece.size(), false});
    if (step.invert) {
      for (Part& part : parts) part.is_match = !part.is_match;
    }
    // The folds of HF's NormalizedString::split, one per behavior.
    std::vector<Part> kept;
    bool previous_match = false;
    switch (step.behavior) {
      case SplitBehavior::kRemoved:
        for (const Part& part : parts)
          if (!part.is_match) kept.push_back(part);
        break;
      case SplitBehavior::kIsolated:
        kept = parts;
        break;
      case SplitBehavior::kMergedWithPrevious:
        for (const Part& part : parts) {
          if (part.is_match && !previous_match && !kept.empty()) {
            kept.back().end = part.end;
          } else {
            kept.push_back(part);
          }
          previous_match = part.is_match;
        }
        break;
      case SplitBehavior::kMergedWithNext:
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
          if (it->is_match && !previous_match && !kept.empty()) {
            kept.back().begin = it->begin;
          } else {
            kept.push_back(*it);
          }
          previous_match = it->is_match;
        }
        std::reverse(kept.begin(), kept.end());
        break;
      case SplitBehavior::kContiguous:
        for (const Part& part : parts) {
          if (part.is_match == previous_match && !kept.empty()) {
            kept.back().end = part.end;
          } else {
            kept.push_back(part);
          }
          previous_match = part.is_match;
        }
        break;
    }
    for (const Part& part : kept) {
      if (part.end > part.begin) out.push_back(piece.substr(part.begin, part.end - part.begin));
    }
  }
  pieces = std::move(out);
  return Status::ok_status();
}

Result<std::vector<std::string>> HfTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces;
  if (text.empty()) return pieces;
  pieces.emplace_back(text);
  for (const SplitStep& step : splits_) DZ_RETURN_IF_ERROR(apply_split(step, pieces));
  std::vector<std::string> out;
  for (std::string& piece : pieces) {
    // HF adds the prefix space to every piece that reaches ByteLevel, not only the first.
    if (byte_level_.add_prefix_space && piece.front() != ' ') piece.insert(0, 1, ' ');
    if (!byte_level_regex_) {
      out.push_back(std::move(piece));
      continue;
    }
    DZ_ASSIGN_OR_RETURN(std::vector<RegexMatch> matches, byte_level_regex_->find_all(piece));
    size_t prev = 0;
    for (const RegexMatch& match : matches) {
      if (prev < match.begin) out.push_back(piece.substr(prev, match.begin - prev));
      out.push_back(piece.substr(match.begin, match.end - match.begin));
      prev = match.end;
    }
    if (prev < piece.size()) out.push_back(piece.substr(prev));
  }
  return out;
}

void HfTokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto found = bytes_to_id_.find(piece);
    if (found != bytes_to_id_.end()) {
      out.push_back(found->second);
      return;
    }
  }
  std::vector<int32_t> ids;
  ids.reserve(piece.size());
  for (char c : piece) {
    int32_t id = byte_ids_[static_cast<uint8_t>(c)];
    // A byte without a token becomes unk, or is dropped when there is none (as HF does).
    if (id < 0 && unk_id_) id = *unk_id_;
    if (id >= 0) ids.push_back(id);
  }
  bpe_merge(ids, [this](int32_t left, int32_t right, int, int, int) {
    auto found = merges_.find((static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right));
    return found == merges_.end() ? Merge{} : found->second;
  });
  out.insert(out.end(), ids.begin(), ids.end());
}

Result<std::vector<int32_t>> HfTokenizer::encode(std::string_view text,
                                                 const EncodeOptions& options) const {
  if (size_t bad = utf8_error_offset(text); bad != std::string_view::npos) {
    return make_error(StatusCode::kInvalidArgument, "text is not valid UTF-8 at byte {}", bad);
  }
  std::vector<int32_t> ids;
  for (const TextSegment& segment : added_.split(text, options.allow_special)) {
    if (segment.token_id >= 0) {
      ids.push_back(segment.token_id);
      continue;
    }
    DZ_ASSIGN_OR_RETURN(std::vector<std::string> pieces, pre_tokenize(segment.text));
    for (const std::string& piece : pieces) bpe(piece, ids);
  }
  return ids;
}

std::optional<std::string_view> HfTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_bytes_.size() || !id_to_bytes_[id]) {
    return std::nullopt;
  }
  return std::string_view(*id_to_bytes_[id]);
}

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  auto found = token_to_id_.find(token);
  if (found == token_to_id_.end()) return std::nullopt;
  return found->second;
}

std::optional<std::string> HfTokenizer::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return std::nullopt;
  return id_to_token_[id];
}

}  // namespace dz::serve
