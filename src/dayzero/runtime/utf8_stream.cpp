#include "dayzero/runtime/utf8_stream.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace dz::runtime {
namespace {

// Bytes of the character a lead byte starts, 0 if it is not a lead byte (RFC 3629).
size_t sequence_length(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

bool is_continuation(uint8_t byte) {
  return (byte & 0xC0) == 0x80;
}

// The valid range of the second byte after `lead` (the first continuation byte is narrower for
// E0, ED, F0 and F4: no overlong forms, surrogates or code points above U+10FFFF).
std::pair<uint8_t, uint8_t> second_byte_range(uint8_t lead) {
  switch (lead) {
    case 0xE0:
      return {0xA0, 0xBF};
    case 0xED:
      return {0x80, 0x9F};
    case 0xF0:
      return {0x90, 0xBF};
    case 0xF4:
      return {0x80, 0x8F};
    default:
      return {0x80, 0xBF};
  }
}

}  // namespace

std::string replace_invalid_utf8(std::string_view bytes) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const auto lead = static_cast<uint8_t>(bytes[i]);
    if (lead < 0x80) {
      out.push_back(static_cast<char>(lead));
      ++i;
      continue;
    }
    const size_t length = sequence_length(lead);
    size_t valid = length == 0 ? 0 : 1;  // bytes of a well-formed prefix
    while (valid > 0 && valid < length && i + valid < bytes.size()) {
      const auto byte = static_cast<uint8_t>(bytes[i + valid]);
      const auto [lo, hi] =
          valid == 1 ? second_byte_range(lead) : std::pair<uint8_t, uint8_t>{0x80, 0xBF};
      if (byte < lo || byte > hi) break;
      ++valid;
    }
    if (length > 0 && valid == length) {
      out.append(bytes.substr(i, length));
      i += length;
    } else {
      out.append(kReplacement);  // one U+FFFD for the maximal subpart
      i += std::max<size_t>(valid, 1);
    }
  }
  return out;
}

size_t incomplete_utf8_tail(std::string_view bytes) {
  // A character is at most 4 bytes, so the lead of an incomplete one is among the last 3.
  const size_t lookback = std::min<size_t>(3, bytes.size());
  for (size_t k = 1; k <= lookback; ++k) {
    const auto byte = static_cast<uint8_t>(bytes[bytes.size() - k]);
    if (is_continuation(byte)) continue;
    const size_t needed = sequence_length(byte);
    return needed > k ? k : 0;  // a lead missing bytes, or a complete/ASCII/invalid tail
  }
  return 0;
}

std::string Utf8Stream::push(std::string_view bytes) {
  pending_.append(bytes);
  const size_t held = incomplete_utf8_tail(pending_);
  std::string ready =
      replace_invalid_utf8(std::string_view(pending_).substr(0, pending_.size() - held));
  pending_.erase(0, pending_.size() - held);
  return ready;
}

std::string Utf8Stream::finish() {
  std::string rest = replace_invalid_utf8(pending_);
  pending_.clear();
  return rest;
}

}  // namespace dz::runtime
