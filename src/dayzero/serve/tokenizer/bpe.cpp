#include "dayzero/serve/tokenizer/bpe.h"

#include <algorithm>
#include <array>

#include "dayzero/core/check.h"
#include "dayzero/serve/tokenizer/regex.h"

namespace dz::serve {
namespace {

constexpr bool is_printable_latin1(int byte) {
  return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
}

struct ByteLevelTables {
  std::array<uint32_t, 256> to_code_point{};
  std::array<int16_t, 512> to_byte{};  // every mapped code point is below 0x144
  ByteLevelTables() {
    to_byte.fill(-1);
    uint32_t next_shifted = 256;
    for (int byte = 0; byte < 256; ++byte) {
      uint32_t code_point =
          is_printable_latin1(byte) ? static_cast<uint32_t>(byte) : next_shifted++;
      to_code_point[byte] = code_point;
      to_byte[code_point] = static_cast<int16_t>(byte);
    }
  }
};

const ByteLevelTables& tables() {
  static const ByteLevelTables kTables;
  return kTables;
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// Decodes the code point at `pos` of valid UTF-8 text.
uint32_t code_point_at(std::string_view text, size_t pos, size_t* num_bytes) {
  auto lead = static_cast<unsigned char>(text[pos]);
  size_t count = std::min(utf8_sequence_bytes(lead), text.size() - pos);
  uint32_t code_point = count == 1 ? lead : lead & (0xFF >> (count + 1));
  for (size_t k = 1; k < count; ++k) {
    code_point = (code_point << 6) | (static_cast<unsigned char>(text[pos + k]) & 0x3F);
  }
  *num_bytes = count;
  return code_point;
}

// The start of the code point that ends just before `pos`.
size_t previous_code_point(std::string_view text, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return start;
}

// Rust's char::is_whitespace (the White_Space property), which HF uses for lstrip/rstrip.
bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// HF's is_word_char: alphanumeric (Alphabetic or Numeric) or '_', for single_word tokens.
bool is_word_text(std::string_view one_code_point) {
  static const Regex kWord = std::move(Regex::compile("^[\\p{Alphabetic}\\p{N}_]")).value();
  auto matches = kWord.find_all(one_code_point);
  return matches.ok() && !matches->empty();
}

}  // namespace

uint32_t byte_to_code_point(uint8_t byte) {
  return tables().to_code_point[byte];
}

std::optional<uint8_t> code_point_to_byte(uint32_t code_point) {
  if (code_point >= tables().to_byte.size() || tables().to_byte[code_point] < 0)
    return std::nullopt;
  return static_cast<uint8_t>(tables().to_byte[code_point]);
}

std::optional<std::string> byte_level_to_bytes(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  for (size_t pos = 0; pos < token.size();) {
    size_t num_bytes = 0;
    uint32_t code_point = code_point_at(token, pos, &num_bytes);
    std::optional<uint8_t> byte = code_point_to_byte(code_point);
    if (!byte) return std::nullopt;
    bytes += static_cast<char>(*byte);
    pos += num_bytes;
  }
  return bytes;
}

std::string bytes_to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, byte_to_code_point(static_cast<uint8_t>(c)));
  return out;
}

AddedTokenSplitter::AddedTokenSplitter(std::vector<AddedTokenSpec> tokens)
    : tokens_(std::move(tokens)) {
  nodes_.emplace_back();
  for (size_t index = 0; index < tokens_.size(); ++index) {
    int node = 0;
    for (char c : tokens_[index].content) {
      auto byte = static_cast<uint8_t>(c);
      int next = child(node, byte);
      if (next < 0) {
        next = static_cast<int>(nodes_.size());
        nodes_.emplace_back();
        auto& children = nodes_[node].children;
        children.insert(
            std::lower_bound(children.begin(), children.end(), std::pair<uint8_t, int>{byte, -1}),
            {byte, next});
      }
      node = next;
    }
    DZ_CHECK(node != 0, "empty added token");
    nodes_[node].token = static_cast<int>(index);
  }
}

int AddedTokenSplitter::child(int node, uint8_t byte) const {
  const auto& children = nodes_[node].children;
  auto it = std::lower_bound(children.begin(), children.end(), std::pair<uint8_t, int>{byte, -1});
  return it != children.end() && it->first == byte ? it->second : -1;
}

std::vector<TextSegment> AddedTokenSplitter::split(std::string_view text,
                                                   bool allow_special) const {
  std::vector<TextSegment> segments;
  size_t text_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    // Longest allowed token starting at `pos`.
    int best = -1;
    size_t best_end = 0;
    int node = 0;
    for (size_t end = pos; end < text.size(); ++end) {
      node = child(node, static_cast<uint8_t>(text[end]));
      if (node < 0) break;
      int index = nodes_[node].token;
      if (index < 0) continue;
      const AddedTokenSpec& token = tokens_[index];
      if (token.special && !allow_special) continue;
      if (token.single_word) {
        bool word_before = pos > 0 && is_word_text(text.substr(previous_code_point(text, pos)));
        bool word_after = end + 1 < text.size() && is_word_text(text.substr(end + 1));
        if (word_before || word_after) continue;
      }
      best = index;
      best_end = end + 1;
    }
    if (best < 0) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = best_end;
    if (tokens_[best].lstrip) {
      while (start > text_start) {
        size_t prev = previous_code_point(text, start);
        size_t num_bytes = 0;
        if (!is_white_space(code_point_at(text, prev, &num_bytes))) break;
        start = prev;
      }
    }
    if (tokens_[best].rstrip) {
      while (stop < text.size()) {
        size_t num_bytes = 0;
        if (!is_white_space(code_point_at(text, stop, &num_bytes))) break;
        stop += num_bytes;
      }
    }
    if (start > text_start) segments.push_back({text.substr(text_start, start - text_start), -1});
    segments.push_back({text.substr(pos, best_end - pos), tokens_[best].id});
    text_start = pos = stop;
  }
  if (text_start < text.size()) segments.push_back({text.substr(text_start), -1});
  return segments;
}

}  // namespace dz::serve
