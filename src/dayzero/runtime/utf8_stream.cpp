#include "dayzero/runtime/utf8_stream.h"

#include <algorithm>
#include <cstdint>

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

}  // namespace

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
  std::string ready = pending_.substr(0, pending_.size() - held);
  pending_.erase(0, pending_.size() - held);
  return ready;
}

std::string Utf8Stream::finish() {
  std::string rest;
  rest.swap(pending_);
  return rest;
}

}  // namespace dz::runtime
