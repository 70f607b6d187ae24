#include "dayzero/core/base64.h"

#include <cstdint>

namespace dz {
namespace {

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int value_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

}  // namespace

std::optional<std::string> decode_base64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  size_t num_padding = 0;
  while (num_padding < 2 && text[text.size() - 1 - num_padding] == '=') ++num_padding;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int num_bits = 0;
  for (size_t k = 0; k < text.size() - num_padding; ++k) {
    const int value = value_of(text[k]);
    if (value < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(value);
    num_bits += 6;
    if (num_bits >= 8) {
      num_bits -= 8;
      out += static_cast<char>((bits >> num_bits) & 0xFF);
    }
  }
  // Leftover bits must be zero padding.
  if ((bits & ((1u << num_bits) - 1)) != 0) return std::nullopt;
  return out;
}

std::string encode_base64(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t k = 0;
  for (; k + 3 <= bytes.size(); k += 3) {
    const uint32_t v = uint32_t{static_cast<uint8_t>(bytes[k])} << 16 |
                       uint32_t{static_cast<uint8_t>(bytes[k + 1])} << 8 |
                       static_cast<uint8_t>(bytes[k + 2]);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 63];
  }
  const size_t rest = bytes.size() - k;
  if (rest > 0) {
    uint32_t v = uint32_t{static_cast<uint8_t>(bytes[k])} << 16;
    if (rest == 2) v |= uint32_t{static_cast<uint8_t>(bytes[k + 1])} << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

}  // namespace dz
