// Jinja lexer: pieces of text between tags, tags tokenized with their braces balanced (a `}}`
// inside a dict literal does not close `{{`), then whitespace control over the text pieces.

#include "dayzero/serve/chat/lexer.h"

#include <cctype>
#include <charconv>

namespace dz::serve::chat {
namespace {

enum class TagKind : uint8_t { kVar, kBlock, kComment };

struct Piece {
  bool is_tag = false;
  std::string text;  // text pieces
  TagKind tag = TagKind::kVar;
  bool strip_left = false;    // {%-
  bool plus_left = false;     // {%+ : no lstrip_blocks
  bool strip_right = false;   // -%}
  bool plus_right = false;    // +%} : no trim_blocks
  std::vector<Token> tokens;  // begin, inner tokens, end
};

class Lexer {
 public:
  Lexer(std::string_view src, const LexLimits& limits) : src_(src), limits_(limits) {}

  Result<std::vector<Piece>> split() {
    std::vector<Piece> pieces;
    while (pos_ < src_.size()) {
      size_t open = find_open(pos_);
      if (open > pos_) {
        Piece text;
        text.text = std::string(src_.substr(pos_, open - pos_));
        advance_to(open);
        pieces.push_back(std::move(text));
      }
      if (open >= src_.size()) break;
      DZ_ASSIGN_OR_RETURN(Piece tag, lex_tag());
      pieces.push_back(std::move(tag));
      if (++num_tokens_ > limits_.max_tokens) return error("template has too many tokens");
    }
    return pieces;
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i)
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return src_.size();
  }

  void advance_to(size_t target) {
    for (; pos_ < target; ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else if ((static_cast<unsigned char>(src_[pos_]) & 0xc0) != 0x80) {
        ++col_;
      }
    }
  }

  Status error(std::string_view what) const {
    return make_error(StatusCode::kInvalidArgument, "template line {} column {}: {}", line_, col_,
                      what);
  }

  Token make(TokenKind kind, std::string text) const {
    return Token{.kind = kind, .text = std::move(text), .line = line_, .column = col_};
  }

  Result<Piece> lex_tag() {
    Piece piece;
    piece.is_tag = true;
    char second = src_[pos_ + 1];
    piece.tag = second == '{' ? TagKind::kVar : second == '%' ? TagKind::kBlock : TagKind::kComment;
    Token begin = make(piece.tag == TagKind::kVar ? TokenKind::kVarBegin : TokenKind::kBlockBegin,
                       std::string(src_.substr(pos_, 2)));
    advance_to(pos_ + 2);
    if (pos_ < src_.size() && src_[pos_] == '-') {
      piece.strip_left = true;
      advance_to(pos_ + 1);
    } else if (pos_ < src_.size() && src_[pos_] == '+') {
      piece.plus_left = true;
      advance_to(pos_ + 1);
    }
    if (piece.tag == TagKind::kComment) {
      size_t close = src_.find("#}", pos_);
      if (close == std::string_view::npos) return error("unclosed comment");
      piece.strip_right = close > pos_ && src_[close - 1] == '-';
      piece.plus_right = close > pos_ && src_[close - 1] == '+';
      advance_to(close + 2);
      return piece;
    }
    piece.tokens.push_back(std::move(begin));
    const char close_char = piece.tag == TagKind::kVar ? '}' : '%';
    int depth = 0;  // open ( [ { inside the tag
    while (true) {
      while (pos_ < src_.size() && std::isspace(static_cast<unsigned char>(src_[pos_])))
        advance_to(pos_ + 1);
      if (pos_ >= src_.size())
        return error(piece.tag == TagKind::kVar ? "unclosed '{{'" : "unclosed '{%'");
      if (++num_tokens_ > limits_.max_tokens) return error("template has too many tokens");
      // End of tag: [-+]?%} or [-+]?}} when no bracket is open.
      if (depth == 0) {
        size_t at = pos_;
        bool minus = src_[at] == '-', plus = src_[at] == '+';
        if (minus || plus) ++at;
        if (at + 1 < src_.size() && src_[at] == close_char && src_[at + 1] == '}') {
          piece.strip_right = minus;
          piece.plus_right = plus;
          advance_to(at);
          piece.tokens.push_back(
              make(piece.tag == TagKind::kVar ? TokenKind::kVarEnd : TokenKind::kBlockEnd, "end"));
          advance_to(at + 2);
          return piece;
        }
      }
      char c = src_[pos_];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
          ++end;
        piece.tokens.push_back(make(TokenKind::kName, std::string(src_.substr(pos_, end - pos_))));
        advance_to(end);
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        DZ_ASSIGN_OR_RETURN(Token number, lex_number());
        piece.tokens.push_back(std::move(number));
      } else if (c == '"' || c == '\'') {
        DZ_ASSIGN_OR_RETURN(Token str, lex_string(c));
        piece.tokens.push_back(std::move(str));
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (std::string_view two : kTwo)
          if (src_.substr(pos_, 2) == two) op = std::string(two);
        if (op.size() == 1 && std::string_view("()[]{}.,:|~+-*/%<>=").find(c) == std::string::npos)
          return error(fmt::format("unexpected character '{}'", c));
        if (c == '(' || c == '[' || c == '{') ++depth;
        if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        piece.tokens.push_back(make(TokenKind::kOperator, op));
        advance_to(pos_ + op.size());
      }
    }
  }

  Result<Token> lex_number() {
    size_t end = pos_;
    bool is_float = false;
    while (end < src_.size() &&
           (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
      ++end;
    if (end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      ++end;
      while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        end = e;
        while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
      }
    }
    std::string digits;
    for (char ch : src_.substr(pos_, end - pos_))
      if (ch != '_') digits += ch;
    Token token = make(is_float ? TokenKind::kFloat : TokenKind::kInt, digits);
    if (is_float) {
      token.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      auto [ptr, ec] =
          std::from_chars(digits.data(), digits.data() + digits.size(), token.int_value);
      if (ec != std::errc()) return error("integer literal out of range");
    }
    advance_to(end);
    return token;
  }

  Result<Token> lex_string(char quote) {
    Token token = make(TokenKind::kString, "");
    size_t i = pos_ + 1;
    std::string value;
    while (true) {
      if (i >= src_.size()) return error("unterminated string literal");
      char c = src_[i];
      if (c == quote) break;
      if (c == '\\' && i + 1 < src_.size()) {
        char e = src_[i + 1];
        i += 2;
        switch (e) {
          case 'n':
            value += '\n';
            break;
          case 't':
            value += '\t';
            break;
          case 'r':
            value += '\r';
            break;
          case '\\':
            value += '\\';
            break;
          case '\'':
            value += '\'';
            break;
          case '"':
            value += '"';
            break;
          case '\n':
            break;
          default:
            value += '\\';
            value += e;
            break;  // Python keeps unknown escapes
        }
        continue;
      }
      value += c;
      ++i;
    }
    token.text = std::move(value);
    advance_to(i + 1);
    return token;
  }

  std::string_view src_;
  LexLimits limits_;
  size_t pos_ = 0;
  size_t num_tokens_ = 0;
  int line_ = 1;
  int col_ = 1;
};

bool is_inline_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v';
}

}  // namespace

Result<std::vector<Token>> lex_template(std::string_view source, const LexLimits& limits) {
  if (source.size() > limits.max_source_bytes)
    return make_error(StatusCode::kInvalidArgument, "template is {} bytes, over the {} limit",
                      source.size(), limits.max_source_bytes);
  // jinja2 turns every \r\n and \r of the source into \n (its newline_sequence), then drops one
  // trailing newline (keep_trailing_newline=False). Text from the context is not touched.
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  source = normalized;
  Lexer lexer(source, limits);
  DZ_ASSIGN_OR_RETURN(std::vector<Piece> pieces, lexer.split());

  // Whitespace control over text pieces, looking at the tags on either side.
  for (size_t i = 0; i < pieces.size(); ++i) {
    Piece& piece = pieces[i];
    if (piece.is_tag) continue;
    std::string& text = piece.text;
    const Piece* before = i > 0 ? &pieces[i - 1] : nullptr;
    const Piece* after = i + 1 < pieces.size() ? &pieces[i + 1] : nullptr;
    bool starts_line = i == 0;
    if (before && before->strip_right) {
      size_t k = 0;
      while (k < text.size() && std::isspace(static_cast<unsigned char>(text[k]))) ++k;
      text.erase(0, k);
    } else if (before && before->tag != TagKind::kVar && !before->plus_right) {
      // trim_blocks: the newline right after a block or comment tag goes.
      if (text.starts_with("\n")) {
        text.erase(0, 1);
        starts_line = true;
      }
    }
    if (after && after->strip_left) {
      size_t k = text.size();
      while (k > 0 && std::isspace(static_cast<unsigned char>(text[k - 1]))) --k;
      text.resize(k);
    } else if (after && after->tag != TagKind::kVar && !after->plus_left) {
      // lstrip_blocks: spaces and tabs from the start of the line up to a block or comment tag.
      size_t line_start = text.rfind('\n');
      line_start = line_start == std::string::npos ? 0 : line_start + 1;
      if (line_start > 0 || starts_line) {
        bool blank = true;
        for (size_t k = line_start; k < text.size(); ++k) blank = blank && is_inline_space(text[k]);
        if (blank) text.resize(line_start);
      }
    }
  }

  std::vector<Token> tokens;
  for (Piece& piece : pieces) {
    if (!piece.is_tag) {
      if (!piece.text.empty())
        tokens.push_back(Token{.kind = TokenKind::kText, .text = std::move(piece.text)});
      continue;
    }
    for (Token& token : piece.tokens) tokens.push_back(std::move(token));
  }
  tokens.push_back(Token{.kind = TokenKind::kEof, .text = "end of template"});
  return tokens;
}

}  // namespace dz::serve::chat
